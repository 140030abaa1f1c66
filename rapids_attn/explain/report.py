"""``report/index.html``: the static, self-contained report of a run.

:func:`write_report` renders describe's typed results (:class:`~rapids_attn.explain.findings.Findings`
and :class:`~rapids_attn.explain.findings.FigureArrays`) beside the run's
:class:`~rapids_attn.explain.findings.RunOverview`, and writes ``run_dir/report/index.html`` with PNG
figures beside it. The page has inline CSS, relative image paths and no scripts, fonts or other external
resources, so it opens from disk anywhere, offline. Every string that comes from the data (group names,
example ids, stat labels, warnings, ...) is HTML-escaped.

Atomicity: figures and the page are first written into a hidden staging folder inside
``report/``; only when every figure has rendered are the PNGs moved into place and, last,
``index.html`` renamed in. A previous ``index.html`` is removed before anything else, so a crash
midway leaves no page at all (rather than a stale page that looks complete), and the staging folder
is deleted whatever happens. Head-view pages (:mod:`rapids_attn.explain.headview`) live in
``report/headviews/`` and are left alone.
"""

from __future__ import annotations

import dataclasses
import html
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import numpy as np

from rapids_attn.explain import figures
from rapids_attn.explain.findings import (
    ClusterFinding,
    ClusteringOverview,
    FigureArrays,
    Findings,
    MetadataFindings,
    MetadataTest,
    RunOverview,
)

STAGING_PREFIX = ".report-tmp-"
#: figure files this module writes (stale ones from an earlier report are removed on success)
_FIGURE_RE = re.compile(r"^(scatter_(cluster|layer)|dominant_grid|k_sweep|detectors|(occupancy|montage)_\d+)\.png$")
#: p-value threshold the metadata findings are stated against
ALPHA = 0.01


# ---------------------------------------------------------------------------------------------
# formatting


def _e(x) -> str:
    """HTML-escape anything (None -> empty)."""
    return html.escape("" if x is None else str(x), quote=True)


def _is_nan(x) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _num(x, digits: int = 3) -> str:
    """A readable number: ints with thousands separators, floats to ``digits`` significant figures."""
    if x is None or _is_nan(x):
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if hasattr(x, "item") and not isinstance(x, (list, tuple, dict)):
        try:
            x = x.item()  # numpy scalar
        except (AttributeError, ValueError):
            pass
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if x.is_integer() and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 10 ** digits:
            return f"{x:,.0f}"
        if abs(x) >= 1e-3:
            return f"{x:.{digits}g}"
        return f"{x:.2e}"
    return str(x)


def _pct(x) -> str:
    if x is None or _is_nan(x):
        return "n/a"
    return f"{100 * float(x):.1f}%"


def _pval(p) -> str:
    if p is None or _is_nan(p):
        return "n/a"
    p = float(p)
    if p == 0:
        return "< 1e-300"
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def _seconds(s) -> str:
    if s is None or _is_nan(s):
        return "n/a"
    s = float(s)
    if s < 120:
        return f"{s:.1f} s"
    m, sec = divmod(s, 60)
    if m < 120:
        return f"{int(m)} min {sec:.0f} s"
    h, m = divmod(m, 60)
    return f"{int(h)} h {int(m)} min"


def _words(key: str) -> str:
    return str(key).replace("_", " ")


def _cluster_name(cid) -> str:
    return "noise" if cid == -1 else f"cluster {cid}"


def _anchor(cid) -> str:
    return "cluster-noise" if cid == -1 else f"cluster-{int(cid)}"


def _value_text(v) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(_value_text(x) for x in v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)) or hasattr(v, "item"):
        return _num(v)
    return "" if v is None else str(v)


def _flatten(mapping: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _kv_rows(mapping: dict, skip=lambda key: False) -> str:
    rows = []
    for key, v in _flatten(mapping):
        if skip(key):
            continue
        rows.append(f"<tr><th>{_e(_words(key))}</th><td>{_e(_value_text(v))}</td></tr>")
    return "\n".join(rows)


def _img(name: str | None, alt: str, cls: str = "") -> str:
    if not name:
        return ""
    c = f' class="{cls}"' if cls else ""
    return f'<img src="{_e(quote(name))}" alt="{_e(alt)}"{c}>'


# ---------------------------------------------------------------------------------------------
# figures


@dataclass
class _Figures:
    """File names of the rendered figures, relative to the report folder."""

    grid: str
    detectors: str
    scatter: dict[str, str] = field(default_factory=dict)  # "cluster" / "layer"; empty without arrays
    occupancy: dict[int, str] = field(default_factory=dict)  # by cluster position in Findings.clusters
    montage: dict[int, str] = field(default_factory=dict)  # likewise; empty without thumbnails
    k_sweep: str | None = None  # None when the learn stage ran no sweep

    def names(self) -> list[str]:
        names = [*self.scatter.values(), *self.occupancy.values(), *self.montage.values(), self.grid, self.detectors]
        return names + ([self.k_sweep] if self.k_sweep else [])


def _coords_label(overview: RunOverview) -> str:
    return {"umap": "UMAP", "pca": "PC"}[overview.clustering.coords]


def _make_figures(out_dir: Path, overview: RunOverview, findings: Findings, arrays: FigureArrays | None) -> _Figures:
    """Render every figure into ``out_dir``; any failure propagates (no partial report)."""
    clusters = findings.clusters
    colors = figures.cluster_colors([c.id for c in clusters])
    figs = _Figures(
        grid=figures.dominant_grid_png(out_dir, findings.heads_table, [c.id for c in clusters], layers=findings.layers,
                                       heads=findings.heads, colors=colors),
        detectors=figures.detectors_png(out_dir, findings.detectors.scores, findings.detectors.names, findings.layers,
                                        findings.heads))
    if arrays is not None:
        if len(arrays.scatter.x) > 0:
            label = _coords_label(overview)
            figs.scatter["cluster"] = figures.scatter_png(out_dir, arrays.scatter, "cluster", colors=colors,
                                                          coords_label=label)
            figs.scatter["layer"] = figures.scatter_png(out_dir, arrays.scatter, "layer", coords_label=label)
        for k, c in enumerate(clusters):
            figs.occupancy[k] = figures.occupancy_png(out_dir, k, arrays.occupancy[k], findings.layers, findings.heads,
                                                      cluster_id=c.id)
            if arrays.mean_thumbs is not None:
                figs.montage[k] = figures.montage_png(out_dir, k, arrays.mean_thumbs[k], arrays.exemplar_thumbs[k],
                                                      arrays.exemplar_info[k], cluster_id=c.id)
    if findings.k_sweep is not None and findings.k_sweep.k:
        figs.k_sweep = figures.k_sweep_png(out_dir, findings.k_sweep)
    return figs


# ---------------------------------------------------------------------------------------------
# sections


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;
  color:#1d1d1f;background:#fafafa;line-height:1.45;font-size:15px}
main{max-width:1180px;margin:0 auto;padding:12px 24px 48px}
h1{font-size:1.6em;margin:.6em 0 .1em} h2{font-size:1.3em;margin-top:1.8em;border-bottom:2px solid #ddd;
  padding-bottom:.2em} h3{font-size:1.1em;margin:.2em 0 .4em}
.sub{color:#555;margin:0 0 1em}
nav{font-size:.9em;margin:.5em 0 1em} nav a{margin-right:1em}
a{color:#0b61a4}
table{border-collapse:collapse;margin:.4em 0 .8em;font-size:.9em;background:#fff}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{background:#f3f3f3;font-weight:600;white-space:nowrap}
thead th{background:#f0f0f0}
.cards{display:flex;flex-wrap:wrap;gap:18px}
.cards>div{flex:1 1 300px}
.warn{background:#fff6d6;border:1px solid #e0c060;border-radius:6px;padding:8px 14px;margin:1em 0}
.warn ul{margin:.3em 0;padding-left:1.3em}
.cluster{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px 16px;margin:16px 0}
.swatch{display:inline-block;width:.9em;height:.9em;border-radius:2px;vertical-align:-.1em;margin-right:.35em;
  border:1px solid #999}
.summary{font-size:1.02em;margin:.2em 0 .5em}
.where{margin:.2em 0 .6em}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.row>.text{flex:1 1 420px;min-width:320px} .row>.figs{flex:1 1 480px}
img{max-width:100%;height:auto;border:1px solid #eee;background:#fff}
.pair img{max-width:49%} .flag{color:#9a5b00;font-weight:600}
details{margin:.3em 0 .6em} summary{cursor:pointer;color:#0b61a4}
.note{color:#555;font-size:.9em}
tr.chosen td{background:#fdecea;font-weight:600}
footer{color:#777;font-size:.85em;margin-top:3em}
"""


def _overview(overview: RunOverview) -> str:
    def no_links(key: str) -> bool:
        # the Dask dashboard is a live link to a cluster that is gone once the job ends
        return "dashboard" in key.split(".")[-1]

    seconds = overview.seconds
    t_rows = [f"<tr><th>{_e(_words(k))}</th><td class=n>{_e(_seconds(v))}</td></tr>" for k, v in seconds.items()]
    total = sum(float(v) for v in seconds.values() if isinstance(v, (int, float)) and not _is_nan(v))
    if seconds:
        t_rows.append(f"<tr><th>total</th><td class=n><b>{_e(_seconds(total))}</b></td></tr>")
    c_rows = []
    for f in dataclasses.fields(ClusteringOverview):
        v = getattr(overview.clustering, f.name)
        text = _pct(v) if f.name.endswith("share") else _value_text(v)
        c_rows.append(f"<tr><th>{_e(_words(f.name))}</th><td>{_e(text)}</td></tr>")
    return f"""
<section id="overview"><h2>Overview</h2>
<div class="cards">
<div><h3>Run</h3><table class="kv">
<tr><th colspan=2>model</th></tr>{_kv_rows(overview.model)}
<tr><th colspan=2>data</th></tr>{_kv_rows(overview.data)}
</table></div>
<div><h3>Counts</h3><table class="kv">{_kv_rows(overview.counts)}</table></div>
<div><h3>Clustering</h3><table class="kv">{"".join(c_rows)}</table>
<h3>Time per stage</h3><table class="kv">{"".join(t_rows)}</table></div>
<div><h3>Backend and devices</h3><table class="kv">{_kv_rows(overview.backend, skip=no_links)}</table></div>
</div></section>"""


def _warnings(warns: list[str]) -> str:
    if not warns:
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in warns)
    return f"""
<section id="warnings" class="warn"><b>Warnings ({len(warns)})</b><ul>{items}</ul></section>"""


def _map_section(figs: _Figures) -> str:
    if not figs.scatter:
        return ""
    imgs = " ".join(_img(figs.scatter[k], f"scatter of sampled maps coloured by {k}") for k in ("cluster", "layer"))
    return f"""
<section id="map"><h2>All maps in two dimensions</h2>
<p class="note">Each point is one attention map (one example, layer and head), placed by the learn stage's
2-D coordinates. Left: coloured by cluster; right: by layer.</p>
<div class="pair">{imgs}</div></section>"""


def _heads_section(figs: _Figures) -> str:
    return f"""
<section id="heads"><h2>Which cluster each head falls in</h2>
<p class="note">Left: every head coloured by the cluster most of its maps fall in (N = noise). Right: how
consistently it does so across examples (1 - normalised entropy of the head's cluster distribution):
1 means the head shows the same pattern on every input, 0 that it spreads evenly over the clusters.</p>
{_img(figs.grid, "dominant cluster per head, and consistency")}</section>"""


def _detectors_section(findings: Findings, figs: _Figures) -> str:
    det = findings.detectors
    rows = []
    for name in det.names:
        v = np.asarray(det.scores[name], dtype=np.float64)
        if np.isfinite(v).any():
            li, hi = np.unravel_index(np.nanargmax(v), v.shape)
            best = f"L{findings.layers[li]}-H{findings.heads[hi]} ({v[li, hi]:.2f})"
        else:
            best = "undefined on this data (no example has a repeated token)"
        rows.append(f"<tr><td>{_e(name)}</td><td>{_e(best)}</td><td class=n>{_e(det.examples[name])}</td></tr>")
    return f"""
<section id="detectors"><h2>Head detectors</h2>
<p class="note">The detectors of TransformerLens, scored per map at full resolution: the attention mass on
the pattern's positions (previous token; earlier copies of the current token; the token after an earlier
copy) divided by the mass of the rows where the pattern has a position, then averaged per head over the
examples where it is defined. 1 is a pure pattern; a uniform map scores about 1/n. Induction needs
repeated tokens: set <code>data.probe.count</code> to append repeated random-token probes.</p>
<table><thead><tr><th>detector</th><th>strongest head</th><th class=n>examples</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table>
{_img(figs.detectors, "head detector scores per layer and head")}</section>"""


def _swatch(cid: int, colors: dict) -> str:
    rgb = "".join(f"{int(255 * v):02x}" for v in colors[cid][:3])
    return f'<span class="swatch" style="background:#{rgb}"></span>'


def _cluster_index(clusters: list[ClusterFinding], colors: dict) -> str:
    rows = [f'<tr><td>{_swatch(c.id, colors)}<a href="#{_anchor(c.id)}">{_e(_cluster_name(c.id))}</a></td>'
            f"<td class=n>{_e(_num(c.size))}</td><td class=n>{_e(_pct(c.share))}</td>"
            f"<td>{_e(c.summary)}</td><td>{_e(c.dominant_description)}</td></tr>" for c in clusters]
    return f"""<table><thead><tr><th>cluster</th><th class=n>maps</th><th class=n>share</th><th>what sets it apart</th>
<th>where</th></tr></thead><tbody>{"".join(rows)}</tbody></table>"""


def _signature_table(c: ClusterFinding, findings: Findings) -> str:
    rows = "".join(f"<tr><td>{_e(s.label)} <span class=note>({_e(s.stat)})</span></td>"
                   f"<td class=n>{_e(_num(s.mean))}</td><td class=n>{_e(_num(s.overall))}</td>"
                   f"<td class=n>{_e(_num(s.z, 2))}</td></tr>" for s in c.signature)
    all_rows = "".join(
        f"<tr><td>{_e(findings.stat_labels[n])} <span class=note>({_e(n)})</span></td>"
        f"<td class=n>{_e(_num(c.means[n]))}</td><td class=n>{_e(_num(findings.global_means[n]))}</td></tr>"
        for n in findings.stat_names)
    return ("<table><thead><tr><th>statistic</th><th class=n>cluster mean</th><th class=n>overall</th>"
            f"<th class=n>z</th></tr></thead><tbody>{rows}</tbody></table>"
            "<details><summary>every statistic</summary><table><thead><tr><th>statistic</th>"
            "<th class=n>cluster mean</th><th class=n>overall</th></tr></thead>"
            f"<tbody>{all_rows}</tbody></table></details>")


def _heads_table(c: ClusterFinding) -> str:
    rows = "".join(f"<tr><td>L{_e(h.layer)} H{_e(h.head)}</td><td class=n>{_e(_pct(h.share_of_head))}</td>"
                   f"<td class=n>{_e(_pct(h.share_of_cluster))}</td></tr>" for h in c.top_heads)
    out = ("<table><thead><tr><th>head</th><th class=n>of the head's maps</th>"
           f"<th class=n>of this cluster</th></tr></thead><tbody>{rows}</tbody></table>")
    tl = [x for x in c.top_layers if x.share_of_cluster >= 0.005]
    if tl:
        out += ("<p>Layers: " + ", ".join(f"{_e(x.layer)} ({_e(_pct(x.share_of_cluster))})" for x in tl)
                + " <span class=note>(share of this cluster's maps)</span></p>")
    return out


def _meta_lines(c: ClusterFinding) -> str:
    g = c.groups
    flag = ' <span class="flag">dominated by one group</span>' if g.dominated else ""
    return (f"<p>Most common group: <b>{_e(g.top)}</b>, {_e(_pct(g.share))} of this cluster's "
            f"maps vs {_e(_pct(g.overall_share))} of all maps.{flag}</p>"
            "<p>Labels: " + ", ".join(f"{_e(k)} {_e(_pct(v))}" for k, v in c.labels.items()) + "</p>")


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
        links.append(f'<li><a href="{_e(quote(rel))}">{_e(label)}</a></li>')
    if not links:
        return ""
    return ("<p><b>Head views</b> <span class=note>(BertViz, interactive; opens offline)</span></p>"
            f"<ul>{''.join(links)}</ul>")


def _cluster_section(k: int, c: ClusterFinding, findings: Findings, figs: _Figures, colors: dict,
                     headviews: dict | None, report_dir: Path, no_thumbs: bool) -> str:
    name = _cluster_name(c.id)
    fig_html = _img(figs.occupancy.get(k), f"{name}: share of each head's maps")
    if k in figs.montage:
        fig_html += _img(figs.montage[k], f"{name}: mean map and exemplars")
    elif no_thumbs:
        fig_html += '<p class="note">No thumbnails were kept (extract.thumbnail_size: 0), so no map images.</p>'
    hv = headviews.get(c.id) if headviews else None
    return f"""
<section class="cluster" id="{_anchor(c.id)}">
<h3>{_swatch(c.id, colors)}{_e(name.capitalize())}:
{_e(_num(c.size))} maps ({_e(_pct(c.share))})</h3>
<p class="summary">{_e(c.summary)}</p>
<p class="where"><b>Where:</b> {_e(c.dominant_description)}</p>
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
    if not _is_nan(m.chi2_p_maps):
        return float(m.chi2_p_maps), "chi-square on maps"
    return None, ""


def _metadata_block(key: str, m: MetadataTest) -> str:
    p, how = _meta_p(m)
    perms = m.permutations
    cols = [("chi-square", _num(m.chi2)), ("dof", _num(m.dof)),
            ("chi-square p (maps as independent)", _pval(m.chi2_p_maps)),
            (f"permutation p ({_num(perms)} shuffles)" if perms else "permutation p", _pval(m.p_permutation)),
            ("mutual information", _num(m.mutual_info)), ("normalised MI", _num(m.nmi)), ("maps", _num(m.n_maps)),
            (f"{key} values", _num(m.n_values))]
    head = "".join(f"<th class=n>{_e(c)}</th>" for c, _ in cols)
    cells = "".join(f"<td class=n>{_e(v)}</td>" for _, v in cols)

    rel = f"the relation between a map's cluster and its example's {_e(key)}"
    if p is None:
        verdict = "no p-value could be computed."
    elif p < ALPHA:
        verdict = f"{rel} is <b>stronger than chance</b> at p &lt; {ALPHA} (p = {_e(_pval(p))})."
    else:
        verdict = f"{rel} is <b>not stronger than chance</b> at p &lt; {ALPHA} (p = {_e(_pval(p))})."
    if how == "permutation":
        method = (f"Permutation test: the example {_e(key)}s were shuffled across examples {_e(_num(perms))} times, "
                  "each example's maps moving together, and the mutual information recomputed")
        if perms and 1 / (int(perms) + 1) >= ALPHA:
            floor = _pval(1 / (int(perms) + 1))
            verdict += (f" With {_e(_num(perms))} shuffles the smallest reachable p is {_e(floor)}, "
                        f"so p &lt; {ALPHA} cannot be shown; raise explain.permutations.")
    elif how == "chi-square on maps":
        method = ("Chi-square test of independence over maps (every map of an example counted as independent, "
                  "which makes small p-values too easy to reach)")
    else:
        method = "Test of independence"
    return f"""<h3>Cluster vs example {_e(key)}</h3>
<table><thead><tr>{head}</tr></thead><tbody><tr>{cells}</tr></tbody></table>
<p>{method}: {verdict} Normalised mutual information ({_e(_num(m.nmi))}) says how much of the cluster
assignment the {_e(key)} explains (0 = nothing, 1 = all of it), whatever the p-value.</p>"""


def _metadata_section(meta: MetadataFindings) -> str:
    blocks = []
    for key, m in (("label", meta.label), ("group", meta.group)):
        if m is None:
            blocks.append(f"<h3>Cluster vs example {key}</h3><p class=note>Not tested: the data has no {key}s, "
                          "or only one value.</p>")
        else:
            blocks.append(_metadata_block(key, m))
    probes = meta.probe_examples_excluded
    return f"""
<section id="metadata"><h2>Clusters and example metadata</h2>
<p class="note">Does knowing which cluster a map falls in tell you something about the example it came from?
Noise maps are left out{_e(f", and so are the {probes} repeated-token probe examples" if probes else "")}.</p>
{"".join(blocks)}</section>"""


def _k_sweep_section(findings: Findings, figs: _Figures) -> str:
    ks = findings.k_sweep
    if figs.k_sweep is None:
        return ""
    rows = "".join(
        f'<tr{" class=chosen" if k == ks.chosen else ""}><td class=n>{_e(k)}</td>'
        f"<td class=n>{_e(_num(inertia))}</td><td class=n>{_e(_num(sil))}</td></tr>"
        for k, inertia, sil in zip(ks.k, ks.inertia, ks.silhouette))
    return f"""
<section id="k-sweep"><h2>Choosing k</h2>
<p>Chosen k: <b>{_e(ks.chosen)}</b>. Inertia always falls as k grows; look for the bend, and for a high silhouette.</p>
<div class="row"><div>{_img(figs.k_sweep, "inertia and silhouette against k")}</div>
<div><table><thead><tr><th class=n>k</th><th class=n>inertia</th><th class=n>silhouette</th></tr></thead>
<tbody>{rows}</tbody></table></div></div></section>"""


def render_html(overview: RunOverview, findings: Findings, figs: _Figures, headviews: dict | None,
                report_dir: Path, no_thumbs: bool) -> str:
    """The page. no_thumbs: the store kept no thumbnails, which the cluster sections say."""
    clusters = findings.clusters
    colors = figures.cluster_colors([c.id for c in clusters])
    data_path = overview.data["path"]
    title = f"Attention-map clusters: {overview.model['name']}" + (
        f" on {Path(str(data_path)).name}" if data_path else "")
    cl = overview.clustering
    sub = (f"{_num(overview.counts['examples'])} examples, {_num(overview.counts['maps'])} maps, "
           f"{len([c for c in clusters if c.id != -1])} clusters ({cl.method}, silhouette {_num(cl.silhouette)})")
    nav = [("overview", "Overview")]
    if findings.warnings:
        nav.insert(0, ("warnings", f"Warnings ({len(findings.warnings)})"))
    if figs.scatter:
        nav.append(("map", "2-D map"))
    nav += [("heads", "Heads"), ("detectors", "Detectors"), ("clusters", "Clusters"), ("metadata", "Metadata")]
    if figs.k_sweep:
        nav.append(("k-sweep", "Choosing k"))
    nav_html = "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in nav)
    sections = "".join(_cluster_section(k, c, findings, figs, colors, headviews, report_dir, no_thumbs)
                       for k, c in enumerate(clusters))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>{_e(title)}</h1>
<p class="sub">{_e(sub)}</p>
<nav>{nav_html}</nav>
{_warnings(findings.warnings)}
{_overview(overview)}
{_map_section(figs)}
{_heads_section(figs)}
{_detectors_section(findings, figs)}
<section id="clusters"><h2>Clusters</h2>
<p class="note">Sorted by size. "What sets it apart" names the statistics whose cluster mean differs most
from the overall mean (in standard deviations, z); "where" names the layers and heads whose maps make up
most of the cluster.</p>
{_cluster_index(clusters, colors)}
{sections}
</section>
{_metadata_section(findings.metadata)}
{_k_sweep_section(findings, figs)}
<footer>Written by rapids_attn on {_e(now)}. Static page: no scripts, no external resources.</footer>
</main></body></html>
"""


# ---------------------------------------------------------------------------------------------
# entry point


def write_report(run_dir, overview: RunOverview, findings: Findings, arrays: FigureArrays | None,
                 headviews: dict[int, list[str]] | None = None) -> Path:
    """Write ``run_dir/report/index.html`` and its figures; return the path of ``index.html``.

    ``arrays`` None leaves out the figures drawn from them (2-D map, occupancy, montages).
    ``headviews`` maps a cluster id to the head-view pages written for it (paths relative to
    ``report/``, as :func:`rapids_attn.explain.headview.write_head_views` returns them); links are
    made only to pages that exist inside the report folder.
    """
    report_dir = Path(run_dir) / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    index = report_dir / "index.html"
    index.unlink(missing_ok=True)  # a page from an earlier run must not survive a failed rewrite
    for old in report_dir.glob(STAGING_PREFIX + "*"):  # left by a process that was killed
        shutil.rmtree(old, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=report_dir))
    try:
        figs = _make_figures(stage, overview, findings, arrays)
        no_thumbs = arrays is not None and arrays.mean_thumbs is None
        page = render_html(overview, findings, figs, headviews, report_dir, no_thumbs)
        (stage / "index.html").write_text(page, encoding="utf-8")
        names = set(figs.names())
        for old in report_dir.iterdir():
            if old.is_file() and _FIGURE_RE.match(old.name) and old.name not in names:
                old.unlink()
        for name in names:
            os.replace(stage / name, report_dir / name)
        os.replace(stage / "index.html", index)  # last: the page appears only when everything is in place
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return index
