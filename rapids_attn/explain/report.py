"""``report/index.html``: the static, self-contained report of a run.

:func:`write_report` takes the ``describe`` dict ``d`` (also the body of ``summary.json``) and its
``arrays`` and writes ``run_dir/report/index.html`` with PNG figures beside it. The page has inline
CSS, relative image paths and no scripts, fonts or other external resources, so it opens from disk
anywhere, offline. Every string that comes from the data (group names, example ids, stat labels,
warnings, ...) is HTML-escaped.

Atomicity: figures and the page are first written into a hidden staging folder inside
``report/``; only when every figure has rendered are the PNGs moved into place and, last,
``index.html`` renamed in. A previous ``index.html`` is removed before anything else, so a crash
midway leaves no page at all (rather than a stale page that looks complete), and the staging folder
is deleted whatever happens. Head-view pages (:mod:`rapids_attn.explain.headview`) live in
``report/headviews/`` and are left alone.
"""

from __future__ import annotations

import html
import math
import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import numpy as np

from rapids_attn.explain import figures

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
    for k, v in (mapping or {}).items():
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


def _coords_label(d: dict) -> str | None:
    c = str((d.get("clustering") or {}).get("coords") or "").lower()
    return {"umap": "UMAP", "pca": "PC"}.get(c)


def _make_figures(out_dir: Path, d: dict, arrays: dict) -> dict:
    """Render every figure into ``out_dir``; any failure propagates (no partial report)."""
    clusters = d.get("clusters") or []
    colors = figures.cluster_colors([c["id"] for c in clusters])
    figs: dict = {"scatter": {}, "occupancy": {}, "montage": {}}
    scatter = (arrays or {}).get("scatter")
    if scatter is not None and len(scatter.get("x", [])) > 0:
        figs["scatter"]["cluster"] = figures.scatter_png(out_dir, scatter, "cluster", colors=colors,
                                                         coords_label=_coords_label(d))
        if scatter.get("layer") is not None:
            figs["scatter"]["layer"] = figures.scatter_png(out_dir, scatter, "layer",
                                                           coords_label=_coords_label(d))
    if d.get("heads_table") and d["heads_table"].get("dominant_cluster") is not None:
        figs["grid"] = figures.dominant_grid_png(out_dir, d["heads_table"], clusters, layers=d.get("layers"),
                                                 heads=d.get("heads"), colors=colors)
    occ = (arrays or {}).get("occupancy")
    means = (arrays or {}).get("mean_thumbs")
    ex_thumbs = (arrays or {}).get("exemplar_thumbs")
    ex_info = (arrays or {}).get("exemplar_info") or []
    for k, c in enumerate(clusters):
        if occ is not None and k < len(occ):
            figs["occupancy"][k] = figures.occupancy_png(out_dir, k, occ[k], d.get("layers") or range(occ.shape[1]),
                                                         d.get("heads") or range(occ.shape[2]), cluster_id=c["id"])
        if means is not None and k < len(means):
            figs["montage"][k] = figures.montage_png(
                out_dir, k, means[k], ex_thumbs[k] if ex_thumbs is not None and k < len(ex_thumbs) else None,
                ex_info[k] if k < len(ex_info) else [], cluster_id=c["id"])
    if d.get("k_sweep") and d["k_sweep"].get("k"):
        figs["k_sweep"] = figures.k_sweep_png(out_dir, d["k_sweep"])
    det = d.get("detectors")
    if det and det.get("names"):
        figs["detectors"] = figures.detectors_png(out_dir, det["scores"], det["names"], d.get("layers") or [],
                                                  d.get("heads") or [])
    return figs


def _figure_names(figs: dict) -> list[str]:
    names = list(figs["scatter"].values()) + list(figs["occupancy"].values()) + list(figs["montage"].values())
    names += [figs[k] for k in ("grid", "k_sweep", "detectors") if figs.get(k)]
    return names


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


def _overview(d: dict) -> str:
    model = d.get("model") or {}
    data = d.get("data") or {}
    counts = d.get("counts") or {}
    seconds = d.get("seconds") or {}
    backend = d.get("backend") or {}
    clustering = d.get("clustering") or {}

    def no_links(key: str) -> bool:
        # the Dask dashboard is a live link to a cluster that is gone once the job ends
        return "dashboard" in key.split(".")[-1]

    t_rows = [f"<tr><th>{_e(_words(k))}</th><td class=n>{_e(_seconds(v))}</td></tr>" for k, v in seconds.items()]
    total = sum(float(v) for v in seconds.values() if isinstance(v, (int, float)) and not _is_nan(v))
    if seconds:
        t_rows.append(f"<tr><th>total</th><td class=n><b>{_e(_seconds(total))}</b></td></tr>")
    c_rows = []
    for k, v in clustering.items():
        if isinstance(v, dict):
            continue
        text = _pct(v) if k.endswith("share") else _value_text(v)
        c_rows.append(f"<tr><th>{_e(_words(k))}</th><td>{_e(text)}</td></tr>")
    return f"""
<section id="overview"><h2>Overview</h2>
<div class="cards">
<div><h3>Run</h3><table class="kv">
<tr><th colspan=2>model</th></tr>{_kv_rows(model)}
<tr><th colspan=2>data</th></tr>{_kv_rows(data)}
</table></div>
<div><h3>Counts</h3><table class="kv">{_kv_rows(counts)}</table></div>
<div><h3>Clustering</h3><table class="kv">{"".join(c_rows)}</table>
<h3>Time per stage</h3><table class="kv">{"".join(t_rows)}</table></div>
<div><h3>Backend and devices</h3><table class="kv">{_kv_rows(backend, skip=no_links)}</table></div>
</div></section>"""


def _warnings(d: dict) -> str:
    warns = d.get("warnings") or []
    if not warns:
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in warns)
    return f"""
<section id="warnings" class="warn"><b>Warnings ({len(warns)})</b><ul>{items}</ul></section>"""


def _map_section(figs: dict) -> str:
    sc = figs["scatter"]
    if not sc:
        return ""
    imgs = " ".join(_img(sc.get(k), f"scatter of sampled maps coloured by {k}") for k in ("cluster", "layer"))
    return f"""
<section id="map"><h2>All maps in two dimensions</h2>
<p class="note">Each point is one attention map (one example, layer and head), placed by the learn stage's
2-D coordinates. Left: coloured by cluster; right: by layer.</p>
<div class="pair">{imgs}</div></section>"""


def _heads_section(figs: dict) -> str:
    if not figs.get("grid"):
        return ""
    return f"""
<section id="heads"><h2>Which cluster each head falls in</h2>
<p class="note">Left: every head coloured by the cluster most of its maps fall in (N = noise). Right: how
consistently it does so across examples (1 - normalised entropy of the head's cluster distribution):
1 means the head shows the same pattern on every input, 0 that it spreads evenly over the clusters.</p>
{_img(figs["grid"], "dominant cluster per head, and consistency")}</section>"""


def _detectors_section(d: dict, figs: dict) -> str:
    det = d.get("detectors")
    if not figs.get("detectors") or not det:
        return ""
    rows = []
    for name in det["names"]:
        v = np.asarray(det["scores"][name], dtype=np.float64)
        if np.isfinite(v).any():
            li, hi = np.unravel_index(np.nanargmax(v), v.shape)
            layers, heads = d.get("layers") or list(range(v.shape[0])), d.get("heads") or list(range(v.shape[1]))
            best = f"L{layers[li]}-H{heads[hi]} ({v[li, hi]:.2f})"
        else:
            best = "undefined on this data (no example has a repeated token)"
        rows.append(f"<tr><td>{_e(name)}</td><td>{_e(best)}</td>"
                    f"<td class=n>{_e(det.get('examples', {}).get(name, ''))}</td></tr>")
    return f"""
<section id="detectors"><h2>Head detectors</h2>
<p class="note">The detectors of TransformerLens, scored per map at full resolution: the attention mass on
the pattern's positions (previous token; earlier copies of the current token; the token after an earlier
copy) divided by the mass of the rows where the pattern has a position, then averaged per head over the
examples where it is defined. 1 is a pure pattern; a uniform map scores about 1/n. Induction needs
repeated tokens: set <code>data.probe.count</code> to append repeated random-token probes.</p>
<table><thead><tr><th>detector</th><th>strongest head</th><th class=n>examples</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table>
{_img(figs["detectors"], "head detector scores per layer and head")}</section>"""


def _cluster_index(d: dict, colors: dict) -> str:
    rows = []
    for c in d.get("clusters") or []:
        cid = c.get("id")
        rgb = "#%02x%02x%02x" % tuple(int(255 * v) for v in colors.get(cid, figures.NOISE_COLOR)[:3])
        rows.append(
            f'<tr><td><span class="swatch" style="background:{rgb}"></span>'
            f'<a href="#{_anchor(cid)}">{_e(_cluster_name(cid))}</a></td>'
            f"<td class=n>{_e(_num(c.get('size')))}</td><td class=n>{_e(_pct(c.get('share')))}</td>"
            f"<td>{_e(c.get('summary'))}</td><td>{_e(c.get('dominant_description'))}</td></tr>")
    return f"""<table><thead><tr><th>cluster</th><th class=n>maps</th><th class=n>share</th><th>what sets it apart</th>
<th>where</th></tr></thead><tbody>{"".join(rows)}</tbody></table>"""


def _signature_table(c: dict, d: dict) -> str:
    rows = []
    for s in c.get("signature") or []:
        rows.append(f"<tr><td>{_e(s.get('label') or s.get('stat'))} <span class=note>({_e(s.get('stat'))})</span></td>"
                    f"<td class=n>{_e(_num(s.get('mean')))}</td><td class=n>{_e(_num(s.get('overall')))}</td>"
                    f"<td class=n>{_e(_num(s.get('z'), 2))}</td></tr>")
    table = ""
    if rows:
        table = ("<table><thead><tr><th>statistic</th><th class=n>cluster mean</th><th class=n>overall</th>"
                 f"<th class=n>z</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    means = c.get("means") or {}
    if means:
        labels = d.get("stat_labels") or {}
        overall = d.get("global_means") or {}
        names = list(d.get("stat_names") or means.keys())
        all_rows = "".join(
            f"<tr><td>{_e(labels.get(n, n))} <span class=note>({_e(n)})</span></td>"
            f"<td class=n>{_e(_num(means.get(n)))}</td><td class=n>{_e(_num(overall.get(n)))}</td></tr>"
            for n in names if n in means)
        table += ("<details><summary>every statistic</summary><table><thead><tr><th>statistic</th>"
                  "<th class=n>cluster mean</th><th class=n>overall</th></tr></thead>"
                  f"<tbody>{all_rows}</tbody></table></details>")
    return table


def _heads_table(c: dict) -> str:
    th = c.get("top_heads") or []
    out = ""
    if th:
        rows = "".join(
            f"<tr><td>L{_e(h.get('layer'))} H{_e(h.get('head'))}</td>"
            f"<td class=n>{_e(_pct(h.get('share_of_head')))}</td>"
            f"<td class=n>{_e(_pct(h.get('share_of_cluster')))}</td></tr>" for h in th)
        out += ("<table><thead><tr><th>head</th><th class=n>of the head's maps</th>"
                f"<th class=n>of this cluster</th></tr></thead><tbody>{rows}</tbody></table>")
    tl = [x for x in c.get("top_layers") or [] if (x.get("share_of_cluster") or 0) >= 0.005]
    if tl:
        out += ("<p>Layers: " + ", ".join(f"{_e(x.get('layer'))} ({_e(_pct(x.get('share_of_cluster')))})" for x in tl)
                + " <span class=note>(share of this cluster's maps)</span></p>")
    return out


def _meta_lines(c: dict) -> str:
    parts = []
    g = c.get("groups") or {}
    if g.get("top") is not None:
        flag = ' <span class="flag">dominated by one group</span>' if g.get("dominated") else ""
        parts.append(f"<p>Most common group: <b>{_e(g.get('top'))}</b>, {_e(_pct(g.get('share')))} of this cluster's "
                     f"maps vs {_e(_pct(g.get('overall_share')))} of all maps.{flag}</p>")
    labels = c.get("labels") or {}
    if labels:
        parts.append("<p>Labels: " + ", ".join(f"{_e(k)} {_e(_pct(v))}" for k, v in labels.items()) + "</p>")
    return "".join(parts)


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


def _headview_links(c: dict, paths: list[str] | None, report_dir: Path) -> str:
    if not paths:
        return ""
    items = c.get("exemplar_examples") or []
    links = []
    for i, p in enumerate(paths):
        rel = _safe_rel(p, report_dir)
        if rel is None:
            continue
        it = items[i] if i < len(items) else {}
        ex = it.get("example_id", it.get("example_index"))
        label = f"layer {it.get('layer')} head {it.get('head')}, example {ex}" if it else PurePosixPath(rel).name
        links.append(f'<li><a href="{_e(quote(rel))}">{_e(label)}</a></li>')
    if not links:
        return ""
    return ("<p><b>Head views</b> <span class=note>(BertViz, interactive; opens offline)</span></p>"
            f"<ul>{''.join(links)}</ul>")


def _cluster_section(k: int, c: dict, d: dict, figs: dict, colors: dict, headviews: dict | None,
                     report_dir: Path, have_thumbs: bool) -> str:
    cid = c.get("id")
    rgb = "#%02x%02x%02x" % tuple(int(255 * v) for v in colors.get(cid, figures.NOISE_COLOR)[:3])
    occ = figs["occupancy"].get(k)
    mont = figs["montage"].get(k)
    fig_html = _img(occ, f"{_cluster_name(cid)}: share of each head's maps")
    if mont:
        fig_html += _img(mont, f"{_cluster_name(cid)}: mean map and exemplars")
    elif not have_thumbs:
        fig_html += '<p class="note">No thumbnails were kept (extract.thumbnail_size: 0), so no map images.</p>'
    hv = None
    if headviews:
        hv = headviews.get(cid, headviews.get(str(cid)))
    return f"""
<section class="cluster" id="{_anchor(cid)}">
<h3><span class="swatch" style="background:{rgb}"></span>{_e(_cluster_name(cid).capitalize())}:
{_e(_num(c.get('size')))} maps ({_e(_pct(c.get('share')))})</h3>
<p class="summary">{_e(c.get('summary'))}</p>
<p class="where"><b>Where:</b> {_e(c.get('dominant_description'))}</p>
<div class="row"><div class="text">
{_signature_table(c, d)}
{_heads_table(c)}
{_meta_lines(c)}
{_headview_links(c, hv, report_dir)}
</div><div class="figs">{fig_html}</div></div>
</section>"""


def _meta_p(m: dict) -> tuple[float | None, str]:
    """The p-value to state the finding with, and how it was obtained. A permutation p (example values
    shuffled as units) is preferred: the chi-square test counts every map of an example as an
    independent sample, which they are not."""
    for key, how in (("p_permutation", "permutation"), ("p", "test"), ("chi2_p_maps", "chi-square on maps")):
        v = m.get(key)
        if v is not None and not _is_nan(v):
            return float(v), how
    return None, ""


def _metadata_block(key: str, m: dict) -> str:
    p, how = _meta_p(m)
    perms = m.get("permutations")
    cols = [("chi-square", _num(m.get("chi2"))), ("dof", _num(m.get("dof")))]
    if "chi2_p_maps" in m:
        cols.append(("chi-square p (maps as independent)", _pval(m.get("chi2_p_maps"))))
    if "p_permutation" in m:
        cols.append((f"permutation p ({_num(perms)} shuffles)" if perms else "permutation p",
                     _pval(m.get("p_permutation"))))
    if "p" in m:
        cols.append(("p", _pval(m.get("p"))))
    cols += [("mutual information", _num(m.get("mutual_info"))), ("normalised MI", _num(m.get("nmi")))]
    n = m.get("n_maps", m.get("n"))
    if n is not None:
        cols.append(("maps", _num(n)))
    if m.get("n_values") is not None:
        cols.append((f"{key} values", _num(m.get("n_values"))))
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
<p>{method}: {verdict} Normalised mutual information ({_e(_num(m.get('nmi')))}) says how much of the cluster
assignment the {_e(key)} explains (0 = nothing, 1 = all of it), whatever the p-value.</p>"""


def _metadata_section(d: dict) -> str:
    meta = d.get("metadata") or {}
    blocks = []
    for key in ("label", "group"):
        m = meta.get(key)
        if not m:
            blocks.append(f"<h3>Cluster vs example {key}</h3><p class=note>Not tested: the data has no {key}s, "
                          "or only one value.</p>")
            continue
        blocks.append(_metadata_block(key, m))
    return f"""
<section id="metadata"><h2>Clusters and example metadata</h2>
<p class="note">Does knowing which cluster a map falls in tell you something about the example it came from?
Noise maps are left out{_e(f", and so are the {meta['probe_examples_excluded']} repeated-token probe examples"
 if meta.get("probe_examples_excluded") else "")}.</p>
{"".join(blocks)}</section>"""


def _k_sweep_section(d: dict, figs: dict) -> str:
    ks = d.get("k_sweep")
    if not ks or not figs.get("k_sweep"):
        return ""
    chosen = ks.get("chosen")
    inertia = ks.get("inertia") or []
    sil = ks.get("silhouette") or []
    rows = "".join(
        f'<tr{" class=chosen" if k == chosen else ""}><td class=n>{_e(k)}</td>'
        f"<td class=n>{_e(_num(inertia[i] if i < len(inertia) else None))}</td>"
        f"<td class=n>{_e(_num(sil[i] if i < len(sil) else None))}</td></tr>"
        for i, k in enumerate(ks.get("k") or []))
    return f"""
<section id="k-sweep"><h2>Choosing k</h2>
<p>Chosen k: <b>{_e(chosen)}</b>. Inertia always falls as k grows; look for the bend, and for a high silhouette.</p>
<div class="row"><div>{_img(figs["k_sweep"], "inertia and silhouette against k")}</div>
<div><table><thead><tr><th class=n>k</th><th class=n>inertia</th><th class=n>silhouette</th></tr></thead>
<tbody>{rows}</tbody></table></div></div></section>"""


def render_html(d: dict, figs: dict, headviews: dict | None, report_dir: Path, have_thumbs: bool) -> str:
    clusters = d.get("clusters") or []
    colors = figures.cluster_colors([c["id"] for c in clusters])
    model = (d.get("model") or {}).get("name", "")
    data_path = (d.get("data") or {}).get("path", "")
    counts = d.get("counts") or {}
    clustering = d.get("clustering") or {}
    title = f"Attention-map clusters: {model}" + (f" on {Path(str(data_path)).name}" if data_path else "")
    sub = (f"{_num(counts.get('examples'))} examples, {_num(counts.get('maps'))} maps, "
           f"{len([c for c in clusters if c.get('id') != -1])} clusters ({clustering.get('method', '?')}, "
           f"silhouette {_num(clustering.get('silhouette'))})")
    nav = [("overview", "Overview")]
    if d.get("warnings"):
        nav.insert(0, ("warnings", f"Warnings ({len(d['warnings'])})"))
    if figs["scatter"]:
        nav.append(("map", "2-D map"))
    if figs.get("grid"):
        nav.append(("heads", "Heads"))
    if figs.get("detectors"):
        nav.append(("detectors", "Detectors"))
    nav.append(("clusters", "Clusters"))
    nav.append(("metadata", "Metadata"))
    if figs.get("k_sweep"):
        nav.append(("k-sweep", "Choosing k"))
    nav_html = "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in nav)
    sections = "".join(
        _cluster_section(k, c, d, figs, colors, headviews, report_dir, have_thumbs) for k, c in enumerate(clusters))
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
{_warnings(d)}
{_overview(d)}
{_map_section(figs)}
{_heads_section(figs)}
{_detectors_section(d, figs)}
<section id="clusters"><h2>Clusters</h2>
<p class="note">Sorted by size. "What sets it apart" names the statistics whose cluster mean differs most
from the overall mean (in standard deviations, z); "where" names the layers and heads whose maps make up
most of the cluster.</p>
{_cluster_index(d, colors)}
{sections}
</section>
{_metadata_section(d)}
{_k_sweep_section(d, figs)}
<footer>Written by rapids_attn on {_e(now)}. Static page: no scripts, no external resources.</footer>
</main></body></html>
"""


# ---------------------------------------------------------------------------------------------
# entry point


def write_report(run_dir, d: dict, arrays: dict | None, headviews: dict[int, list[str]] | None = None) -> Path:
    """Write ``run_dir/report/index.html`` and its figures; return the path of ``index.html``.

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
    arrays = arrays or {}
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=report_dir))
    try:
        figs = _make_figures(stage, d, arrays)
        page = render_html(d, figs, headviews, report_dir, have_thumbs=arrays.get("mean_thumbs") is not None)
        (stage / "index.html").write_text(page, encoding="utf-8")
        names = set(_figure_names(figs))
        for old in report_dir.iterdir():
            if old.is_file() and _FIGURE_RE.match(old.name) and old.name not in names:
                old.unlink()
        for name in names:
            os.replace(stage / name, report_dir / name)
        os.replace(stage / "index.html", index)  # last: the page appears only when everything is in place
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return index
