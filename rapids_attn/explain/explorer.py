"""The interactive explorer: ``report/explorer.html``, one standalone file (Bokeh, scripts inlined, no server,
no network) beside the static report.

Two linked views:

- **the map of all maps**: every map's 2-D coordinates from the learn stage (UMAP, else the first two
  principal components), a seeded sample of at most ``explain.explorer_sample`` maps, coloured by cluster;
  hovering a point shows its thumbnail, layer, head, cluster, pattern label and the example's text;
- **the head atlas**: the heads placed by the relevance stage's atlas (Clark et al.'s distance, MDS) when it
  ran, else on a layer x head grid; hovering shows the head's dominant map cluster, atlas cluster and related
  heads.

Both views colour a cluster as the report's figures do (:mod:`rapids_attn.explain.palette`: by its id, noise grey).
Choosing a cluster or a head (the two menus, or a click on a head in the atlas) filters both views: the map
keeps the chosen cluster's and head's maps, the atlas the heads whose dominant cluster is the chosen one. The
legend beside them gives each cluster's colour, name (its description's first clause) and what is shown of it:
its maps in the map view and the heads it dominates in the atlas; those counts, the map view's "N shown" and the
status line follow the filters. The page's address keeps the choice (``explorer.html#cluster=3&head=L2H5``), and
a page opened at such an address starts filtered.

Where the compare stage ran, the map view shows every compared model's maps of the same sampled examples, layers
and heads, placed and clustered by the compare stage's one clustering of all models (so a cluster means the same
in every model, and the heads' dominant clusters are the job's model's in it); a third menu keeps one model's maps
and a fourth colours the points by cluster or by model; the legend then counts each model's maps too.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import numpy as np

FILE = "explorer.html"
#: characters of the example's text shown on hover
TEXT_CHARS = 160


def _png(thumb: np.ndarray) -> str:
    """[ty, tx] values in [0, 1] -> a data URI of a grey PNG (brightest = the map's maximum)."""
    from PIL import Image

    v = thumb / max(float(thumb.max()), 1e-12)
    buf = io.BytesIO()
    Image.fromarray(np.round(255 * np.sqrt(v)).astype(np.uint8), mode="L").save(buf, format="PNG", optimize=False)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def sample_maps(shape: tuple[int, int, int], limit: int, seed: int) -> np.ndarray:
    """Flat indices into [example, layer, head] of at most ``limit`` maps, a seeded sample, sorted."""
    total = int(np.prod(shape))
    if total <= limit:
        return np.arange(total)
    return np.sort(np.random.default_rng(seed).choice(total, size=limit, replace=False))


def explorer_models(g) -> list[tuple[str, object]]:
    """(label, store group) of each model the map view shows: the compare stage's models, the job's first, when it
    completed (and every compared store is still where it wrote it), else the job's model alone (label "")."""
    import zarr

    from rapids_attn.store import schema as S

    info = g.attrs.get(S.Attr.COMPARE) if g.attrs.get(S.complete_attr("compare")) else None
    if not info or S.COMPARE_COORDS not in g:
        return [("", g)]
    out = [(str(info["job_model"]), g)]
    for entry in info.get("compared", []):
        try:
            out.append((str(entry["label"]), zarr.open_group(entry["store"], mode="r")))
        except (OSError, ValueError, KeyError, FileNotFoundError):
            return [("", g)]
    return out


def map_limit(g, limit: int) -> int:
    """Maps sampled per model, so that all models' together are at most ``limit``."""
    return max(1, limit // len(explorer_models(g)))


def map_table(g, texts: dict[int, str], idx: np.ndarray, model: int | None = None, st=None) -> dict[str, list]:
    """The map view's columns for the flat indices ``idx`` (example-major over the store's kept layers and heads):
    the learn stage's coordinates and clusters, or with ``model`` (an index into the compare stage's models, whose
    store ``st`` holds its thumbnails) that model's maps in the compare stage's shared clustering."""
    from rapids_attn.store import schema as S
    from rapids_attn.store.zarr_store import decode_thumbnails

    l_n, h_n = g[S.CLUSTER].shape[1:]
    e, rest = np.divmod(idx, l_n * h_n)
    li, hi = np.divmod(rest, h_n)
    layers, heads = g[S.LAYER][:], g[S.HEAD][:]
    if model is None:
        coords, cluster = g[S.COORDS], g[S.CLUSTER]
    else:
        coords, cluster = _Row(g[S.COMPARE_COORDS], model), _Row(g[S.COMPARE_CLUSTER], model)
    st = g if st is None else st
    xy = np.zeros((len(idx), 2), np.float32)
    cl = np.zeros(len(idx), np.int64)
    pattern = np.full(len(idx), "", dtype=object)
    thumbs = [""] * len(idx)
    classes = list(g.attrs.get(S.Attr.PATTERN_CLASSES) or [])
    has_thumbs = S.THUMBNAILS in g
    for ex in np.unique(e):  # one read per example: its chunk row holds every layer and head
        rows = np.flatnonzero(e == ex)
        c_xy = coords[int(ex)]
        xy[rows] = c_xy[li[rows], hi[rows]]
        cl[rows] = cluster[int(ex)][li[rows], hi[rows]]
        if classes and S.PATTERN in g:
            p = g[S.PATTERN][int(ex)]
            pattern[rows] = [classes[int(k)] if 0 <= int(k) < len(classes) else "" for k in p[li[rows], hi[rows]]]
        if has_thumbs and S.THUMBNAILS in st:
            t = decode_thumbnails(st[S.THUMBNAILS][int(ex)])
            for r in rows:
                thumbs[r] = _png(t[li[r], hi[r]])
    ids = g[S.EXAMPLE_ID][:]
    return {
        "x": xy[:, 0].tolist(),
        "y": xy[:, 1].tolist(),
        "layer": layers[li].astype(int).tolist(),
        "head": heads[hi].astype(int).tolist(),
        "lh": [f"L{int(a)}H{int(b)}" for a, b in zip(layers[li], heads[hi], strict=True)],
        "cluster": [str(int(c)) for c in cl],
        "pattern": [str(p) for p in pattern],
        "example": [str(ids[int(x)]) for x in e],
        "text": [texts.get(int(x), "")[:TEXT_CHARS] for x in e],
        "thumb": thumbs,
    }


class _Row:
    """One model's slice of a compare array, read one example at a time as the learn stage's arrays are."""

    def __init__(self, array, model: int):
        self.array, self.model = array, model

    def __getitem__(self, ex: int):
        return self.array[self.model, ex]


def _fmt(v) -> str:
    return "n/a" if v is None else f"{float(v):.3g}"


def head_table(g, atlas: dict | None, cluster: np.ndarray | None = None) -> dict[str, list]:
    """The atlas view's columns: every kept head, placed by the relevance stage's atlas when it has the head,
    else at (head, -layer); its dominant map cluster and share, atlas cluster, related heads, and the measures
    :func:`rapids_attn.explain.relevance.place_heads` joined to it (consistency, importance, detector scores)."""
    from rapids_attn.relevance.summary import dominant_map_cluster
    from rapids_attn.store import schema as S

    layers, heads = g[S.LAYER][:], g[S.HEAD][:]
    dom, share = dominant_map_cluster(np.asarray(g[S.CLUSTER][:] if cluster is None else cluster))
    placed = {(h["layer"], h["head"]): h for h in (atlas or {}).get("heads", [])}
    keys = ("x", "y", "lh", "dominant", "share", "atlas_cluster", "related", "consistency", "importance", "detectors")
    cols: dict[str, list] = {k: [] for k in keys}
    for i, layer in enumerate(layers):
        for j, head in enumerate(heads):
            k = i * len(heads) + j
            a = placed.get((int(layer), int(head)))
            cols["x"].append(float(a["x"]) if a else float(head))
            cols["y"].append(float(a["y"]) if a else -float(layer))
            cols["lh"].append(f"L{int(layer)}H{int(head)}")
            cols["dominant"].append(str(int(dom[k])))
            cols["share"].append(round(float(share[k]), 3))
            cols["atlas_cluster"].append(str(a["atlas_cluster"]) if a else "")
            cols["related"].append(", ".join(f"L{r[0]}H{r[1]}" for r in a["related"]) if a else "")
            a = a or {}
            cols["consistency"].append(_fmt(a.get("consistency")))
            cols["importance"].append(_fmt(a.get("importance")))
            det = {k: v for k, v in (a.get("detectors") or {}).items() if v is not None}
            cols["detectors"].append(", ".join(f"{k} {v:.2f}" for k, v in sorted(det.items(), key=lambda kv: -kv[1])))
    return cols


#: the filter: both views keep what the menus choose; the "N shown" title, the status line and the legend's
#: counts follow, and the page's address (#cluster=3&head=L2H5&model=base) says what is chosen
_FILTER_JS = """
const c = cluster_select.value, h = head_select.value, m = model_select.value;
const fmt = (n) => n.toLocaleString('en-US');
const d = maps.data, keep = [], n_maps = {}, n_model = {};
for (let i = 0; i < d.cluster.length; i++) {
  if ((c === 'all' || d.cluster[i] === c) && (h === 'all' || d.lh[i] === h) && (m === 'all' || d.model[i] === m)) {
    keep.push(i);
    n_maps[d.cluster[i]] = (n_maps[d.cluster[i]] || 0) + 1;
    n_model[d.model[i]] = (n_model[d.model[i]] || 0) + 1;
  }
}
maps_filter.indices = keep;
const a = heads.data, shown = [], n_heads = {};
for (let i = 0; i < a.lh.length; i++) {
  if ((c === 'all' || a.dominant[i] === c) && (h === 'all' || a.lh[i] === h)) {
    shown.push(i);
    n_heads[a.dominant[i]] = (n_heads[a.dominant[i]] || 0) + 1;
  }
}
heads_filter.indices = shown;
status.text = fmt(keep.length) + ' maps, ' + fmt(shown.length) + ' heads shown';
title.text = title_text.replace('{shown}', fmt(keep.length));
const box = (colour) => '<span style="display:inline-block;width:11px;height:11px;border:1px solid #888;'
  + 'border-radius:2px;vertical-align:-1px;background:' + colour + '"></span>';
const row = (dim, cells) => '<tr style="opacity:' + (dim ? 0.4 : 1) + '">' + cells.join('') + '</tr>';
const num = (n) => '<td style="text-align:right;padding:0 4px">' + fmt(n || 0) + '</td>';
let html = '<table style="border-collapse:collapse;font-size:12px;line-height:1.35">'
  + '<tr style="color:#555"><th></th><th style="text-align:left">cluster</th>'
  + '<th style="text-align:right;padding:0 4px" title="maps shown in the map view">maps</th>'
  + '<th style="text-align:right;padding:0 4px" title="heads shown in the atlas whose dominant cluster it is">'
  + 'heads</th></tr>';
for (const k of legend.ids) {
  const name = '<td style="padding:0 4px"' + (legend.names[k] ? ' title="' + legend.names[k] + '"' : '') + '>'
    + legend.labels[k] + (legend.names[k] ? ' <span style="color:#666">' + legend.short[k] + '</span>' : '') + '</td>';
  html += row(!n_maps[k] && !n_heads[k], ['<td>' + box(legend.colours[k]) + '</td>', name, num(n_maps[k]),
    num(n_heads[k])]);
}
if (legend.models.length > 1) {
  html += '<tr style="color:#555"><th></th><th style="text-align:left;padding-top:6px">model</th>'
    + '<th style="text-align:right;padding:6px 4px 0">maps</th><th></th></tr>';
  for (let j = 0; j < legend.models.length; j++)
    html += row(!n_model[legend.models[j]], ['<td>' + box(legend.model_colours[j]) + '</td>',
      '<td style="padding:0 4px">' + legend.model_labels[j] + '</td>', num(n_model[legend.models[j]]), '<td></td>']);
}
legend_div.text = html + '</table>';
const q = [['cluster', c], ['head', h], ['model', m]].filter((kv) => kv[1] !== 'all')
  .map((kv) => kv[0] + '=' + encodeURIComponent(kv[1])).join('&');
try { history.replaceState(null, '', q ? '#' + q : location.pathname + location.search); } catch (e) {}
maps.change.emit(); heads.change.emit();
"""

#: on load: the menus take what the page's address chooses (explorer.html#cluster=3&head=L2H5), then the filter runs
_READY_JS = (
    """
const wanted = new URLSearchParams(location.hash.slice(1));
for (const [key, menu] of [['cluster', cluster_select], ['head', head_select], ['model', model_select]]) {
  const v = wanted.get(key);
  if (v !== null && menu.options.includes(v)) menu.value = v;
}
"""
    + _FILTER_JS
)

_TAP_JS = """
const s = heads.selected.indices;
if (s.length) head_select.value = heads.data.lh[s[0]];
"""

#: characters of a cluster's description beside its name in the legend (its first clause; the whole on hover)
NAME_CHARS = 48


def cluster_order(ids) -> list[str]:
    """Cluster ids (strings) in the menus' and the legend's order: by id, noise (-1) last."""
    return sorted({str(c) for c in ids}, key=lambda c: (int(c) == -1, int(c)))


def legend_data(clusters: list[str], names: dict[int, str] | None, labels: list[str]) -> dict:
    """What the legend shows, the filter's JavaScript counting the rest: each cluster's colour (the one palette,
    :mod:`rapids_attn.explain.palette`), name and description (HTML-escaped here), and each model's colour."""
    import html

    from rapids_attn.explain.formatting import cluster_name
    from rapids_attn.explain.palette import cluster_colour

    names = names or {}
    full = {c: html.escape(names.get(int(c)) or "", quote=True) for c in clusters}
    short = {}  # the description's first clause (describe: the pattern type, then the signature), cut short
    for c in clusters:
        n = (names.get(int(c)) or "").split("; ")[0]
        short[c] = html.escape(n if len(n) <= NAME_CHARS else n[: NAME_CHARS - 1] + "\u2026")
    return {
        "ids": clusters,
        "colours": {c: cluster_colour(int(c)) for c in clusters},
        "labels": {c: cluster_name(int(c)) for c in clusters},
        "names": full,
        "short": short,
        "models": labels,
        "model_labels": [html.escape(x) for x in labels],
        "model_colours": model_palette(len(labels)),
    }


def model_palette(n: int) -> list[str]:
    """A colour per compared model, in the models' order: Okabe and Ito's colour-blind-safe palette (Bokeh's
    ``Colorblind``), so that neighbouring models differ (Category20's neighbours are one hue, dark and light)."""
    from bokeh.palettes import Colorblind

    return list((Colorblind[8] * (n // 8 + 1))[: max(n, 3)])


def explorer_tables(g, texts: dict[int, str], atlas: dict | None, limit: int, seed: int):
    """The models the map view shows, and the two views' columns: ``(models, maps, heads)``."""
    from rapids_attn.store import schema as S

    models = explorer_models(g)
    idx = sample_maps(g[S.CLUSTER].shape, map_limit(g, limit), seed)
    if len(models) == 1:
        mt = map_table(g, texts, idx)
        mt["model"] = [""] * len(idx)
        return models, mt, head_table(g, atlas)
    # every model's maps of the same sample, in the compare stage's shared clustering
    parts = [map_table(g, texts, idx, m, st) | {"model": [label] * len(idx)} for m, (label, st) in enumerate(models)]
    mt = {k: [v for p in parts for v in p[k]] for k in parts[0]}
    keep = [i for i, x in enumerate(mt["x"]) if np.isfinite(x)]  # the probes are not in the shared clustering
    mt = {k: [v[i] for i in keep] for k, v in mt.items()}
    return models, mt, head_table(g, atlas, g[S.COMPARE_CLUSTER][0])


def write_explorer(
    out_dir: Path,
    g,
    texts: dict[int, str],
    atlas: dict | None,
    limit: int,
    seed: int,
    names: dict[int, str] | None = None,
) -> Path:
    """Write ``out_dir/explorer.html``; returns its path. ``names``: a description of each of the learn stage's
    clusters by id, shown in the legend (not where the compare stage's clustering is shown: its ids are others)."""
    from bokeh.document import Document
    from bokeh.embed import file_html
    from bokeh.events import DocumentReady
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, CustomJS, Div, IndexFilter, Select, TapTool
    from bokeh.resources import INLINE

    models, mt, ht = explorer_tables(g, texts, atlas, limit, seed)
    n_points = len(mt["x"])
    maps = ColumnDataSource(mt, name="maps")
    heads = ColumnDataSource(ht, name="heads")
    maps_filter = IndexFilter(list(range(n_points)), name="maps_filter")
    heads_filter = IndexFilter(list(range(len(ht["lh"]))), name="heads_filter")
    clusters = cluster_order(set(mt["cluster"]) | set(ht["dominant"]))
    labels = [label for label, _ in models]
    title_text = "The map of all maps ({shown} shown)" + (
        f": {len(models)} models in one clustering" if len(models) > 1 else ""
    )
    p = _map_view(maps, maps_filter, clusters, labels, title_text.replace("{shown}", f"{n_points:,}"))
    q = _atlas_view(heads, heads_filter, clusters, atlas)
    cluster_select = Select(title="cluster", value="all", options=["all", *clusters], name="cluster_select")
    head_select = Select(title="head", value="all", options=["all", *ht["lh"]], name="head_select")
    model_select = Select(title="model", value="all", options=["all", *labels], name="model_select")
    colour_select = Select(title="colour by", value="cluster", options=["cluster", "model"], name="colour_select")
    by_cluster, by_model = p.select(name="maps_points")[0], p.select(name="maps_by_model")[0]
    colour_select.js_on_change(
        "value",
        CustomJS(
            args={"by_cluster": by_cluster, "by_model": by_model, "colour_select": colour_select},
            code="by_model.visible = colour_select.value === 'model'; by_cluster.visible = !by_model.visible;",
        ),
    )
    model_select.visible = colour_select.visible = len(models) > 1
    status = Div(text=f"{n_points:,} maps, {len(ht['lh']):,} heads shown", name="status")
    legend_div = Div(text="", name="legend", width=260, styles={"max-height": "620px", "overflow-y": "auto"})
    args = {
        "maps": maps,
        "heads": heads,
        "maps_filter": maps_filter,
        "heads_filter": heads_filter,
        "cluster_select": cluster_select,
        "head_select": head_select,
        "model_select": model_select,
        "status": status,
        "title": p.title,
        "title_text": title_text,
        "legend_div": legend_div,
        "legend": legend_data(clusters, names if len(models) == 1 else None, labels),
    }
    cb = CustomJS(args=args, code=_FILTER_JS)
    cluster_select.js_on_change("value", cb)
    head_select.js_on_change("value", cb)
    model_select.js_on_change("value", cb)
    heads.selected.js_on_change("indices", CustomJS(args={"heads": heads, "head_select": head_select}, code=_TAP_JS))
    q.select_one(TapTool).renderers = [q.select(name="head_points")[0]]
    intro = Div(
        text="<b>rapids_attn explorer.</b> Hover a point for its thumbnail, layer, head, cluster, pattern and text. "
        "Choose a cluster or a head (or click a head in the atlas) to filter both views; the legend counts what is "
        "shown, and the page's address keeps the choice (explorer.html#cluster=3&amp;head=L2H5)."
        + (
            " The maps of every compared model are shown, in one clustering of all of them: choose a model to keep its"
            " maps, or colour the points by model."
            if len(models) > 1
            else ""
        )
    )
    page = column(intro, row(cluster_select, head_select, model_select, colour_select, status), row(p, q, legend_div))
    doc = Document()
    doc.add_root(page)
    doc.js_on_event(DocumentReady, CustomJS(args=args, code=_READY_JS))  # the legend, and a filter in the address
    html = file_html(doc, resources=INLINE, title="rapids_attn explorer")
    out = Path(out_dir) / FILE
    part = out.with_name(FILE + ".part")
    part.write_text(html, encoding="utf-8")
    os.replace(part, out)  # a killed run leaves no half-written page under the real name
    return out


def _map_view(maps, maps_filter, clusters: list[str], labels: list[str], title: str):
    """The map of all maps: two renderers on the one filter, coloured by cluster (shown) and by model (hidden)."""
    from bokeh.models import CDSView, HoverTool
    from bokeh.plotting import figure
    from bokeh.transform import factor_cmap

    from rapids_attn.explain.palette import cluster_colour

    tips = """<div style="width:260px"><img src="@thumb" width="64" height="64"
      style="image-rendering:pixelated;float:left;margin-right:6px;border:1px solid #ccc">
      <b>@lh</b> @model cluster @cluster<br>pattern: @pattern<br>example @example<br>
      <span style="font-size:10px;color:#555">@text</span></div>"""
    p = figure(
        title=title,
        width=660,
        height=620,
        tools="pan,wheel_zoom,box_zoom,reset",
        output_backend="webgl",  # tens of thousands of points pan and zoom smoothly on the GPU's canvas
    )
    points = {"source": maps, "size": 4, "alpha": 0.6}  # each renderer with a view of its own on the one filter
    colour = factor_cmap("cluster", palette=[cluster_colour(int(c)) for c in clusters], factors=clusters)
    p.scatter("x", "y", color=colour, name="maps_points", view=CDSView(filter=maps_filter), **points)
    p.scatter(
        "x",
        "y",
        color=factor_cmap("model", palette=model_palette(len(labels)), factors=labels),
        name="maps_by_model",
        visible=False,
        view=CDSView(filter=maps_filter),
        **points,
    )
    p.add_tools(HoverTool(tooltips=tips, renderers=p.renderers))
    return p


def _atlas_view(heads, heads_filter, clusters: list[str], atlas: dict | None):
    """The head atlas: each head coloured by its dominant map cluster (the map view's colours), its name beside it."""
    from bokeh.models import CDSView, HoverTool
    from bokeh.plotting import figure
    from bokeh.transform import factor_cmap

    from rapids_attn.explain.palette import cluster_colour

    source_label = (
        "relevance stage: Jensen-Shannon distance, MDS"
        if atlas
        else "layer x head grid (run the relevance stage for the atlas)"
    )
    q = figure(title=f"Head atlas ({source_label})", width=460, height=620, tools="pan,wheel_zoom,reset,tap")
    q.scatter(
        "x",
        "y",
        source=heads,
        view=CDSView(filter=heads_filter),
        size=12,
        alpha=0.85,
        color=factor_cmap("dominant", palette=[cluster_colour(int(c)) for c in clusters], factors=clusters),
        name="head_points",
    )
    q.text("x", "y", text="lh", source=heads, view=CDSView(filter=heads_filter), text_font_size="7pt", x_offset=6)
    q.add_tools(
        HoverTool(
            tooltips=[
                ("head", "@lh"),
                ("dominant map cluster", "@dominant (@share of its maps)"),
                ("atlas cluster", "@atlas_cluster"),
                ("related heads", "@related"),
                ("consistency", "@consistency"),
                ("importance", "@importance"),
                ("detectors", "@detectors"),
            ],
            renderers=[q.select(name="head_points")[0]],
        )
    )
    return q
