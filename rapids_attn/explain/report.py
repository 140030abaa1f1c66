"""``report/index.html``: the static, self-contained report of a run.

:func:`write_report` renders describe's typed results (:class:`~rapids_attn.explain.findings.Findings`
and :class:`~rapids_attn.explain.findings.FigureArrays`) beside the run's
:class:`~rapids_attn.explain.findings.RunOverview`, and writes ``run_dir/report/index.html`` with PNG
figures beside it. The page has inline CSS, relative image paths and no scripts, fonts or other external
resources, so it opens from disk anywhere, offline. Every string that comes from the data (group names,
example ids, stat labels, warnings, ...) is HTML-escaped.

This module holds the staging, the figure files and the page's assembly; what each section of the
page says is :mod:`rapids_attn.explain.sections`, and how a single value is written
:mod:`rapids_attn.explain.formatting`.

Atomicity: figures and the page are first written into a hidden staging folder inside
``report/``; only when every figure has rendered are the PNGs moved into place and, last,
``index.html`` renamed in. A previous ``index.html`` is removed before anything else, so a crash
midway leaves no page at all (rather than a stale page that looks complete), and the staging folder
is deleted whatever happens. Head-view pages (:mod:`rapids_attn.explain.headview`) live in
``report/headviews/`` and are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from rapids_attn.explain import figures
from rapids_attn.explain.findings import FigureArrays, Findings, RunOverview
from rapids_attn.explain.formatting import esc, num
from rapids_attn.explain.sections import (
    cluster_index,
    cluster_section,
    detectors_section,
    heads_section,
    k_sweep_section,
    map_section,
    metadata_section,
    overview_section,
    warnings_section,
)

STAGING_PREFIX = ".report-tmp-"
#: figure files the explain stage's own sections draw; with the stages' report sections' own
#: (:attr:`rapids_attn.stage.ReportSection.figure_pattern`), the names of the figures a report writes (stale ones
#: from an earlier report are removed on success)
_OWN_FIGURES = r"scatter_(cluster|layer)|dominant_grid|k_sweep|detectors|(occupancy|montage)_\d+"


def _figure_re(sections) -> re.Pattern:
    """The figure files of a report with these ``(section, state)`` pairs."""
    names = [_OWN_FIGURES, *(sec.figure_pattern for sec, _ in sections if sec.figure_pattern)]
    return re.compile(rf"^({'|'.join(names)})\.png$")


# ---------------------------------------------------------------------------------------------
# figures


def _coords_label(overview: RunOverview) -> str:
    return {"umap": "UMAP", "pca": "PC"}[overview.clustering.coords]


def _make_figures(
    out_dir: Path, overview: RunOverview, findings: Findings, arrays: FigureArrays | None, sections=()
) -> figures.FigureFiles:
    """Render every figure into ``out_dir``; any failure propagates (no partial report)."""
    clusters = findings.clusters
    colors = figures.cluster_colors([c.id for c in clusters])
    figs = figures.FigureFiles(
        grid=figures.dominant_grid_png(
            out_dir,
            findings.heads_table,
            [c.id for c in clusters],
            layers=findings.layers,
            heads=findings.heads,
            colors=colors,
        ),
        detectors=figures.detectors_png(
            out_dir, findings.detectors.scores, findings.detectors.names, findings.layers, findings.heads
        ),
    )
    if arrays is not None:
        if len(arrays.scatter.x) > 0:
            label = _coords_label(overview)
            figs.scatter["cluster"] = figures.scatter_png(
                out_dir, arrays.scatter, "cluster", colors=colors, coords_label=label
            )
            figs.scatter["layer"] = figures.scatter_png(out_dir, arrays.scatter, "layer", coords_label=label)
        for k, c in enumerate(clusters):
            figs.occupancy[k] = figures.occupancy_png(
                out_dir, k, arrays.occupancy[k], findings.layers, findings.heads, cluster_id=c.id
            )
            if arrays.mean_thumbs is not None:
                figs.montage[k] = figures.montage_png(
                    out_dir,
                    k,
                    arrays.mean_thumbs[k],
                    arrays.exemplar_thumbs[k],
                    arrays.exemplar_info[k],
                    cluster_id=c.id,
                )
    if findings.k_sweep is not None and findings.k_sweep.k:
        figs.k_sweep = figures.k_sweep_png(out_dir, findings.k_sweep)
    figs.sections = [sec.figures(out_dir, state) for sec, state in sections]
    return figs


# ---------------------------------------------------------------------------------------------
# the page


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


def render_html(
    overview: RunOverview,
    findings: Findings,
    figs: figures.FigureFiles,
    headviews: dict | None,
    report_dir: Path,
    no_thumbs: bool,
    sections=(),
) -> str:
    """The page. no_thumbs: the store kept no thumbnails, which the cluster sections say. ``sections``: the stages'
    report sections, ``(section, what it read)``, in order; ``figs.sections`` holds their figures."""
    clusters = findings.clusters
    colors = figures.cluster_colors([c.id for c in clusters])
    data_path = overview.data["path"]
    title = f"Attention-map clusters: {overview.model['name']}" + (
        f" on {Path(str(data_path)).name}" if data_path else ""
    )
    cl = overview.clustering
    sub = (
        f"{num(overview.counts['examples'])} examples, {num(overview.counts['maps'])} maps, "
        f"{len([c for c in clusters if c.id != -1])} clusters ({cl.method}, silhouette {num(cl.silhouette)}"
        + (f", seed stability ARI {num(cl.stability)}" if cl.stability is not None else "")
        + ")"
    )
    nav = [("overview", "Overview")]
    if findings.warnings:
        nav.insert(0, ("warnings", f"Warnings ({len(findings.warnings)})"))
    if figs.scatter:
        nav.append(("map", "2-D map"))
    nav += [("heads", "Heads"), ("detectors", "Detectors"), ("clusters", "Clusters"), ("metadata", "Metadata")]
    if figs.k_sweep:
        nav.append(("k-sweep", "Choosing k"))
    stage_html = []  # each stage's section, after the detectors; linked before the clusters when it has one
    for (sec, state), sec_figs in zip(sections, figs.sections or [[] for _ in sections], strict=True):
        html = sec.html(state, sec_figs)
        if html:
            nav.insert(nav.index(("clusters", "Clusters")), (sec.anchor, sec.title))
        stage_html.append(html)
    nav_html = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in nav)
    if report_dir is not None and (Path(report_dir) / "explorer.html").is_file():
        nav_html += '<a href="explorer.html"><b>Interactive explorer</b></a>'  # explain.explorer
    sections = "".join(
        cluster_section(k, c, findings, figs, colors, headviews, report_dir, no_thumbs) for k, c in enumerate(clusters)
    )
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = f"""{warnings_section(findings.warnings)}
{overview_section(overview)}
{map_section(figs)}
{heads_section(figs)}
{detectors_section(findings, figs)}
{chr(10).join(stage_html)}
<section id="clusters"><h2>Clusters</h2>
<p class="note">Sorted by size. "What sets it apart" names the statistics whose cluster mean differs most
from the overall mean (in standard deviations, z); "where" names the layers and heads whose maps make up
most of the cluster.</p>
{cluster_index(clusters, colors)}
{sections}
</section>
{metadata_section(findings.metadata)}
{k_sweep_section(findings, figs)}"""
    return page(
        title,
        sub,
        nav_html,
        body,
        f"Written by rapids_attn on {esc(now)}. Static page: no scripts, no external resources.",
    )


def page(title: str, sub: str, nav_html: str, body: str, footer: str) -> str:
    """A static report page: the house CSS inline, a title, a subtitle, the section links (``nav_html``), the
    sections (``body``) and a footer (both HTML); shared by the run's report and the campaign atlas's."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>{esc(title)}</h1>
<p class="sub">{esc(sub)}</p>
<nav>{nav_html}</nav>
{body}
<footer>{footer}</footer>
</main></body></html>
"""


# ---------------------------------------------------------------------------------------------
# entry point


def write_report(
    run_dir,
    overview: RunOverview,
    findings: Findings,
    arrays: FigureArrays | None,
    headviews: dict[int, list[str]] | None = None,
    sections: list | None = None,  # (section, state) pairs; none: the page without the stages' sections
    owned: set[str] | None = None,
    written: set[str] | None = None,
) -> Path:
    """Write ``run_dir/report/index.html`` and its figures; return the path of ``index.html``.

    ``arrays`` None leaves out the figures drawn from them (2-D map, occupancy, montages).
    ``headviews`` maps a cluster id to the head-view pages written for it (paths relative to
    ``report/``, as :func:`rapids_attn.explain.headview.write_head_views` returns them); links are
    made only to pages that exist inside the report folder.

    ``sections``: the stages' report sections with what each read, ``(section, state)``
    (:class:`rapids_attn.stage.ReportSection`), in the order they appear; None: every registered stage's, with
    nothing read (each then shows nothing).

    ``owned``: the names in ``report/`` an earlier report wrote (its manifest, :func:`rapids_attn.rundir.
    own_report_files`); of those, the figures this report does not draw are removed. None: every file of a
    figure's name. ``written``, when given, receives the names this report wrote.
    """
    report_dir = Path(run_dir) / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    index = report_dir / "index.html"
    index.unlink(missing_ok=True)  # a page from an earlier run must not survive a failed rewrite
    for old in report_dir.glob(STAGING_PREFIX + "*"):  # left by a process that was killed
        shutil.rmtree(old, ignore_errors=True)
    sections = list(sections or ())
    figure_re = _figure_re(sections)
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=report_dir))
    try:
        figs = _make_figures(stage, overview, findings, arrays, sections)
        no_thumbs = arrays is not None and arrays.mean_thumbs is None
        page = render_html(overview, findings, figs, headviews, report_dir, no_thumbs, sections)
        (stage / "index.html").write_text(page, encoding="utf-8")
        names = set(figs.names())
        for old in report_dir.iterdir():
            mine = old.name in owned if owned is not None else figure_re.match(old.name)
            if old.is_file() and mine and figure_re.match(old.name) and old.name not in names:
                old.unlink()
        for name in names:
            os.replace(stage / name, report_dir / name)
        os.replace(stage / "index.html", index)  # last: the page appears only when everything is in place
        if written is not None:
            written.update({*names, "index.html"})
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return index
