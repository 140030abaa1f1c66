"""One palette for clusters in the report and the explorer, the explorer's legend and counts that follow its
filters (its filter's JavaScript run through node), and the explain stage's status lines (issue 48)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import zarr
from helpers import FULL_REPORT, make_job, pair_rows, write_jsonl
from matplotlib.colors import to_hex, to_rgb

from rapids_attn.explain import explorer, figures
from rapids_attn.explain.palette import NOISE, cluster_colour, palette
from rapids_attn.store import schema as S


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_bert_dir):
    """One small run with the report, the explorer and head views, and what the stages printed on stderr."""
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import run_job

    tmp = tmp_path_factory.mktemp("explorer")
    data = write_jsonl(tmp / "pairs.jsonl", pair_rows())
    cfg = load_job(None, raw=make_job(tmp, tiny_bert_dir, data, explain=FULL_REPORT))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        summary = run_job(cfg)
    return cfg, summary, err.getvalue()


def _doc(page: str) -> dict:
    """The Bokeh document a standalone page embeds."""
    m = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', page, re.DOTALL)
    assert m, "no embedded Bokeh document"
    return json.loads(m.group(1))


def _walk(o):
    if isinstance(o, dict):
        yield o
        for v in o.values():
            yield from _walk(v)
    elif isinstance(o, list):
        for v in o:
            yield from _walk(v)


def _page_colours(page: str) -> list[dict[int, str]]:
    """Each cluster colour map of the explorer's page (map view, atlas), {cluster id: '#rrggbb'}."""
    out = []
    for o in _walk(_doc(page)):
        if o.get("name") == "CategoricalColorMapper" and "attributes" in o:
            a = o["attributes"]
            if a["factors"] and all(re.fullmatch(r"-?\d+", f) for f in a["factors"]):  # not the models' map
                out.append({int(f): c for f, c in zip(a["factors"], a["palette"], strict=False)})
    return out


def test_neighbouring_cluster_ids_get_distinct_colours_and_noise_is_grey():
    colours = palette()
    assert len(set(colours)) == len(colours) >= 50
    for cid in range(200):  # neighbours far apart, wrapping round included
        a, b = to_rgb(cluster_colour(cid)), to_rgb(cluster_colour(cid + 1))
        assert np.linalg.norm(np.subtract(a, b)) > 0.1, (cid, cluster_colour(cid), cluster_colour(cid + 1))
    assert cluster_colour(-1) == NOISE
    grey = to_rgb(NOISE)
    assert min(np.linalg.norm(np.subtract(to_rgb(c), grey)) for c in colours) > 0.1  # no cluster looks like noise
    # a cluster's colour is its id's alone: the same whichever other clusters a view shows, in whatever order
    assert figures.cluster_colors([5, 0, -1])[0] == figures.cluster_colors([0])[0]
    assert to_hex(figures.cluster_colors([7, 3])[3]) == cluster_colour(3) == "#d62728"


def test_the_report_and_the_explorer_give_a_cluster_the_same_colour(full_run):
    cfg, summary, _ = full_run
    report = (cfg.run_dir / "report" / "index.html").read_text()
    page = (cfg.run_dir / "report" / "explorer.html").read_text()
    # the report's swatches (its index of clusters and each cluster's heading) and figures take cluster_colors
    swatches = re.findall(
        r'<span class="swatch" style="background:(#[0-9a-f]{6})"></span><a href="#cluster-(\d+)"', report
    )
    in_report = {int(cid): hexa for hexa, cid in swatches}
    ids = [c["id"] for c in summary["clusters"]["descriptions"]]
    assert sorted(in_report) == sorted(c for c in ids if c != -1) and len(in_report) == 3
    assert in_report == {c: to_hex(rgba) for c, rgba in figures.cluster_colors(in_report).items()}
    views = _page_colours(page)
    assert len(views) == 2  # the map of all maps and the head atlas
    for view in views:
        shared = set(view) & set(in_report)
        assert shared, view
        assert {c: view[c] for c in shared} == {c: in_report[c] for c in shared}
    legend = next(o for o in _walk(_doc(page)) if isinstance(o, dict) and o.get("type") == "map" and _has(o, "ids"))
    colours = dict(_entries(_entries(legend)["colours"]))
    assert {int(c): v for c, v in colours.items() if int(c) in in_report} == in_report


def _entries(m: dict) -> dict:
    return dict(m["entries"]) if isinstance(m, dict) and m.get("type") == "map" else m


def _has(m: dict, key: str) -> bool:
    return any(k == key for k, _ in m.get("entries", []))


def test_the_explain_stage_says_what_it_is_doing(full_run):
    _, _, err = full_run
    prefix = "rapids_attn: explain: "
    said = [x[len(prefix) :] for x in err.splitlines() if x.startswith(prefix)]
    steps = ["describing", "clusters against example label", "head classes", "head views", "explorer", "report"]
    ours = [x for x in said if not x.startswith(("started", "done in"))]  # the pipeline's own lines aside
    assert len(ours) == len(steps) and all(x.startswith(s) for x, s in zip(ours, steps, strict=True)), said
    assert ours[0].startswith("describing 3 clusters of ")


def _tiny_store(path, clusters: np.ndarray):
    e, n_layers, n_heads = clusters.shape
    g = zarr.open_group(str(path), mode="w")
    S.create_array(g, S.CLUSTER, clusters.shape, data=clusters.astype(np.int32))
    xy = np.random.default_rng(0).normal(size=(*clusters.shape, 2)).astype(np.float32)
    S.create_array(g, S.COORDS, xy.shape, data=xy)
    S.create_array(g, S.LAYER, (n_layers,), data=np.arange(n_layers, dtype=np.int32))
    S.create_array(g, S.HEAD, (n_heads,), data=np.arange(n_heads, dtype=np.int32))
    S.create_array(g, S.EXAMPLE_ID, (e,), data=np.array([f"e{i}" for i in range(e)]))
    return g


def _run_filter(code: str, tables, legend, hash_: str = "", **menus) -> dict:
    """Run the explorer's filter in node, on mock Bokeh models holding these columns."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("no node on PATH")
    _, mt, ht = tables
    values = {"cluster": "all", "head": "all", "model": "all"} | menus
    options = {
        "cluster": ["all", *legend["ids"]],
        "head": ["all", *ht["lh"]],
        "model": ["all", *legend["models"]],
    }
    menu = {k: {"value": values[k], "options": options[k]} for k in values}
    prog = f"""(function () {{
const maps = {{data: {json.dumps(mt)}, change: {{emit() {{}}}}}};
const heads = {{data: {json.dumps(ht)}, change: {{emit() {{}}}}}};
const maps_filter = {{indices: []}}, heads_filter = {{indices: []}};
const cluster_select = {json.dumps(menu["cluster"])}, head_select = {json.dumps(menu["head"])};
const model_select = {json.dumps(menu["model"])};
const status = {{text: ''}}, title = {{text: ''}}, legend_div = {{text: ''}};
const title_text = 'The map of all maps ({{shown}} shown)';
const legend = {json.dumps(legend)};
const location = {{hash: {json.dumps(hash_)}, pathname: '/explorer.html', search: ''}};
const history = {{replaceState(state, unused, url) {{ location.hash = url.startsWith('#') ? url : ''; }}}};
{code}
console.log(JSON.stringify({{maps: maps_filter.indices, heads: heads_filter.indices, status: status.text,
  title: title.text, legend: legend_div.text, hash: location.hash, cluster: cluster_select.value}}));
}})();"""
    out = subprocess.run([node, "-e", prog], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _legend_counts(html: str) -> dict[str, tuple[int, ...]]:
    """{'cluster 3': (maps, heads), 'base': (maps, 0), ...} from the legend's rows."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", html)
    out = {}
    for r in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", r)
        if len(cells) == 4:
            name = re.sub(r"<[^>]+>.*", "", cells[1]).strip()
            out[name] = tuple(int(x.replace(",", "") or 0) for x in cells[2:])  # a model's row counts no heads
    return out


def test_the_legend_and_the_shown_counts_follow_the_filters(tmp_path):
    clusters = np.random.default_rng(3).integers(-1, 4, size=(30, 2, 3))
    g = _tiny_store(tmp_path / "s.zarr", clusters)
    tables = explorer.explorer_tables(g, {}, None, 10_000, 0)
    _, mt, ht = tables
    ids = explorer.cluster_order(set(mt["cluster"]) | set(ht["dominant"]))
    assert ids[-1] == "-1" and ids[:-1] == sorted(ids[:-1], key=int)  # by id, noise last
    legend = explorer.legend_data(ids, {0: "a <b>bold</b> name"}, [""])
    assert legend["colours"] == {c: cluster_colour(int(c)) for c in ids}
    assert legend["names"]["0"] == "a &lt;b&gt;bold&lt;/b&gt; name"  # escaped: the legend is HTML

    every = _run_filter(explorer._READY_JS, tables, legend)
    n = len(mt["x"])
    assert len(every["maps"]) == n and every["status"] == f"{n} maps, 6 heads shown" and every["hash"] == ""
    assert every["title"] == f"The map of all maps ({n} shown)"
    counts = _legend_counts(every["legend"])
    assert counts["cluster 1"][0] == mt["cluster"].count("1") and counts["noise"][0] == mt["cluster"].count("-1")
    assert sum(m for m, _ in counts.values()) == n and sum(h for _, h in counts.values()) == 6

    one = _run_filter(explorer._FILTER_JS, tables, legend, cluster="1")
    k = mt["cluster"].count("1")
    assert 0 < k < n and len(one["maps"]) == k and one["title"] == f"The map of all maps ({k} shown)"
    assert one["status"].startswith(f"{k} maps, ") and one["hash"] == "#cluster=1"
    counts = _legend_counts(one["legend"])
    assert counts["cluster 1"][0] == k and all(m == 0 for name, (m, _) in counts.items() if name != "cluster 1")

    # the page's address chooses the filter on load: a cluster and a head
    both = _run_filter(explorer._READY_JS, tables, legend, hash_="#cluster=1&head=L1H2")
    want = [i for i, (c, lh) in enumerate(zip(mt["cluster"], mt["lh"], strict=True)) if c == "1" and lh == "L1H2"]
    assert both["cluster"] == "1" and both["maps"] == want and both["hash"] == "#cluster=1&head=L1H2"
    assert _legend_counts(both["legend"])["cluster 1"][0] == len(want)
    assert both["title"] == f"The map of all maps ({len(want)} shown)"
    # an address naming no such cluster is ignored
    assert len(_run_filter(explorer._READY_JS, tables, legend, hash_="#cluster=99")["maps"]) == n


def test_the_page_holds_the_legend_and_the_one_palette(tmp_path):
    clusters = np.random.default_rng(1).integers(-1, 12, size=(6, 2, 3))
    g = _tiny_store(tmp_path / "s.zarr", clusters)
    path = explorer.write_explorer(tmp_path, g, {}, None, 1000, 0, names={3: "three"})
    page = path.read_text()
    for name in ("maps_filter", "heads_filter", "cluster_select", "head_select", "legend", "document_ready"):
        assert name in page
    for view in _page_colours(page):
        assert view == {c: cluster_colour(c) for c in view} and view[-1] == NOISE


def test_with_compared_models_the_legend_counts_each_models_maps(tmp_path):
    """The compare stage's explorer: every model's maps in one clustering, a model row per model in the legend, and
    its count following the model menu; the learn stage's cluster names are not shown for the shared clustering."""
    learn = np.random.default_rng(4).integers(0, 3, size=(5, 2, 2))
    other = _tiny_store(tmp_path / "other.zarr", learn)
    g = _tiny_store(tmp_path / "s.zarr", learn)
    shared = np.random.default_rng(5).integers(0, 4, size=(2, *learn.shape))
    S.create_array(g, S.COMPARE_CLUSTER, shared.shape, data=shared.astype(np.int32))
    xy = np.random.default_rng(6).normal(size=(*shared.shape, 2)).astype(np.float32)
    S.create_array(g, S.COMPARE_COORDS, xy.shape, data=xy)
    g.attrs[S.Attr.COMPARE] = {"job_model": "tuned", "compared": [{"label": "base", "store": str(other.store.root)}]}
    g.attrs[S.complete_attr("compare")] = True
    tables = explorer.explorer_tables(g, {}, None, 10_000, 0)
    models, mt, ht = tables
    assert [m for m, _ in models] == ["tuned", "base"] and len(mt["x"]) == 2 * learn.size
    assert mt["cluster"] == [str(c) for c in shared.reshape(2, -1).ravel().tolist()]
    ids = explorer.cluster_order(set(mt["cluster"]) | set(ht["dominant"]))
    legend = explorer.legend_data(ids, None, ["tuned", "base"])
    assert np.linalg.norm(np.subtract(*[to_rgb(c) for c in legend["model_colours"][:2]])) > 0.3  # not two blues
    one = _run_filter(explorer._READY_JS, tables, legend, hash_="#model=base")
    assert len(one["maps"]) == learn.size and one["hash"] == "#model=base"
    rows = _legend_counts(one["legend"])
    assert rows["base"][0] == learn.size and rows["tuned"][0] == 0
    assert sum(rows[f"cluster {c}"][0] for c in ids) == learn.size
    page = explorer.write_explorer(tmp_path, g, {}, None, 10_000, 0, names={0: "learn's cluster 0"}).read_text()
    assert "learn&#x27;s cluster 0" not in page and "learn's cluster 0" not in page  # another clustering's ids
    assert "maps_by_model" in page and '"base"' in page
