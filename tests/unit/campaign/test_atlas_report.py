"""Issue 50's atlas pages: ``report.html`` and ``explorer.html`` written from an atlas folder's files alone. The
report's model x class table counts what heads.parquet holds, the runs left out are named with their reason, each
run against the reference is summarised (and a run of another depth says it has no RSA diagonal); the explorer is
one offline file whose model filter names every model and filters in the browser. A real merge writes both pages
inside its staging folder: they appear with the atlas, and a failing page leaves no atlas at all."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rapids_attn.campaign import atlas_report
from rapids_attn.campaign.atlas_report import EXPLORER, REPORT, write_report

# three models on one dataset: a (the reference, 3 x 4), b (3 x 4, matched within layers), c (5 x 2, across)
SHAPES = {"a": (3, 4), "b": (3, 4), "c": (5, 2)}
LEFT_OUT = {"missing/docs": "failed: error: model.name: no such model folder <./no-such-model>"}


def _heads(rng) -> dict[str, list]:
    cols: dict[str, list] = {}
    classes = ["retrieval", "streaming", "sink", "other", "not_applicable", None]
    for model, (nl, nh) in SHAPES.items():
        for i in range(nl):
            for j in range(nh):
                row = {
                    "model": model,
                    "family": "fam" if model != "c" else "other-fam",
                    "variant": "base",
                    "dataset": "docs",
                    "layer": i,
                    "head": j,
                    "depth": i / (nl - 1),
                    "class": classes[int(rng.integers(len(classes)))],
                    "class_score": float(rng.uniform()),
                    "class_low": 0.1,
                    "class_high": 0.9,
                    "same_class": 1.0,
                    "stats:entropy": float(rng.normal()),
                    "stats:first": float(rng.normal()) if model != "c" else float("nan"),
                    "detectors:induction_head": float(rng.uniform()),
                    "profile:offset -1": 0.25,  # constant: left out of the components
                }
                for k, v in row.items():
                    cols.setdefault(k, []).append(v)
    return cols


def _matches() -> dict[str, list]:
    cols: dict[str, list] = {}
    for run, how in (("b/docs", "within layers"), ("c/docs", "across all heads, with relative depth")):
        nl, nh = SHAPES[run[0]]
        for i in range(nl):
            for j in range(nh):
                within = how == "within layers"
                rl, rh = (i, (j + 1) % 4 if j == 0 else j) if within else (min(2, i // 2), j)
                for k, v in (
                    ("run", run),
                    ("reference", "a/docs"),
                    ("how", how),
                    ("layer", i),
                    ("head", j),
                    ("reference_layer", rl),
                    ("reference_head", rh),
                    ("distance", 0.5 + i + 0.1 * j),
                    ("margin", 0.2 if within else None),
                ):
                    cols.setdefault(k, []).append(v)
    return cols


@pytest.fixture
def atlas(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "atlas"
    d.mkdir()
    pq.write_table(pa.table(_heads(rng)), d / "heads.parquet")
    pq.write_table(pa.table(_matches()), d / "matches.parquet")
    eye = np.eye(3) * 0.5 + 0.5
    layers = {
        "b/docs": {"reference": "a/docs", "rsa": eye.tolist()},
        "c/docs": {"reference": "a/docs", "rsa": rng.uniform(size=(5, 3)).tolist()},
    }
    (d / "layers.json").write_text(json.dumps(layers))
    fams = {
        "fam/docs": {
            "models": ["a", "b"],
            "by_depth": {"sink": [1, 2, 0, 3], "other": [4, 0, 0, 1], "retrieval": [0, 0, 0, 0]},
            "depth_bins": ["0-0.25", "0.25-0.5", "0.5-0.75", "0.75-1"],
        }
    }
    (d / "families.json").write_text(json.dumps(fams))
    clusters = {
        "maps": 30,
        "per_run": 10,
        "n_clusters": 2,
        "embedder": ["pattern-cnn", 8],
        "clusters": [
            {"cluster": 0, "maps": 18, "mean_depth": 0.25, "share_of_each_model": {"a": 0.7, "b": 0.5, "c": 0.6}},
            {"cluster": 1, "maps": 12, "mean_depth": 0.75, "share_of_each_model": {"a": 0.3, "b": 0.5, "c": 0.4}},
        ],
    }
    (d / "clusters.json").write_text(json.dumps(clusters))
    doc = {
        "campaign": "tiny",
        "runs": ["a/docs", "b/docs", "c/docs"],
        "left_out": LEFT_OUT,
        "reference": "a",
        "heads": sum(nl * nh for nl, nh in SHAPES.values()),
        "kv_exports": {"b/docs": "../runs/b/docs/head_classes"},
        "joint_clusters": {k: v for k, v in clusters.items() if k != "clusters"},
        "files": [],
    }
    (d / "atlas.json").write_text(json.dumps(doc))
    return d


class _Tables(HTMLParser):
    """Every table of a page as rows of cell texts, keyed by the id of the section it sits in."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.section, self.cell = None, None

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self.section = dict(attrs).get("id")
        elif tag == "table":
            self.tables.setdefault(self.section, []).append([])
        elif tag == "tr":
            self.tables[self.section][-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[self.section][-1][-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def _tables(html: str) -> dict:
    p = _Tables()
    p.feed(html)
    return p.tables


def test_the_report_counts_the_classes_names_the_left_out_and_summarises_the_matches(atlas):
    paths = write_report(atlas)
    assert [p.name for p in paths] == [REPORT, EXPLORER] and all(p.is_file() for p in paths)
    html = (atlas / REPORT).read_text()
    heads = pq.read_table(atlas / "heads.parquet").to_pandas()
    heads["class"] = heads["class"].fillna("unclassified")
    # the model x class table: each model's count of each class, as heads.parquet holds them, and the share
    table = _tables(html)["model-class"][0]
    header, rows = table[0], {r[0]: r for r in table[1:]}
    assert header[:2] == ["model", "heads"] and header[2:7] == list(atlas_report.CLASSES)
    assert header[-1] == "unclassified"  # a head with no class is counted, not dropped
    expected = heads.groupby(["model", "class"]).size()
    for model in SHAPES:
        assert rows[model][1] == str(int((heads["model"] == model).sum()))
        for k, cls in enumerate(header[2:], start=2):
            n = int(expected.get((model, cls), 0))
            share = 100 * n / (heads["model"] == model).sum()
            assert rows[model][k] == f"{n} ({share:.1f}%)", (model, cls, rows[model])
    assert rows["all"][1] == str(len(heads))
    # the runs merged, and the one left out with its reason (escaped)
    runs = _tables(html)["runs"]
    assert [r[0] for r in runs[0][1:]] == ["a/docs (reference)", "b/docs", "c/docs"]
    assert runs[1][1:] == [["missing/docs", LEFT_OUT["missing/docs"]]]
    assert "&lt;./no-such-model&gt;" in html and "<./no-such-model>" not in html
    # each run against the reference: median distance, own (layer, head), and the RSA diagonal or why there is none
    m = {r[0]: r for r in _tables(html)["matches"][0][1:]}
    assert m["b/docs"][2] == "within layers" and m["b/docs"][4] == "1.65"  # median of 0.5 + i + 0.1 j
    assert m["b/docs"][5] == "75.0%"  # head 0 of each layer matched to head 1
    assert m["b/docs"][7].startswith("mean 1: 1, 1, 1")
    assert m["c/docs"][6] == "n/a" and "layer counts differ (5 vs 3" in m["c/docs"][7]
    # families, joint clusters and KV exports
    fam = _tables(html)["families"][0]
    assert fam[0][0] == "class \\ relative depth" and [r[0] for r in fam[1:]] == ["sink", "other"]
    cl = _tables(html)["clusters"][0]
    assert cl[0] == ["cluster", "maps", "mean depth", "a", "b", "c"] and cl[1] == ["0", "18", "0.25", "70.0%"] + [
        "50.0%",
        "60.0%",
    ]
    ex = {r[0]: r[1] for r in _tables(html)["kv-exports"][0][1:]}
    assert ex == {"a/docs": "none", "b/docs": "../runs/b/docs/head_classes", "c/docs": "none"}
    assert '<a href="../runs/b/docs/head_classes/exports.json">' in html
    assert "<script" not in html and 'href="explorer.html"' in html


def test_the_explorer_is_offline_and_filters_by_model(atlas):
    write_report(atlas)
    html = (atlas / EXPLORER).read_text()
    assert "cdn.bokeh.org" not in html and not re.search(r"<script[^>]+src=", html)  # scripts inlined: offline
    docs = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', html, re.DOTALL)
    doc = json.loads(docs.group(1))
    models = {
        m["attributes"]["name"]: m
        for root in doc.values()
        for m in _walk(root["roots"])
        if m.get("type") == "object" and isinstance(m.get("attributes"), dict) and m["attributes"].get("name")
    }
    assert models["model_select"]["attributes"]["options"] == ["all", "a", "b", "c"]
    assert "points_filter.indices = keep" in html and "table_filter.indices = rows" in html  # the filter's JS
    n = sum(nl * nh for nl, nh in SHAPES.values())
    assert len(models["points_filter"]["attributes"]["indices"]) == n
    assert len(models["table_filter"]["attributes"]["indices"]) == 3  # one model x class row per model
    # the points: one per head, with what the hover shows, the matched reference head among it
    cols = atlas_report.explorer_columns(atlas_report.read_atlas(atlas))[0]
    assert len(cols["model"]) == n and set(cols["model"]) == {"a", "b", "c"}
    first_b = cols["model"].index("b")
    assert cols["matched"][first_b] == "L0H1 of a/docs" and cols["distance"][first_b] == "0.5"
    assert cols["matched"][cols["model"].index("a")] == "(the reference)"
    assert np.isfinite(cols["pc1"]).all() and np.isfinite(cols["pc2"]).all()  # c's missing feature imputed


def _walk(x):
    """Every dict inside a Bokeh document's JSON."""
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


@pytest.fixture
def planted(tmp_path):
    """Two planted runs of two shapes (the merge benchmark's: stores, head_classes.json, finished task records)."""
    from benchmarks.campaign_merge import plant
    from rapids_attn.campaign.plan import load_campaign

    path = plant(tmp_path, models=2, examples=6)
    return load_campaign(path, validate_jobs=False)


def test_a_merge_writes_the_pages_inside_its_staging_folder(planted, monkeypatch):
    from rapids_attn.campaign.merge import FOLDER, merge

    c = planted
    # a page that fails leaves no atlas (and no staging folder): the atlas is whole or not at all
    real = atlas_report.write_report

    def broken(d):
        real(d)
        raise RuntimeError("page failed")

    monkeypatch.setattr(atlas_report, "write_report", broken)
    with pytest.raises(RuntimeError, match="page failed"):
        merge(c, say=lambda s: None, maps_per_run=50, n_clusters=2)
    assert not (c.out / FOLDER).exists() and not list(c.out.glob(f".{FOLDER}.tmp-*"))
    monkeypatch.setattr(atlas_report, "write_report", real)
    # a run that wrote KV exports is named relative to the atlas folder (the atlas is shared: no absolute path)
    exported = c.runs[0].run_dir / "head_classes"
    exported.mkdir()
    (exported / "exports.json").write_text("{}")
    doc = merge(c, say=lambda s: None, maps_per_run=50, n_clusters=2)
    assert doc["kv_exports"] == {c.runs[0].label: f"../runs/{c.runs[0].label}/head_classes"}
    atlas = c.out / FOLDER
    assert {REPORT, EXPLORER} <= set(doc["files"]) and set(doc["files"]) <= {p.name for p in atlas.iterdir()}
    assert json.loads((atlas / "atlas.json").read_text())["files"] == doc["files"]
    html = (atlas / REPORT).read_text()
    rows = {r[0]: r for r in _tables(html)["model-class"][0][1:]}
    heads = pq.read_table(atlas / "heads.parquet").to_pandas()
    for model, n in heads.groupby("model").size().items():
        assert rows[model][1] == f"{n:,}" and rows[model][5] == f"{n:,} (100.0%)"  # every planted head is "other"
    explorer = (atlas / EXPLORER).read_text()
    assert "cdn.bokeh.org" not in explorer and all(f'"{m}"' in explorer for m in heads["model"].unique())
