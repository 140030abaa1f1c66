"""A campaign atlas's two pages (issue 50): ``report.html`` (static) and ``explorer.html`` (Bokeh), both written
into the atlas folder from the files there alone (no run's store is opened), so that they can be rewritten from
a copied atlas.

- ``report.html``: the runs merged and those left out (and why); the **model x class table** (each model's heads of
  each long-context class, per dataset when there are several); per family the classes by quarter of relative
  depth; each run against the reference (matched distance, heads matched to their own layer and head, margin, the
  layer similarity's diagonal); the joint clusters; where each run's KV exports are. Inline CSS (the run report's,
  :mod:`rapids_attn.explain.report`), no scripts, no external resources; every string from the data escaped.
- ``explorer.html``: every head of every run as a point in two linked views, relative depth (heads of a layer
  spread by their index) against the first principal component of the standardised profile features, and the
  first two principal components; coloured by class or by model; a model filter (a menu: all models, or one)
  that keeps the model's heads in both views and its rows in the model x class table below them, in the browser.
  One standalone file (Bokeh, scripts inlined: opens offline), like the run's explorer
  (:mod:`rapids_attn.explain.explorer`, whose model colours it uses; classes take :mod:`rapids_attn.explain.palette`'s
  first colours).

:func:`rapids_attn.campaign.merge.merge` calls :func:`write_report` in its staging folder, so the atlas folder
appears with its pages or not at all.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from rapids_attn.explain.formatting import esc, num, pct
from rapids_attn.kvheads.evidence import LABELS as CLASSES  # the head classes, in head_classes.json's order

REPORT = "report.html"
EXPLORER = "explorer.html"
#: a head whose run kept no head_classes.json entry for it
UNCLASSIFIED = "unclassified"
FEATURE_PREFIXES = ("stats:", "detectors:", "profile:")


# ---------------------------------------------------------------------------------------------
# reading the atlas folder


def _json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _parquet(path: Path):
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pandas()
    except (OSError, ValueError):
        return None


def read_atlas(atlas_dir: Path) -> dict:
    """The atlas folder's files: ``doc`` (atlas.json), ``heads`` and ``matches`` (DataFrames; matches None when
    absent), ``layers``, ``families``, ``clusters`` (dicts; empty when absent)."""
    d = Path(atlas_dir)
    heads = _parquet(d / "heads.parquet")
    if heads is None:
        raise FileNotFoundError(f"{d}: no readable heads.parquet; merge the campaign first")
    heads["class"] = heads["class"].fillna(UNCLASSIFIED) if "class" in heads else UNCLASSIFIED
    heads["run"] = heads["model"].astype(str) + "/" + heads["dataset"].astype(str)
    matches = _parquet(d / "matches.parquet")
    if matches is not None and (len(matches) == 0 or "reference_head" not in matches):
        matches = None
    return {
        "doc": _json(d / "atlas.json", {}),
        "heads": heads,
        "matches": matches,
        "layers": _json(d / "layers.json", {}),
        "families": _json(d / "families.json", {}),
        "clusters": _json(d / "clusters.json", {}),
    }


def class_order(heads) -> list[str]:
    """The head classes in order, then "unclassified" and any other label the heads carry."""
    extra = sorted(set(heads["class"]) - set(CLASSES) - {UNCLASSIFIED})
    return [*CLASSES, *extra, *([UNCLASSIFIED] if (heads["class"] == UNCLASSIFIED).any() else [])]


def model_class_table(heads) -> list[dict]:
    """The model x class table: one row per model (and dataset), in the models' order of appearance: ``model``,
    ``dataset``, ``heads`` and, per class, ``counts[class]`` and ``shares[class]`` (of the model's heads)."""
    classes = class_order(heads)
    rows = []
    for (model, dataset), g in heads.groupby(["model", "dataset"], sort=False):
        n = len(g)
        counts = {c: int((g["class"] == c).sum()) for c in classes}
        rows.append(
            {
                "model": str(model),
                "dataset": str(dataset),
                "heads": n,
                "counts": counts,
                "shares": {c: counts[c] / n if n else 0.0 for c in classes},
            }
        )
    return rows


def match_summary(matches, layers: dict) -> list[dict]:
    """Per run matched to a reference: its reference, how, heads, median distance, share matched to their own
    (layer, head), median margin (None across layers), and the layer similarity (layers.json's entry)."""
    out = []
    if matches is None:
        return out
    for run, g in matches.groupby("run", sort=False):
        same = (g["layer"] == g["reference_layer"]) & (g["head"] == g["reference_head"])
        margin = g["margin"].dropna() if "margin" in g else []
        out.append(
            {
                "run": str(run),
                "reference": str(g["reference"].iloc[0]),
                "how": str(g["how"].iloc[0]),
                "heads": len(g),
                "median_distance": float(g["distance"].median()),
                "own_head": float(same.mean()),
                "median_margin": float(np.median(margin)) if len(margin) else None,
                "layers": layers.get(str(run), {}),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# report.html


def _table(head: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    """An HTML table; ``head`` and ``rows`` are already-escaped cells; columns from ``numeric_from`` right-aligned."""
    th = "".join(f"<th{' class=n' if i >= numeric_from else ''}>{h}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i >= numeric_from else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _runs_section(a: dict) -> str:
    doc, heads = a["doc"], a["heads"]
    shape = {
        run: (g["layer"].nunique(), g["head"].nunique(), g["family"].iloc[0], g["variant"].iloc[0])
        for run, g in heads.groupby("run", sort=False)
    }
    runs = doc.get("runs") or list(shape)
    rows = []
    for r in runs:
        nl, nh, fam, var = shape.get(r, (None, None, None, None))
        ref = " (reference)" if r.split("/")[0] == doc.get("reference") else ""
        rows.append([esc(r) + ref, esc(fam), esc(var), num(nl), num(nh)])
    left = doc.get("left_out") or {}
    left_html = (
        "<h3>Left out</h3>" + _table(["run", "why"], [[esc(k), esc(v)] for k, v in left.items()], numeric_from=2)
        if left
        else "<p>No run was left out.</p>"
    )
    return f"""<section id="runs"><h2>Runs</h2>
<p class="note">The campaign's runs whose state was <i>done</i> at the merge, each read once from its store and
head_classes.json; a run in any other state (failed, interrupted, stale, pending) is left out, with its state and
error.</p>
{_table(["run", "family", "variant", "layers", "heads"], rows, numeric_from=3)}
{left_html}
</section>"""


def _model_class_section(a: dict) -> str:
    heads = a["heads"]
    classes = class_order(heads)
    table = model_class_table(heads)
    several = heads["dataset"].nunique() > 1
    head = ["model", *(["dataset"] if several else []), "heads", *(esc(c) for c in classes)]
    rows = []
    for r in table:
        cells = [esc(r["model"]), *([esc(r["dataset"])] if several else []), num(r["heads"])]
        cells += [f"{num(r['counts'][c])} <span class=note>({pct(r['shares'][c])})</span>" for c in classes]
        rows.append(cells)
    total = len(heads)
    tc = {c: int((heads["class"] == c).sum()) for c in classes}
    rows.append(
        ["<b>all</b>", *([""] if several else []), f"<b>{num(total)}</b>"]
        + [f"<b>{num(tc[c])}</b> <span class=note>({pct(tc[c] / max(1, total))})</span>" for c in classes]
    )
    return f"""<section id="model-class"><h2>Model x class</h2>
<p class="note">Each model's heads of each long-context class, and their share of its heads. Protocol: each run's
head_classes.json (the explain stage, over the run's whole dataset): a head takes the first of retrieval, streaming,
sink whose dataset-mean score reaches its threshold, else other; not_applicable where a score it needs is undefined
(inputs too short){"; unclassified: the run kept no class for the head" if UNCLASSIFIED in classes else ""}.</p>
{_table(head, rows, numeric_from=2 if several else 1)}
</section>"""


def _families_section(a: dict) -> str:
    fams = a["families"]
    if not fams:
        return ""
    parts = []
    for key, v in fams.items():
        bins = v.get("depth_bins") or [str(i) for i in range(len(next(iter(v["by_depth"].values()), [])))]
        rows = [[esc(c), *(num(x) for x in counts)] for c, counts in v["by_depth"].items() if any(counts)]
        models = ", ".join(esc(m) for m in v.get("models", []))
        parts.append(
            f"<h3>{esc(key)}</h3><p class=note>models: {models}</p>"
            + _table(["class \\ relative depth", *(esc(b) for b in bins)], rows)
        )
    return f"""<section id="families"><h2>Families</h2>
<p class="note">Per family and dataset: the heads of each class in each quarter of relative depth (layer /
(layers - 1)), summed over the family's models (families.json; classes with no head are left out).</p>
{"".join(parts)}
</section>"""


def _rsa_text(entry: dict) -> str:
    rsa = entry.get("rsa")
    if rsa is None:
        return esc(entry.get("why") or "n/a")
    m = np.asarray(rsa, float)
    if m.ndim != 2 or m.size == 0:
        return "n/a"
    if m.shape[0] != m.shape[1]:
        best = ", ".join(str(int(j)) for j in np.nanargmax(np.nan_to_num(m, nan=-2), axis=1))
        return (
            f"layer counts differ ({m.shape[0]} vs {m.shape[1]} reference layers): no diagonal; each layer's most "
            f"similar reference layer: {best}"
        )
    d = np.diag(m)
    return f"mean {num(float(np.nanmean(d)), 2)}: " + ", ".join(num(float(x), 2) for x in d)


def _matches_section(a: dict) -> str:
    summary = match_summary(a["matches"], a["layers"])
    ref = a["doc"].get("reference")
    if not summary:
        body = "<p>No run was matched (one model per dataset, or no matches.parquet).</p>"
    else:
        rows = [
            [
                esc(s["run"]),
                esc(s["reference"]),
                esc(s["how"]),
                num(s["heads"]),
                num(s["median_distance"]),
                pct(s["own_head"]),
                num(s["median_margin"]),
                _rsa_text(s["layers"]),
            ]
            for s in summary
        ]
        head = ["run", "reference", "matched", "heads", "median distance", "own (layer, head)", "median margin"]
        body = _table([*head, "layer RSA diagonal"], rows, numeric_from=3)
    return f"""<section id="matches"><h2>Matched to the reference ({esc(ref)})</h2>
<p class="note">Each run's heads matched one to one to the reference model's run on the same dataset by their
profiles (the dataset means of every statistic, detector and offset profile, each z-scored over both runs' heads):
within each layer where the two models have one shape (then the margin is the distance to the next-nearest head
less the matched one), else across all heads with a relative-depth cost (no margin). "own (layer, head)": the share
of heads matched to the reference head of the same layer and index. Layer RSA: Spearman's correlation of the two
layers' example dissimilarity matrices over the examples both runs hold (1 on the diagonal: layer for layer the
same geometry).</p>
{body}
</section>"""


def _clusters_section(a: dict) -> str:
    cl = a["clusters"]
    if not cl.get("clusters"):
        why = cl.get("why") or (a["doc"].get("joint_clusters") or {}).get("why") or "no clusters.json"
        return f'<section id="clusters"><h2>Joint clusters</h2><p>None: {esc(why)}.</p></section>'
    models = sorted({m for c in cl["clusters"] for m in c.get("share_of_each_model", {})})
    rows = [
        [
            esc(c["cluster"]),
            num(c["maps"]),
            num(c.get("mean_depth"), 2),
            *(pct(c["share_of_each_model"].get(m)) for m in models),
        ]
        for c in cl["clusters"]
    ]
    emb = cl.get("embedder") or []
    return f"""<section id="clusters"><h2>Joint clusters</h2>
<p class="note">One clustering (PCA, then KMeans, k = {esc(cl.get("n_clusters"))}) of {num(cl.get("maps"))} maps,
{num(cl.get("per_run"))} sampled from each run, in their stored embeddings ({esc(" ".join(map(str, emb)))}), so
that a cluster means the same in every model. Per cluster: its maps, their mean relative depth, and each model's
share of its own sampled maps (each model's column sums to 100%).</p>
{_table(["cluster", "maps", "mean depth", *(esc(m) for m in models)], rows)}
</section>"""


def _exports_section(a: dict) -> str:
    ex = a["doc"].get("kv_exports") or {}
    runs = a["doc"].get("runs") or sorted(set(a["heads"]["run"]))
    rows = [
        [esc(r), f'<a href="{esc(ex[r])}/exports.json"><code>{esc(ex[r])}</code></a>']
        if r in ex
        else [esc(r), "<span class=note>none</span>"]
        for r in runs
    ]
    return f"""<section id="kv-exports"><h2>KV exports</h2>
<p class="note">Where each run's per-head KV-cache exports are, relative to this folder (the run's head_classes/
folder; the link opens its exports.json, which says how to load each file), for a KV-cache or pruning tool;
"none": the run wrote none (an encoder, or classes that do not apply).</p>
{_table(["run", "exports"], rows, numeric_from=2)}
</section>"""


def render_report(a: dict, explorer: bool = True) -> str:
    """report.html's text from :func:`read_atlas`'s content."""
    from rapids_attn.explain.report import page

    doc, heads = a["doc"], a["heads"]
    title = f"Campaign atlas: {doc.get('campaign') or 'campaign'}"
    sub = (
        f"{num(heads['run'].nunique())} runs merged, {num(len(heads))} heads, {num(heads['model'].nunique())} models "
        f"on {num(heads['dataset'].nunique())} dataset(s); reference model {doc.get('reference')}"
    )
    nav = [
        ("runs", "Runs"),
        ("model-class", "Model x class"),
        ("families", "Families"),
        ("matches", "Matched to the reference"),
        ("clusters", "Joint clusters"),
        ("kv-exports", "KV exports"),
    ]
    nav_html = "".join(f'<a href="#{k}">{esc(t)}</a>' for k, t in nav)
    if explorer:
        nav_html += f'<a href="{EXPLORER}"><b>Interactive explorer</b></a>'
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join(
        f(a)
        for f in (
            _runs_section,
            _model_class_section,
            _families_section,
            _matches_section,
            _clusters_section,
            _exports_section,
        )
    )
    footer = (
        f"Written by rapids_attn on {esc(now)} from the atlas folder's files (python -m rapids_attn.campaign ... "
        "merge).\nStatic page: no scripts, no external resources."
    )
    return page(title, sub, nav_html, body, footer)


# ---------------------------------------------------------------------------------------------
# explorer.html


def principal_components(heads, k: int = 2) -> tuple[np.ndarray, list[float]]:
    """[heads, k] the heads' coordinates on the first ``k`` principal components of their profile features, each
    feature z-scored over all heads (a missing value at the feature's mean; constant features left out), and each
    component's share of the variance."""
    cols = [c for c in heads.columns if c.startswith(FEATURE_PREFIXES)]
    n = len(heads)
    if not cols or n < 2:
        return np.zeros((n, k)), [0.0] * k
    x = np.array(heads[cols].to_numpy(dtype=np.float64), copy=True)
    x[~np.isfinite(x)] = np.nan
    with np.errstate(all="ignore"):
        mu, sd = np.nanmean(x, axis=0), np.nanstd(x, axis=0)
    keep = np.isfinite(sd) & (sd > 1e-12)
    if not keep.any():
        return np.zeros((n, k)), [0.0] * k
    z = np.nan_to_num((x[:, keep] - mu[keep]) / sd[keep], nan=0.0)
    z -= z.mean(axis=0)
    u, s, _ = np.linalg.svd(z, full_matrices=False)
    pcs = u[:, :k] * s[:k]
    var = s**2 / max(float((s**2).sum()), 1e-12)
    if pcs.shape[1] < k:
        pcs = np.pad(pcs, ((0, 0), (0, k - pcs.shape[1])))
    return pcs, [float(v) for v in np.pad(var, (0, k))[:k]]


def _jittered_depth(heads) -> np.ndarray:
    """Relative depth, each layer's heads spread by their index over 80% of the gap to the next layer."""
    out = np.zeros(len(heads))
    for _, g in heads.groupby("run", sort=False):
        nl = max(1, g["layer"].nunique())
        rank = g["head"].rank(method="dense").to_numpy() - 1
        nh = max(1, g["head"].nunique())
        gap = 1.0 / max(1, nl - 1)
        out[heads.index.get_indexer(g.index)] = g["depth"].to_numpy() + ((rank + 0.5) / nh - 0.5) * 0.8 * gap
    return out


def class_colours(classes: list[str]) -> list[str]:
    """A colour per class: the cluster palette's first for retrieval, streaming, sink, other (and any other label),
    grey for not_applicable, light grey for unclassified."""
    from rapids_attn.explain.palette import NOISE, cluster_colour

    out, k = [], 0
    for c in classes:
        if c == "not_applicable":
            out.append(NOISE)
        elif c == UNCLASSIFIED:
            out.append("#e2e2e2")
        else:
            out.append(cluster_colour(k))
            k += 1
    return out


def explorer_columns(a: dict) -> tuple[dict[str, list], list[float]]:
    """The explorer's point columns, one per head, and the two components' shares of the variance."""
    heads = a["heads"].reset_index(drop=True)
    pcs, var = principal_components(heads)
    matched = {}
    m = a["matches"]
    if m is not None:
        for run, la, ha, ref, lb, hb, dist in zip(
            m["run"],
            m["layer"],
            m["head"],
            m["reference"],
            m["reference_layer"],
            m["reference_head"],
            m["distance"],
            strict=True,
        ):
            matched[(str(run), int(la), int(ha))] = (f"L{int(lb)}H{int(hb)} of {ref}", f"{float(dist):.3g}")
    refs = {str(r) for r in m["reference"]} if m is not None else set()
    score = heads["class_score"] if "class_score" in heads else [None] * len(heads)
    cols: dict[str, list] = {
        "x": _jittered_depth(heads).tolist(),
        "pc1": pcs[:, 0].tolist(),
        "pc2": pcs[:, 1].tolist(),
        "model": heads["model"].astype(str).tolist(),
        "dataset": heads["dataset"].astype(str).tolist(),
        "layer": heads["layer"].astype(int).tolist(),
        "head": heads["head"].astype(int).tolist(),
        "depth": [round(float(d), 3) for d in heads["depth"]],
        "cls": heads["class"].astype(str).tolist(),
        "score": ["n/a" if s is None or not np.isfinite(s) else f"{float(s):.3g}" for s in score],
        "matched": [],
        "distance": [],
    }
    for run, la, ha in zip(heads["run"], cols["layer"], cols["head"], strict=True):
        hit = matched.get((run, la, ha))
        if hit is None:
            hit = ("(the reference)", "") if run in refs else ("", "")
        cols["matched"].append(hit[0])
        cols["distance"].append(hit[1])
    return cols, var


#: the model filter: both views keep the chosen model's heads, the table its rows; the status line follows and the
#: page's address keeps the choice (explorer.html#model=gpt2)
_FILTER_JS = """
const m = model_select.value;
const d = points.data, keep = [];
for (let i = 0; i < d.model.length; i++) if (m === 'all' || d.model[i] === m) keep.push(i);
points_filter.indices = keep;
const t = table.data, rows = [];
for (let i = 0; i < t.model.length; i++) if (m === 'all' || t.model[i] === m) rows.push(i);
table_filter.indices = rows;
status.text = keep.length.toLocaleString('en-US') + ' heads shown' + (m === 'all' ? '' : ' (' + m + ')');
try { history.replaceState(null, '', m === 'all' ? location.pathname + location.search
  : '#model=' + encodeURIComponent(m)); } catch (e) {}
points.change.emit(); table.change.emit();
"""

_READY_JS = (
    """
const wanted = new URLSearchParams(location.hash.slice(1)).get('model');
if (wanted !== null && model_select.options.includes(wanted)) model_select.value = wanted;
"""
    + _FILTER_JS
)

_COLOUR_JS = """
const by_model = colour_select.value === 'model';
for (const r of by_class) r.visible = !by_model;
for (const r of by_model_r) r.visible = by_model;
"""


def _views(points, points_filter, classes: list[str], models: list[str], var: list[float]):
    """The two linked views, each with a renderer coloured by class (shown) and one by model (hidden)."""
    from bokeh.models import CDSView, HoverTool
    from bokeh.plotting import figure
    from bokeh.transform import factor_cmap

    from rapids_attn.explain.explorer import model_palette

    tips = [
        ("model", "@model (@dataset)"),
        ("head", "L@layer H@head (depth @depth)"),
        ("class", "@cls (score @score)"),
        ("matched", "@matched (distance @distance)"),
    ]
    by_class, by_model = [], []
    figs = []
    pc = [f"PC{i + 1} ({100 * v:.0f}% of the variance)" for i, v in enumerate(var)]
    for name, x, y, xl, yl, w in (
        ("depth", "x", "pc1", "relative depth (a layer's heads spread by index)", pc[0], 600),
        ("pca", "pc1", "pc2", pc[0], pc[1], 500),
    ):
        p = figure(
            width=w, height=520, tools="pan,wheel_zoom,box_zoom,box_select,reset", output_backend="webgl", name=name
        )
        p.xaxis.axis_label, p.yaxis.axis_label = xl, yl
        common = {"source": points, "size": 7, "alpha": 0.75, "view": CDSView(filter=points_filter)}
        r1 = p.scatter(x, y, color=factor_cmap("cls", palette=class_colours(classes), factors=classes), **common)
        r2 = p.scatter(
            x,
            y,
            color=factor_cmap("model", palette=model_palette(len(models)), factors=models),
            visible=False,
            **common,
        )
        by_class.append(r1)
        by_model.append(r2)
        p.add_tools(HoverTool(tooltips=tips, renderers=[r1, r2]))
        figs.append(p)
    figs[0].title.text = "Depth x PC1"
    figs[1].title.text = "PC1 x PC2"
    figs[1].x_range = figs[0].y_range  # PC1 pans together in both views
    return figs, by_class, by_model


def _legend_html(classes: list[str], models: list[str]) -> str:
    from rapids_attn.explain.explorer import model_palette

    box = (
        '<span style="display:inline-block;width:11px;height:11px;border:1px solid #888;border-radius:2px;'
        'vertical-align:-1px;background:{}"></span> {}'
    )
    cls = "<br>".join(box.format(c, esc(k)) for k, c in zip(classes, class_colours(classes), strict=True))
    mod = "<br>".join(box.format(c, esc(k)) for k, c in zip(models, model_palette(len(models)), strict=False))
    return f'<div style="font-size:12px"><b>class</b><br>{cls}<br><br><b>model</b><br>{mod}</div>'


def write_explorer(a: dict, out: Path) -> Path:
    """Write the explorer page to ``out`` (through ``out.part``); returns ``out``."""
    from bokeh.document import Document
    from bokeh.embed import file_html
    from bokeh.events import DocumentReady
    from bokeh.layouts import column, row
    from bokeh.models import (
        CDSView,
        ColumnDataSource,
        CustomJS,
        DataTable,
        Div,
        IndexFilter,
        Select,
        TableColumn,
    )
    from bokeh.resources import INLINE

    heads = a["heads"]
    cols, var = explorer_columns(a)
    models = list(dict.fromkeys(cols["model"]))
    classes = class_order(heads)
    points = ColumnDataSource(cols, name="points")
    points_filter = IndexFilter(list(range(len(cols["x"]))), name="points_filter")
    figs, by_class, by_model = _views(points, points_filter, classes, models, var)

    mct = model_class_table(heads)
    tdata: dict[str, list] = {"model": [r["model"] for r in mct], "dataset": [r["dataset"] for r in mct]}
    tdata["heads"] = [r["heads"] for r in mct]
    for i, c in enumerate(classes):
        tdata[f"c{i}"] = [f"{r['counts'][c]} ({100 * r['shares'][c]:.1f}%)" for r in mct]
    table = ColumnDataSource(tdata, name="model_class")
    table_filter = IndexFilter(list(range(len(mct))), name="table_filter")
    columns = [TableColumn(field="model", title="model"), TableColumn(field="dataset", title="dataset")]
    columns += [TableColumn(field="heads", title="heads")]
    columns += [TableColumn(field=f"c{i}", title=c) for i, c in enumerate(classes)]
    data_table = DataTable(
        source=table,
        view=CDSView(filter=table_filter),
        columns=columns,
        width=1180,
        height=min(420, 30 + 26 * max(1, len(mct))),
        index_position=None,
        name="model_class_table",
    )
    model_select = Select(title="model", value="all", options=["all", *models], name="model_select")
    colour_select = Select(title="colour by", value="class", options=["class", "model"], name="colour_select")
    colour_select.js_on_change(
        "value",
        CustomJS(args={"by_class": by_class, "by_model_r": by_model, "colour_select": colour_select}, code=_COLOUR_JS),
    )
    status = Div(text=f"{len(cols['x']):,} heads shown", name="status")
    args = {
        "points": points,
        "points_filter": points_filter,
        "table": table,
        "table_filter": table_filter,
        "model_select": model_select,
        "status": status,
    }
    model_select.js_on_change("value", CustomJS(args=args, code=_FILTER_JS))
    campaign = a["doc"].get("campaign") or "campaign"
    intro = Div(
        text=f"<b>rapids_attn campaign atlas: {esc(campaign)}.</b> Every head of every merged run is a point. Left: "
        "relative depth (layer / (layers - 1); a layer's heads spread by their index) against the first principal "
        "component of the heads' profile features (the dataset means of every statistic, detector and offset profile, "
        "each z-scored over all heads of all runs); right: the first two principal components. Hover a head for its "
        "model, dataset, layer, head, long-context class and score, and the reference head it was matched to (with "
        "the distance). Choose a model to keep its heads in both views and its rows in the model x class table below; "
        "colour by class or by model. The page's address keeps the model (explorer.html#model=NAME).",
        width=1180,
    )
    legend = Div(text=_legend_html(classes, models), width=180)
    page = column(
        intro,
        row(model_select, colour_select, status),
        row(*figs, legend),
        Div(text="<b>Model x class</b>: each model's heads of each class (share of its heads)", width=1180),
        data_table,
    )
    doc = Document()
    doc.add_root(page)
    doc.js_on_event(DocumentReady, CustomJS(args=args, code=_READY_JS))
    html = file_html(doc, resources=INLINE, title=f"rapids_attn campaign atlas: {campaign}")
    part = out.with_name(out.name + ".part")
    part.write_text(html, encoding="utf-8")
    os.replace(part, out)
    return out


# ---------------------------------------------------------------------------------------------
# entry point


def write_report(atlas_dir: Path) -> list[Path]:
    """Write ``report.html`` and ``explorer.html`` into ``atlas_dir`` from its files alone; returns their paths."""
    atlas_dir = Path(atlas_dir)
    a = read_atlas(atlas_dir)
    explorer = write_explorer(a, atlas_dir / EXPLORER)
    report = atlas_dir / REPORT
    part = report.with_name(REPORT + ".part")
    part.write_text(render_report(a), encoding="utf-8")
    os.replace(part, report)
    return [report, explorer]
