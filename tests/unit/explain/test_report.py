"""The HTML report (figures, escaping, atomic writes) and the offline BertViz head views."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from rapids_attn.explain import figures, formatting, report
from rapids_attn.explain.findings import (
    ClusterFinding,
    ClusteringOverview,
    ExemplarRef,
    FigureArrays,
    Findings,
    GroupShare,
    HeadDetectors,
    HeadShare,
    HeadTable,
    KSweep,
    LayerShare,
    MetadataFindings,
    MetadataTest,
    RunOverview,
    ScatterSample,
    SignatureItem,
)
from rapids_attn.explain.report import write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert('x')</script>"
STATS = ["entropy", "entropy_norm", "first", "sep", "punct", "self", "prev", "next", "distance", "max"]


def fake_overview(total: int) -> RunOverview:
    return RunOverview(
        model={"name": "tiny-bert", "n_layers": 2, "n_heads": 3},
        data={"path": "/data/pairs.jsonl", "format": "jsonl"},
        counts={"examples": 10, "maps": total, "layers": 2, "heads": 3, "truncated_examples": 0, "mean_tokens": 21.5},
        backend={
            "extract_devices": ["cpu"],
            "learn": "sklearn",
            "runtime": {"cluster": "local", "n_workers": 1, "dashboard": "http://127.0.0.1:8787/status"},
        },
        seconds={"preflight": 1.0, "extract": 45.6, "learn": 2.0, "explain": 0.1},
        clustering=ClusteringOverview(
            coords="umap", method="kmeans", n_clusters=3, silhouette=0.22, noise_share=0.0, embedder="pooled"
        ),
    )


def fake_describe(thumbs: bool = True, noise: bool = False) -> tuple[RunOverview, Findings, FigureArrays]:
    """A describe() result for 3 clusters (plus noise if asked) over 2 layers x 3 heads, and its run overview."""
    rng = np.random.default_rng(0)
    layers, heads = [0, 1], [0, 1, 2]
    ids = [2, 0, 1] + ([-1] if noise else [])
    sizes = [30, 20, 10] + ([4] if noise else [])
    total = sum(sizes)
    groups = ["Normans", EVIL, "Tide & <pools>", "Normans"]
    clusters = []
    for k, (cid, size) in enumerate(zip(ids, sizes)):
        clusters.append(
            ClusterFinding(
                id=cid,
                size=size,
                share=size / total,
                summary=f"attends to [SEP]/EOS: 0.{k + 5}1 vs 0.18 overall; low entropy <{k}>",
                signature=[
                    SignatureItem(stat="sep", label="attends to [SEP]/EOS", mean=0.71, overall=0.18, z=2.3),
                    SignatureItem(stat="entropy", label="entropy", mean=0.9, overall=2.1, z=-1.7),
                ],
                means={s: float(rng.uniform(0, 2)) for s in STATS},
                top_heads=[HeadShare(layer=1, head=k % 3, share_of_head=0.98, share_of_cluster=0.4)],
                top_layers=[LayerShare(layer=1, share_of_cluster=0.6), LayerShare(layer=0, share_of_cluster=0.4)],
                dominant_description=f"layers 1-{k}; heads 1.{k}, 0.2",
                groups=GroupShare(top=groups[k], share=0.12, overall_share=0.08, dominated=k == 1),
                labels={"answerable": 0.48, "impossible": 0.52},
                patterns={},
                pattern=None,
                exemplar_examples=[ExemplarRef(example_index=1, example_id="q1", layer=1, head=k % 3)],
            )
        )
    det = {"prev": np.full((2, 3), 0.3), "dup": np.full((2, 3), 0.2), "induction": np.full((2, 3), np.nan)}
    findings = Findings(
        layers=layers,
        heads=heads,
        stat_names=STATS,
        stat_labels={s: f"label of {s}" for s in STATS},
        global_means={s: float(rng.uniform(0, 2)) for s in STATS},
        clusters=clusters,
        heads_table=HeadTable(
            dominant_cluster=np.array([[2, 0, 1], [2, 2, -1 if noise else 0]]),
            consistency=np.array([[0.9, 0.5, 0.1], [1.0, 0.0, 0.33]]),
        ),
        metadata=MetadataFindings(
            # explain.permutations: 0, so only the per-map chi-square p
            label=MetadataTest(
                mutual_info=0.02,
                nmi=0.01,
                p_permutation=None,
                permutations=0,
                chi2=12.3,
                chi2_p_maps=0.004,
                dof=2,
                n_maps=total,
                n_values=2,
            ),
            # a permutation p over examples beside the per-map chi-square p
            group=MetadataTest(
                mutual_info=0.001,
                nmi=0.001,
                p_permutation=0.52,
                permutations=200,
                chi2=1.3,
                chi2_p_maps=0.001,
                dof=4,
                n_maps=total,
                n_values=3,
            ),
            probe_examples_excluded=0,
        ),
        warnings=[f"cluster 0: 61% of its maps come from group '{EVIL}' (8% overall): a trivial cluster?"],
        k_sweep=KSweep(
            k=[2, 3, 4, 5],
            inertia=[100.0, 70.0, 60.0, 55.0],
            silhouette=[0.3, 0.22, 0.2, None],
            best_silhouette_k=2,
            n=60,
            chosen=3,
        ),
        detectors=HeadDetectors(names=list(det), scores=det, examples={"prev": 10, "dup": 4, "induction": 0}),
    )
    K, m, t, n = len(clusters), 4, 8, 500
    ex = rng.random((K, m, t, t), dtype=np.float32)
    ex[0, 3] = np.nan  # a cluster with fewer exemplars than slots
    arrays = FigureArrays(
        mean_thumbs=rng.random((K, t, t), dtype=np.float32) if thumbs else None,
        exemplar_thumbs=ex if thumbs else None,
        exemplar_info=[[(i, 1, j % 3) for i in range(m)] for j in range(K)],
        occupancy=rng.random((K, 2, 3), dtype=np.float32),
        scatter=ScatterSample(
            x=rng.normal(size=n).astype(np.float32),
            y=rng.normal(size=n).astype(np.float32),
            cluster=rng.choice(ids, size=n).astype(np.int32),
            layer=rng.integers(0, 2, size=n).astype(np.int16),
        ),
        head_detectors=np.stack(list(det.values()), axis=-1).astype(np.float32),
    )
    return fake_overview(total), findings, arrays


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs: list[str] = []
        self.scripts: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src"))
        if tag == "script":
            self.scripts.append(a.get("src"))


def _parse(text: str) -> _Collect:
    p = _Collect()
    p.feed(text)
    return p


def _assert_png(path: Path):
    import matplotlib.image as mpimg

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def _section(page: str, anchor: str) -> str:
    start = page.index(f'id="{anchor}"')
    end = page.find('<section class="cluster"', start + 1)
    return page[start : end if end > 0 else len(page)]


@pytest.mark.parametrize("noise", [False, True])
def test_report_complete_and_self_contained(tmp_path, noise):
    overview, f, arrays = fake_describe(noise=noise)
    index = write_report(tmp_path, overview, f, arrays, None)
    assert index == tmp_path / "report" / "index.html" and index.is_file()
    page = index.read_text(encoding="utf-8")
    parsed = _parse(page)
    # every image is a relative path to a real PNG matplotlib can read: two scatters, the grid, the
    # detectors, occupancy and montage per cluster, and the k sweep
    assert len(parsed.imgs) == 2 + 1 + 1 + 2 * len(f.clusters) + 1
    for src in parsed.imgs:
        assert not src.startswith(("/", "http", "data:")), src
        _assert_png(index.parent / src)
    # static and offline: no scripts, nothing remote
    assert parsed.scripts == []
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(//|[a-z]+:)""", page)
    # each cluster section carries its own summary line and dominant description
    for c in f.clusters:
        sec = _section(page, formatting.anchor(c.id))
        assert html.escape(c.summary) in sec
        assert html.escape(c.dominant_description) in sec
    # warnings are visible, and strings from data are escaped
    assert 'id="warnings"' in page and "61% of its maps come from group" in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "Tide &amp; &lt;pools&gt;" in page
    # metadata verdicts at p < 0.01, and the k sweep
    meta = page[page.index('id="metadata"') :]
    label_part, group_part = meta.split("Cluster vs example group")
    assert "is <b>stronger than chance</b> at p &lt; 0.01 (p = 0.004)" in label_part  # no shuffles: chi-square
    assert "Chi-square test of independence over maps" in label_part
    assert "is <b>not stronger than chance</b> at p &lt; 0.01 (p = 0.52)" in group_part  # permutation p wins
    assert 'id="k-sweep"' in page
    # nothing staged is left behind
    assert not [p for p in (tmp_path / "report").iterdir() if p.name.startswith(".")]


def test_report_without_thumbnails_or_sweep(tmp_path):
    overview, f, arrays = fake_describe(thumbs=False)
    f.k_sweep = None
    f.metadata = MetadataFindings(label=None, group=None, probe_examples_excluded=0)
    f.warnings = []
    index = write_report(tmp_path, overview, f, arrays, None)
    page = index.read_text(encoding="utf-8")
    for src in _parse(page).imgs:
        _assert_png(index.parent / src)
    assert not list(index.parent.glob("montage_*.png"))
    assert "No thumbnails were kept" in page
    assert 'id="k-sweep"' not in page and 'id="warnings"' not in page
    assert "Not tested: the data has no labels" in page and "Not tested: the data has no groups" in page


def test_report_says_when_permutations_cannot_reach_the_threshold(tmp_path):
    overview, f, arrays = fake_describe()
    f.metadata.group.p_permutation, f.metadata.group.permutations = 1 / 51, 50
    page = write_report(tmp_path, overview, f, arrays, None).read_text(encoding="utf-8")
    assert "smallest reachable p is 0.0196" in page and "raise explain.permutations" in page


def test_report_links_existing_head_views_only(tmp_path):
    overview, f, arrays = fake_describe()
    hv = tmp_path / "report" / "headviews"
    hv.mkdir(parents=True)
    (hv / "cluster2_ex0.html").write_text("<html></html>")
    index = write_report(
        tmp_path,
        overview,
        f,
        arrays,
        {2: ["headviews/cluster2_ex0.html"], 0: ["headviews/missing.html"], 1: ["../../etc/passwd"]},
    )
    page = index.read_text(encoding="utf-8")
    assert 'href="headviews/cluster2_ex0.html"' in page
    assert "layer 1 head 0, example q1" in _section(page, formatting.anchor(2))  # named by its exemplar
    assert "missing.html" not in page and "passwd" not in page
    assert (hv / "cluster2_ex0.html").is_file()  # rewriting the report leaves head views alone


def test_no_report_when_a_figure_fails(tmp_path, monkeypatch):
    overview, f, arrays = fake_describe()
    write_report(tmp_path, overview, f, arrays, None)  # an earlier, complete report ...
    assert (tmp_path / "report" / "index.html").is_file()

    def boom(*args, **kwargs):
        raise RuntimeError("figure failed")

    monkeypatch.setattr(figures, "montage_png", boom)
    with pytest.raises(RuntimeError, match="figure failed"):
        write_report(tmp_path, overview, f, arrays, None)
    # ... is not left looking complete, and no staging folder survives
    assert not list(tmp_path.rglob("index.html"))
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(report.STAGING_PREFIX + "*"))
    assert not [p for p in (tmp_path / "report").iterdir() if p.is_dir()]


def test_figures_return_names_of_valid_pngs(tmp_path):
    _, f, arrays = fake_describe(noise=True)
    names = [
        figures.scatter_png(tmp_path, arrays.scatter, "cluster"),
        figures.scatter_png(tmp_path, arrays.scatter, "layer"),
        figures.dominant_grid_png(tmp_path, f.heads_table, [c.id for c in f.clusters]),
        figures.occupancy_png(tmp_path, 0, arrays.occupancy[0], f.layers, f.heads),
        figures.montage_png(tmp_path, 0, arrays.mean_thumbs[0], arrays.exemplar_thumbs[0], arrays.exemplar_info[0]),
        figures.k_sweep_png(tmp_path, f.k_sweep),
        figures.detectors_png(tmp_path, f.detectors.scores, f.detectors.names, f.layers, f.heads),
    ]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name
        _assert_png(tmp_path / name)
        assert (tmp_path / name).stat().st_size < 300_000
    with pytest.raises(ValueError):
        figures.scatter_png(tmp_path, arrays.scatter, "head")


def test_head_view_offline(tmp_path, tiny_bert_dir):
    from rapids_attn.data import Example
    from rapids_attn.explain.headview import VENDOR_FILES, write_head_views
    from rapids_attn.job import ModelConfig

    examples = [
        Example(id="q0", text="Who built the castle?", text_pair="The Normans built the castle in Caen."),
        Example(
            id="q1", text="When did honeybees dance?", text_pair="Honeybees dance to tell the hive where flowers are."
        ),
    ]
    items = [
        {
            "id": 3,
            "exemplar_examples": [
                {"example_index": 1, "example_id": "q1", "layer": 1, "head": 0},
                {"example_index": 0, "example_id": "q0", "layer": 0, "head": 1},
            ],
        }
    ]
    report_dir = tmp_path / "report"
    (report_dir / "headviews").mkdir(parents=True)
    (report_dir / "headviews" / "cluster9_ex0.html").write_text("stale page of an earlier run")
    out = write_head_views(report_dir, ModelConfig(name=str(tiny_bert_dir)), examples, items)
    assert out == {3: ["headviews/cluster3_ex0.html", "headviews/cluster3_ex1.html"]}
    page = (report_dir / out[3][0]).read_text(encoding="utf-8")
    # the page carries the example's tokens, exactly as the tokenizer splits the pair
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    tokens = tok.convert_ids_to_tokens(tok(examples[1].text, examples[1].text_pair)["input_ids"])
    assert "##bee" in tokens and "[SEP]" in tokens
    assert '"left_text": ' + json.dumps(tokens) in page
    assert "cluster 3" in page and "q1" in page and "layer 1 head 0" in page
    assert "http://" not in page and "https://" not in page and "cdnjs" not in page
    scripts = [s for s in _parse(page).scripts if s]
    assert scripts == ["vendor/require.js"]
    assert "d3: 'vendor/d3.min'" in page and "jquery: 'vendor/jquery.min'" in page
    for name in VENDOR_FILES:
        f = report_dir / "headviews" / "vendor" / name
        assert f.is_file() and f.stat().st_size > 10_000
    # opened at the exemplar's layer, with its head selected
    assert '"layer": 1' in page and '"heads": [0]' in page
    assert not list((report_dir / "headviews").glob("*.tmp"))
    assert not (report_dir / "headviews" / "cluster9_ex0.html").exists()
    # each page holds only its exemplar's layer and head: exactly that head's weights, rounded
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_bert_dir, attn_implementation="eager")
    for path, (ex, layer, head) in zip(out[3], [(examples[1], 1, 0), (examples[0], 0, 1)]):
        params = _head_view_params((report_dir / path).read_text(encoding="utf-8"))
        assert params["include_layers"] == [layer] and params["layer"] == layer and params["heads"] == [0]
        attn = np.asarray(params["attention"][0]["attn"])
        n = len(params["attention"][0]["left_text"])
        assert attn.shape == (1, 1, n, n)  # one layer, one head (the model has 2 x 2)
        with torch.no_grad():
            want = model(**tok(ex.text, ex.text_pair, return_tensors="pt"), output_attentions=True).attentions
        np.testing.assert_allclose(attn[0, 0], want[layer][0, head].numpy(), atol=1e-3 / 2 + 1e-6)


def test_a_head_view_shows_a_long_input_s_first_tokens(tmp_path, tiny_bert_dir, monkeypatch):
    """A long exemplar is not run eager at its whole length (every layer's T x T weights, a page drawing every
    pair): the page shows its first MAX_TOKENS tokens and says how many it has."""
    from rapids_attn.data import Example
    from rapids_attn.explain import headview
    from rapids_attn.job import ModelConfig

    monkeypatch.setattr(headview, "MAX_TOKENS", 12)
    examples = [Example(id="long", text="the castle was built by the normans " * 6)]
    items = {0: [{"example_index": 0, "example_id": "long", "layer": 0, "head": 1}]}
    out = headview.write_head_views(tmp_path / "report", ModelConfig(name=str(tiny_bert_dir)), examples, items)
    page = (tmp_path / "report" / out[0][0]).read_text(encoding="utf-8")
    params = _head_view_params(page)
    assert len(params["attention"][0]["left_text"]) == 12
    assert np.asarray(params["attention"][0]["attn"]).shape == (1, 1, 12, 12)
    from transformers import AutoTokenizer

    whole = len(AutoTokenizer.from_pretrained(tiny_bert_dir)(examples[0].text)["input_ids"])
    assert f"its first 12 of {whole} tokens" in page


def _head_view_params(page: str) -> dict:
    """The JSON BertViz's script is given (``const params = {...};``) on a head-view page."""
    m = re.search(r"const params = (\{.*?\}); //", page, re.DOTALL)
    assert m, "no BertViz params on the page"
    return json.loads(m.group(1))


def test_head_view_all_heads_and_its_size(tmp_path, tiny_bert_dir):
    from rapids_attn.data import Example
    from rapids_attn.explain.headview import head_view_sizes, write_head_views
    from rapids_attn.job import ModelConfig

    examples = [Example(id="q0", text="Who built the castle?", text_pair="The Normans built the castle in Caen.")]
    items = {0: [{"example_index": 0, "example_id": "q0", "layer": 1, "head": 1}]}
    report_dir = tmp_path / "report"
    cfg = ModelConfig(name=str(tiny_bert_dir))
    one = write_head_views(report_dir, cfg, examples, items)
    one_size = head_view_sizes(report_dir, one)
    params = _head_view_params((report_dir / one[0][0]).read_text(encoding="utf-8"))
    assert np.asarray(params["attention"][0]["attn"]).shape[:2] == (1, 1)

    both = write_head_views(report_dir, cfg, examples, items, all_heads=True, all_layers=True)
    params = _head_view_params((report_dir / both[0][0]).read_text(encoding="utf-8"))
    assert np.asarray(params["attention"][0]["attn"]).shape[:2] == (2, 2)  # every layer and head
    assert params["include_layers"] == [0, 1] and params["heads"] == [1]
    all_size = head_view_sizes(report_dir, both)

    page = report_dir / one[0][0]
    assert one_size["files"] == 1 and one_size["bytes"] > 0
    assert all_size == {
        "files": 1,
        "bytes": page.stat().st_size,
        "vendor_bytes": sum(f.stat().st_size for f in (report_dir / "headviews" / "vendor").iterdir()),
    }
    assert all_size["bytes"] > one_size["bytes"]  # four heads' weights against one (BertViz's script is the rest)
    assert head_view_sizes(report_dir, None)["files"] == 0


def test_head_view_script_cannot_be_closed_by_a_token():
    from rapids_attn.explain.headview import offline_html

    raw = (
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"></script><div></div>'
        '\n<script type="text/javascript">\nrequire.config({paths: {d3: '
        "'https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min', jquery: "
        "'https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min'}});\n"
        'const params = {"left_text": ["</script>", "<!--"]};\n</script>\n'
    )
    out = offline_html(raw)
    assert out.count("</script>") == 2
    assert '"<\\/script>"' in out and "<\\!--" in out
    assert "https" not in out


def test_detectors_section_names_the_strongest_head(tmp_path):
    overview, f, arrays = fake_describe()
    n_l, n_h = len(f.layers), len(f.heads)
    prev = np.full((n_l, n_h), 0.1)
    prev[1, 2] = 0.97
    f.detectors = HeadDetectors(
        names=["prev", "dup", "induction"],
        scores={"prev": prev, "dup": np.full((n_l, n_h), 0.2), "induction": np.full((n_l, n_h), np.nan)},
        examples={"prev": 10, "dup": 4, "induction": 0},
    )
    page = write_report(tmp_path, overview, f, arrays).read_text()
    sec = _section(page, "detectors")
    assert f"L{f.layers[1]}-H{f.heads[2]} (0.97)" in sec
    assert "undefined on this data" in sec  # induction never defined: said, not drawn as 0
    _assert_png(tmp_path / "report" / "detectors.png")


@pytest.mark.parametrize("with_arrays", [True, False])
def test_report_renders_describe_findings(tmp_path, with_arrays):
    """describe's typed findings of a real store render as they are: every cluster section names its
    signature and where it lives, and every image is a PNG beside the page (arrays None: no array figures)."""
    from test_describe import known_store

    from rapids_attn.explain.describe import describe
    from rapids_attn.job import ExplainConfig

    g, *_ = known_store(tmp_path, dominated_group=True, sweep=True)
    f, arrays = describe(g, ExplainConfig(exemplars=4, head_views=2, permutations=20))
    overview = fake_overview(sum(c.size for c in f.clusters))
    page = write_report(tmp_path, overview, f, arrays if with_arrays else None).read_text(encoding="utf-8")
    srcs = _parse(page).imgs
    for src in srcs:
        _assert_png(tmp_path / "report" / src)
    assert len(srcs) == (2 + 2 * len(f.clusters) if with_arrays else 0) + 3  # grid, detectors, k sweep
    for c in f.clusters:
        sec = _section(page, formatting.anchor(c.id))
        assert html.escape(c.summary) in sec and html.escape(c.dominant_description) in sec
        assert all(html.escape(s.label) in sec for s in c.signature)
        assert f"L{c.top_heads[0].layer} H{c.top_heads[0].head}" in sec
    assert html.escape(f.warnings[0]) in page and 'class="flag"' in _section(page, formatting.anchor(3))
    assert "Choosing k" in page and "<tr class=chosen><td class=n>3</td>" in page
    assert "No thumbnails were kept" not in page  # the store has them; without arrays there are no map images
