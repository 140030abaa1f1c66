"""The relevance stage end to end on a tiny BERT (and a tiny GPT-2): what it stores equals the methods run
on each example alone, the gradient is the model's own output's, the roles and shares add up, the atlas is
joined to the map clusters, and the stage runs only when asked."""

import numpy as np
import pytest
import torch
import zarr
from helpers import FULL_REPORT, make_job

from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import _index_data, run_job
from rapids_attn.registry import default_stages, parse_stages
from rapids_attn.relevance import methods as M
from rapids_attn.relevance.work import SECOND, SPECIAL

RELEVANCE = {"enabled": True, "examples": 9, "batch_size": 4, "atlas_clusters": 2, "related": 2}


@pytest.fixture(scope="module")
def relevance_run(tmp_path_factory, tiny_bert_dir):
    from helpers import CORPUS, write_jsonl

    tmp = tmp_path_factory.mktemp("relevance")
    rows = [
        {
            "id": f"q{i}",
            "question": f"what about {CORPUS[i % 5].split()[1]}, question {i}?",
            "context": " ".join(CORPUS[i % 5].split() * (1 + i % 3)),
            "topic": f"t{i % 3}",
            "answerable": i % 2 == 0,
        }
        for i in range(12)
    ]
    data = write_jsonl(tmp / "pairs.jsonl", rows)
    cfg = load_job(None, raw=make_job(tmp, tiny_bert_dir, data, relevance=RELEVANCE, explain=FULL_REPORT))
    return cfg, run_job(cfg)


def _alone(cfg, example):
    """One example, unpadded, through a model loaded here: (attention layers, lengths, input ids, token types)."""
    from transformers import AutoModel

    from rapids_attn.extract.model import load_tokenizer

    tok = load_tokenizer(cfg.model)
    enc = tok(example.text, example.text_pair, return_tensors="pt", truncation=True, max_length=128)
    model = AutoModel.from_pretrained(cfg.model.name, attn_implementation="eager").eval()
    return model, enc


def test_relevance_runs_only_when_enabled(tmp_path, tiny_bert_dir, pair_data):
    off = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    assert "relevance" not in default_stages(off) and "relevance" in parse_stages("relevance", off)
    on = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, relevance={"enabled": True}))
    assert default_stages(on) == ("extract", "learn", "relevance", "explain")


def test_stored_relevance_equals_each_example_alone(relevance_run):
    cfg, summary = relevance_run
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    rel, lengths, roles = g["relevance"][:], g["relevance_length"][:], g["relevance_roles"][:]
    methods = g["relevance"].attrs["methods"]
    assert methods == ["head_mean", "last_layer", "rollout", "grad_rollout", "flow", "pagerank"]
    assert g["relevance"].attrs["query"] == "first" and summary["relevance"]["query"] == "first"
    pos = g["relevance_example"][:]
    assert len(pos) == 9 and len(set(pos.tolist())) == 9
    examples = _index_data(cfg).read(pos)
    for e in (0, 4, 8):
        model, enc = _alone(cfg, examples[e])
        n = enc["input_ids"].shape[1]
        assert lengths[e] == n and np.all(np.isnan(rel[e, :, n:]))
        out = model(**enc, output_attentions=True)
        atts = list(out.attentions)
        # the model's own output for a bare encoder: half the squared norm of the mean-pooled last hidden state
        pooled = out.last_hidden_state.mean(1)
        grads = torch.autograd.grad(0.5 * (pooled**2).sum(), atts)
        atts = [a.detach() for a in atts]
        one = torch.tensor([n])
        want = {
            "head_mean": M.head_mean(atts, one, "first"),
            "last_layer": M.last_layer(atts, one, "first"),
            "rollout": M.rollout(atts, one, "first"),
            "grad_rollout": M.grad_rollout(atts, list(grads), one, "first"),
            "flow": M.attention_flow(atts, one, "first"),
            "pagerank": M.pagerank(atts[-1], one),
        }
        for mi, m in enumerate(methods):
            np.testing.assert_allclose(rel[e, mi, :n], want[m][0].numpy(), atol=2e-5, rtol=1e-4, err_msg=m)
        # roles: [CLS] and the [SEP]s are special; the context (token type 1) is the second segment
        special = (roles[e, :n] & SPECIAL) > 0
        ids = enc["input_ids"][0].numpy()
        from rapids_attn.extract.model import load_tokenizer

        tok = load_tokenizer(cfg.model)
        assert np.array_equal(special, np.isin(ids, [tok.cls_token_id, tok.sep_token_id]))
        second = (roles[e, :n] & SECOND) > 0
        types = enc["token_type_ids"][0].numpy()
        assert np.array_equal(second[~special], types[~special] == 1)
        assert np.all(roles[e, n:] == 0)


def test_shares_partition_the_tokens_and_the_methods_disagree_measurably(relevance_run):
    _, summary = relevance_run
    r = summary["relevance"]
    for m, per in r["shares"].items():
        total = per["question"]["share"] + per["context"]["share"] + per["special"]["share"]
        assert total == pytest.approx(1.0, abs=1e-5), m
        assert 0 <= per["punct"]["share"] <= 1 and per["question"]["examples"] == 9
        assert per["context"]["lift"] == pytest.approx(per["context"]["share"] / per["context"]["token_share"])
    assert r["flow_skipped"] == 0
    pair = r["disagreement"]["rollout vs flow"]
    assert -1 <= pair["q25"] <= pair["median"] <= pair["q75"] <= 1 and pair["examples"] == 9


def test_the_atlas_is_stored_and_joined_to_the_map_clusters(relevance_run):
    cfg, summary = relevance_run
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    d = g["head_distance"][:]
    assert (
        d.shape == (4, 4) and np.allclose(d, d.T) and np.all(np.diag(d) == 0) and np.all(d[~np.eye(4, dtype=bool)] > 0)
    )
    atlas = summary["relevance"]["atlas"]
    assert len(atlas["heads"]) == 4 and g["head_atlas"].shape == (4, 2)
    cluster = g["cluster"][:]
    for h in atlas["heads"]:
        labels = cluster[:, h["layer"], h["head"]]
        values, counts = np.unique(labels, return_counts=True)
        assert h["map_cluster"] == values[np.argmax(counts)] and h["map_cluster_share"] == counts.max() / len(labels)
        assert len(h["related"]) == 2 and (h["layer"], h["head"]) not in {(a, b) for a, b, _ in h["related"]}
        i = h["layer"] * 2 + h["head"]
        nearest = min((j for j in range(4) if j != i), key=lambda j: (d[i, j], j))
        assert (h["related"][0][0], h["related"][0][1]) == divmod(nearest, 2)
    assert sorted(g["head_atlas_cluster"][:].tolist()) == sorted(h["atlas_cluster"] for h in atlas["heads"])


def test_a_decoder_reads_the_last_token_and_skips_flow_above_its_bound(tmp_path, tiny_gpt2_dir):
    from helpers import CORPUS, write_jsonl

    rows = [{"id": f"d{i}", "text": " ".join(CORPUS[i % 5].split() * (1 + i % 4))} for i in range(6)]
    data = write_jsonl(tmp_path / "docs.jsonl", rows)
    job = make_job(tmp_path, tiny_gpt2_dir, data, relevance={"enabled": True, "flow_max_tokens": 20, "atlas": False})
    job["data"] = {"path": str(data), "format": "jsonl", "text_fields": ["text"], "id_field": "id"}
    cfg = load_job(None, raw=job)
    summary = run_job(cfg)
    r = summary["relevance"]
    assert r["query"] == "last" and "atlas" not in r
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    lengths = g["relevance_length"][:]
    flow = g["relevance"][:, r["methods"].index("flow")]
    assert r["flow_skipped"] == int((lengths > 20).sum()) > 0
    for e, n in enumerate(lengths):
        assert np.isnan(flow[e, :n]).all() == (n > 20)
    # causal: the last token's rollout row reaches every earlier token
    roll = g["relevance"][:, r["methods"].index("rollout")]
    assert all(np.all(roll[e, :n] > 0) for e, n in enumerate(lengths))


def test_the_report_and_summary_carry_the_relevance_section(relevance_run):
    import json

    cfg, summary = relevance_run
    page = (cfg.run_dir / "report" / "index.html").read_text()
    assert 'id="relevance"' in page and "head_atlas.png" in page and "relevance_shares.png" in page
    assert (cfg.run_dir / "report" / "head_atlas.png").stat().st_size > 0
    written = json.loads((cfg.run_dir / "summary.json").read_text())
    assert written["relevance"]["shares"] == summary["relevance"]["shares"]
    assert len(written["relevance"]["atlas"]["heads"]) == 4


def test_the_explorer_is_one_offline_file_with_every_sampled_map_and_the_atlas(relevance_run):
    import re

    from rapids_attn.explain.explorer import map_table, sample_maps

    cfg, summary = relevance_run
    path = cfg.run_dir / "report" / "explorer.html"
    html = path.read_text()
    assert summary["explorer"]["maps"] == 12 * 2 * 2 and summary["explorer"]["bytes"] == path.stat().st_size
    assert not re.search(r"<script[^>]+src=", html) and "cdn.bokeh.org" not in html  # scripts inlined
    for name in ("maps_filter", "heads_filter", "cluster_select", "head_select"):
        assert name in html
    assert "relevance stage: Jensen-Shannon distance, MDS" in html  # the atlas, not the grid fallback
    assert 'href="explorer.html"' in (cfg.run_dir / "report" / "index.html").read_text()  # the report links to it
    # the sample and the columns it draws: every map of the example, its cluster and thumbnail as stored
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    idx = sample_maps(g["cluster"].shape, 5, 0)
    assert len(idx) == 5 and len(set(idx.tolist())) == 5 and np.all(np.diff(idx) > 0)
    t = map_table(g, {}, idx)
    e, rest = np.divmod(idx, 4)
    li, hi = np.divmod(rest, 2)
    assert t["cluster"] == [str(int(g["cluster"][a, b, c])) for a, b, c in zip(e, li, hi)]
    assert t["x"] == pytest.approx([float(g["coords"][a, b, c, 0]) for a, b, c in zip(e, li, hi)], rel=1e-6)
    assert all(s.startswith("data:image/png;base64,") for s in t["thumb"])


def test_the_atlas_places_each_head_with_its_detectors_and_consistency(relevance_run):
    _, summary = relevance_run
    heads = summary["relevance"]["atlas"]["heads"]
    table = summary["heads"]  # the explain stage's per-head table: [layer][head] over the kept layers and heads
    det = summary["head_detectors"]
    for h in heads:
        assert h["consistency"] == pytest.approx(table["consistency"][h["layer"]][h["head"]], abs=1e-4)
        assert set(h["detectors"]) == set(det["names"])
        score = det["scores"]["previous_token_head"][h["layer"]][h["head"]]
        assert h["detectors"]["previous_token_head"] == pytest.approx(score, abs=1e-4)
        assert "importance" not in h  # the heads stage did not run


def test_the_explorer_loads_offline_and_its_views_filter_in_chromium(relevance_run):
    """The explorer in a real browser: no network, a hover shows a tooltip, a menu and a click filter both
    views (tools/check_explorer). Skips where Playwright or a Chromium is missing (CI installs neither)."""
    import shutil

    pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH")
    from tools.check_explorer import check

    cfg, _ = relevance_run
    out = check(cfg.run_dir / "report" / "explorer.html", chromium)
    assert not out["failures"], out["lines"]
    assert len(out["lines"]) == 6


def test_explorer_off_removes_an_earlier_page_and_its_link(relevance_run, tmp_path):
    import shutil

    cfg, _ = relevance_run
    run = tmp_path / "run"
    shutil.copytree(cfg.run_dir, run)
    raw = cfg.model_dump(mode="json")
    raw["output"]["dir"] = str(run)
    raw["explain"]["explorer"] = False
    off = load_job(None, raw=raw)
    assert (run / "report" / "explorer.html").is_file()
    summary = run_job(off, stages=("explain",))
    assert not (run / "report" / "explorer.html").exists() and "explorer" not in summary
    assert 'href="explorer.html"' not in (run / "report" / "index.html").read_text()
