"""The report's sections: each renders one part of ``index.html`` from describe's typed findings.

Overview (run, counts, clustering, time per stage, backend), warnings, the 2-D map, the per-head
grid, the head detectors, the cluster index and one section per cluster (signature, heads, groups
and labels, head-view links), the metadata tests and the choice of k. Each function returns an HTML
fragment; :func:`rapids_attn.explain.report.render_html` puts them in order on the page, and
:func:`rapids_attn.explain.report.write_report` renders the figures they link to. Kept apart from
the page so that report.py holds the staging and assembly, and this module what each section says.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np

from rapids_attn.explain.findings import (
    ClusterFinding,
    ClusteringOverview,
    Findings,
    MetadataFindings,
    MetadataTest,
    RunOverview,
)
from rapids_attn.explain.formatting import (
    anchor,
    cluster_name,
    esc,
    img,
    is_nan,
    kv_rows,
    num,
    pct,
    pval,
    seconds,
    swatch,
    value_text,
    words,
)

if TYPE_CHECKING:
    from rapids_attn.explain.figures import FigureFiles

#: p-value threshold the metadata findings are stated against
ALPHA = 0.01


def overview_section(overview: RunOverview) -> str:
    """The overview: the run's model and data, its counts, the clustering, the time per stage and the backend."""

    def no_links(key: str) -> bool:
        # the Dask dashboard is a live link to a cluster that is gone once the job ends
        return "dashboard" in key.split(".")[-1]

    per_stage = overview.seconds
    t_rows = [f"<tr><th>{esc(words(k))}</th><td class=n>{esc(seconds(v))}</td></tr>" for k, v in per_stage.items()]
    total = sum(float(v) for v in per_stage.values() if isinstance(v, (int, float)) and not is_nan(v))
    if per_stage:
        t_rows.append(f"<tr><th>total</th><td class=n><b>{esc(seconds(total))}</b></td></tr>")
    c_rows = []
    for f in dataclasses.fields(ClusteringOverview):
        v = getattr(overview.clustering, f.name)
        text = pct(v) if f.name.endswith("share") else value_text(v)
        c_rows.append(f"<tr><th>{esc(words(f.name))}</th><td>{esc(text)}</td></tr>")
    return f"""
<section id="overview"><h2>Overview</h2>
<div class="cards">
<div><h3>Run</h3><table class="kv">
<tr><th colspan=2>model</th></tr>{kv_rows(overview.model)}
<tr><th colspan=2>data</th></tr>{kv_rows(overview.data)}
</table></div>
<div><h3>Counts</h3><table class="kv">{kv_rows(overview.counts)}</table></div>
<div><h3>Clustering</h3><table class="kv">{"".join(c_rows)}</table>
<h3>Time per stage</h3><table class="kv">{"".join(t_rows)}</table></div>
<div><h3>Backend and devices</h3><table class="kv">{kv_rows(overview.backend, skip=no_links)}</table></div>
</div></section>"""


def warnings_section(warns: list[str]) -> str:
    """The run's warnings in a box at the top; empty without any."""
    if not warns:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in warns)
    return f"""
<section id="warnings" class="warn"><b>Warnings ({len(warns)})</b><ul>{items}</ul></section>"""


def map_section(figs: FigureFiles) -> str:
    """The 2-D map of sampled maps, coloured by cluster and by layer; empty without the scatter."""
    if not figs.scatter:
        return ""
    imgs = " ".join(img(figs.scatter[k], f"scatter of sampled maps coloured by {k}") for k in ("cluster", "layer"))
    return f"""
<section id="map"><h2>All maps in two dimensions</h2>
<p class="note">Each point is one attention map (one example, layer and head), placed by the learn stage's
2-D coordinates. Left: coloured by cluster; right: by layer.</p>
<div class="pair">{imgs}</div></section>"""


def heads_section(figs: FigureFiles) -> str:
    """The per-head grid: the cluster each head's maps mostly fall in."""
    return f"""
<section id="heads"><h2>Which cluster each head falls in</h2>
<p class="note">Left: every head coloured by the cluster most of its maps fall in (N = noise). Right: how
consistently it does so across examples (1 - normalised entropy of the head's cluster distribution):
1 means the head shows the same pattern on every input, 0 that it spreads evenly over the clusters.</p>
{img(figs.grid, "dominant cluster per head, and consistency")}</section>"""


def detectors_section(findings: Findings, figs: FigureFiles) -> str:
    """The head detectors: each detector's strongest head, and the figure of their scores."""
    det = findings.detectors
    rows = []
    for name in det.names:
        v = np.asarray(det.scores[name], dtype=np.float64)
        if np.isfinite(v).any():
            li, hi = np.unravel_index(np.nanargmax(v), v.shape)
            best = f"L{findings.layers[li]}-H{findings.heads[hi]} ({v[li, hi]:.2f})"
        else:
            best = "undefined on this data (no example has a repeated token)"
        rows.append(f"<tr><td>{esc(name)}</td><td>{esc(best)}</td><td class=n>{esc(det.examples[name])}</td></tr>")
    return f"""
<section id="detectors"><h2>Head detectors</h2>
<p class="note">The detectors of TransformerLens, scored per map at full resolution on its own definition
(<code>*_head</code>): the attention mass on the pattern's positions (previous token; earlier copies of the
current token; the token after an earlier copy) divided by the map's whole mass, averaged per head over
the examples, so the literature's thresholds apply. Rows without a target count as 0, so a pure
induction head scores the share of rows that can have one. The <code>*_cond</code> scores divide by the
mass of those rows only (1 is a pure pattern wherever it is possible; a uniform map scores about 1/n),
averaged over the examples that have a repeated token. Induction needs repeated tokens: set
<code>data.probe.count</code> to append repeated random-token probes.</p>
<table><thead><tr><th>detector</th><th>strongest head</th><th class=n>examples</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
{img(figs.detectors, "head detector scores per layer and head")}</section>"""


def cluster_index(clusters: list[ClusterFinding], colors: dict) -> str:
    """The table of clusters (size, share) linking to each cluster's section."""
    rows = [
        f'<tr><td>{swatch(c.id, colors)}<a href="#{anchor(c.id)}">{esc(cluster_name(c.id))}</a></td>'
        f"<td class=n>{esc(num(c.size))}</td><td class=n>{esc(pct(c.share))}</td>"
        f"<td>{esc(c.summary)}</td><td>{esc(c.dominant_description)}</td></tr>"
        for c in clusters
    ]
    return f"""<table><thead><tr><th>cluster</th><th class=n>maps</th><th class=n>share</th><th>what sets it apart</th>
<th>where</th></tr></thead><tbody>{"".join(rows)}</tbody></table>"""


def _signature_table(c: ClusterFinding, findings: Findings) -> str:
    rows = "".join(
        f"<tr><td>{esc(s.label)} <span class=note>({esc(s.stat)})</span></td>"
        f"<td class=n>{esc(num(s.mean))}</td><td class=n>{esc(num(s.overall))}</td>"
        f"<td class=n>{esc(num(s.z, 2))}</td></tr>"
        for s in c.signature
    )
    all_rows = "".join(
        f"<tr><td>{esc(findings.stat_labels[n])} <span class=note>({esc(n)})</span></td>"
        f"<td class=n>{esc(num(c.means[n]))}</td><td class=n>{esc(num(findings.global_means[n]))}</td></tr>"
        for n in findings.stat_names
    )
    return (
        "<table><thead><tr><th>statistic</th><th class=n>cluster mean</th><th class=n>overall</th>"
        f"<th class=n>z</th></tr></thead><tbody>{rows}</tbody></table>"
        "<details><summary>every statistic</summary><table><thead><tr><th>statistic</th>"
        "<th class=n>cluster mean</th><th class=n>overall</th></tr></thead>"
        f"<tbody>{all_rows}</tbody></table></details>"
    )


def _heads_table(c: ClusterFinding) -> str:
    rows = "".join(
        f"<tr><td>L{esc(h.layer)} H{esc(h.head)}</td><td class=n>{esc(pct(h.share_of_head))}</td>"
        f"<td class=n>{esc(pct(h.share_of_cluster))}</td></tr>"
        for h in c.top_heads
    )
    out = (
        "<table><thead><tr><th>head</th><th class=n>of the head's maps</th>"
        f"<th class=n>of this cluster</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    tl = [x for x in c.top_layers if x.share_of_cluster >= 0.005]
    if tl:
        out += (
            "<p>Layers: "
            + ", ".join(f"{esc(x.layer)} ({esc(pct(x.share_of_cluster))})" for x in tl)
            + " <span class=note>(share of this cluster's maps)</span></p>"
        )
    return out


def _meta_lines(c: ClusterFinding) -> str:
    g = c.groups
    flag = ' <span class="flag">dominated by one group</span>' if g.dominated else ""
    return (
        f"<p>Most common group: <b>{esc(g.top)}</b>, {esc(pct(g.share))} of this cluster's "
        f"maps vs {esc(pct(g.overall_share))} of all maps.{flag}</p>"
        "<p>Labels: " + ", ".join(f"{esc(k)} {esc(pct(v))}" for k, v in c.labels.items()) + "</p>"
    )


def _safe_rel(path, report_dir: Path) -> str | None:
    """A head-view path as a relative POSIX link inside the report folder, or None if it is not one."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(report_dir.resolve())
        except ValueError:
            return None
    pp = PurePosixPath(p.as_posix())
    if ".." in pp.parts or not (report_dir / pp).is_file():
        return None
    return pp.as_posix()


def _headview_links(c: ClusterFinding, paths: list[str] | None, report_dir: Path) -> str:
    """Links to the cluster's head-view pages, the i-th page showing the i-th exemplar example."""
    if not paths:
        return ""
    items = c.exemplar_examples
    links = []
    for i, p in enumerate(paths):
        rel = _safe_rel(p, report_dir)
        if rel is None:
            continue
        if i < len(items):
            it = items[i]
            label = f"layer {it.layer} head {it.head}, example {it.example_id}"
        else:
            label = PurePosixPath(rel).name
        links.append(f'<li><a href="{esc(quote(rel))}">{esc(label)}</a></li>')
    if not links:
        return ""
    return (
        "<p><b>Head views</b> <span class=note>(BertViz, interactive; opens offline)</span></p>"
        f"<ul>{''.join(links)}</ul>"
    )


def cluster_section(
    k: int,
    c: ClusterFinding,
    findings: Findings,
    figs: FigureFiles,
    colors: dict,
    headviews: dict | None,
    report_dir: Path,
    no_thumbs: bool,
) -> str:
    """One cluster's section: its signature, where it lives, its groups and labels, figures and head views."""
    name = cluster_name(c.id)
    fig_html = img(figs.occupancy.get(k), f"{name}: share of each head's maps")
    if k in figs.montage:
        fig_html += img(figs.montage[k], f"{name}: mean map and exemplars")
    elif no_thumbs:
        fig_html += '<p class="note">No thumbnails were kept (extract.thumbnail_size: 0), so no map images.</p>'
    hv = headviews.get(c.id) if headviews else None
    return f"""
<section class="cluster" id="{anchor(c.id)}">
<h3>{swatch(c.id, colors)}{esc(name.capitalize())}:
{esc(num(c.size))} maps ({esc(pct(c.share))})</h3>
<p class="summary">{esc(c.summary)}</p>
<p class="where"><b>Where:</b> {esc(c.dominant_description)}</p>
<div class="row"><div class="text">
{_signature_table(c, findings)}
{_heads_table(c)}
{_meta_lines(c)}
{_headview_links(c, hv, report_dir)}
</div><div class="figs">{fig_html}</div></div>
</section>"""


def _meta_p(m: MetadataTest) -> tuple[float | None, str]:
    """The p-value to state the finding with, and how it was obtained. A permutation p (example values
    shuffled as units) is preferred: the chi-square test counts every map of an example as an
    independent sample, which they are not."""
    if m.p_permutation is not None:
        return float(m.p_permutation), "permutation"
    if not is_nan(m.chi2_p_maps):
        return float(m.chi2_p_maps), "chi-square on maps"
    return None, ""


def _metadata_block(key: str, m: MetadataTest) -> str:
    p, how = _meta_p(m)
    perms = m.permutations
    cols = [
        ("chi-square", num(m.chi2)),
        ("dof", num(m.dof)),
        ("chi-square p (maps as independent)", pval(m.chi2_p_maps)),
        (f"permutation p ({num(perms)} shuffles)" if perms else "permutation p", pval(m.p_permutation)),
        ("mutual information", num(m.mutual_info)),
        ("normalised MI", num(m.nmi)),
        ("maps", num(m.n_maps)),
        (f"{key} values", num(m.n_values)),
    ]
    head = "".join(f"<th class=n>{esc(c)}</th>" for c, _ in cols)
    cells = "".join(f"<td class=n>{esc(v)}</td>" for _, v in cols)

    rel = f"the relation between a map's cluster and its example's {esc(key)}"
    if p is None:
        verdict = "no p-value could be computed."
    elif p < ALPHA:
        verdict = f"{rel} is <b>stronger than chance</b> at p &lt; {ALPHA} (p = {esc(pval(p))})."
    else:
        verdict = f"{rel} is <b>not stronger than chance</b> at p &lt; {ALPHA} (p = {esc(pval(p))})."
    if how == "permutation":
        method = (
            f"Permutation test: the example {esc(key)}s were shuffled across examples {esc(num(perms))} times, "
            "each example's maps moving together, and the mutual information recomputed"
        )
        if perms and 1 / (int(perms) + 1) >= ALPHA:
            floor = pval(1 / (int(perms) + 1))
            verdict += (
                f" With {esc(num(perms))} shuffles the smallest reachable p is {esc(floor)}, "
                f"so p &lt; {ALPHA} cannot be shown; raise explain.permutations."
            )
    elif how == "chi-square on maps":
        method = (
            "Chi-square test of independence over maps (every map of an example counted as independent, "
            "which makes small p-values too easy to reach)"
        )
    else:
        method = "Test of independence"
    return f"""<h3>Cluster vs example {esc(key)}</h3>
<table><thead><tr>{head}</tr></thead><tbody><tr>{cells}</tr></tbody></table>
<p>{method}: {verdict} Normalised mutual information ({esc(num(m.nmi))}) says how much of the cluster
assignment the {esc(key)} explains (0 = nothing, 1 = all of it), whatever the p-value.</p>"""


def metadata_section(meta: MetadataFindings) -> str:
    """The metadata tests: clusters against example labels and groups."""
    blocks = []
    for key, m in (("label", meta.label), ("group", meta.group)):
        if m is None:
            blocks.append(
                f"<h3>Cluster vs example {key}</h3><p class=note>Not tested: the data has no {key}s, "
                "or only one value.</p>"
            )
        else:
            blocks.append(_metadata_block(key, m))
    probes = meta.probe_examples_excluded
    return f"""
<section id="metadata"><h2>Clusters and example metadata</h2>
<p class="note">Does knowing which cluster a map falls in tell you something about the example it came from?
Noise maps are left out{esc(f", and so are the {probes} repeated-token probe examples" if probes else "")}.</p>
{"".join(blocks)}</section>"""


def k_sweep_section(findings: Findings, figs: FigureFiles) -> str:
    """The choice of k: the learn stage's sweep of k; empty without its figure."""
    ks = findings.k_sweep
    if figs.k_sweep is None:
        return ""
    rows = "".join(
        f"<tr{' class=chosen' if k == ks.chosen else ''}><td class=n>{esc(k)}</td>"
        f"<td class=n>{esc(num(inertia))}</td><td class=n>{esc(num(sil))}</td><td class=n>{esc(num(ari))}</td></tr>"
        for k, inertia, sil, ari in zip(ks.k, ks.inertia, ks.silhouette, ks.stability or [None] * len(ks.k))
    )
    return f"""
<section id="k-sweep"><h2>Choosing k</h2>
<p>Chosen k: <b>{esc(ks.chosen)}</b>. Inertia always falls as k grows; look for the bend, and for a high silhouette.
"Seed ARI" compares each k's clusters with a refit under the next seed (1: the seed does not matter);
<code>n_clusters: auto</code> takes the best silhouette among the k at 0.9 or above.</p>
<div class="row"><div>{img(figs.k_sweep, "inertia and silhouette against k")}</div>
<div><table><thead><tr><th class=n>k</th><th class=n>inertia</th><th class=n>silhouette</th><th class=n>seed ARI</th></tr></thead>
<tbody>{rows}</tbody></table></div></div></section>"""
