"""The heads stage end to end on a tiny BERT: stored scores equal an independent computation, the report
joins them to the clusters, and the stage runs only when asked."""

import copy
import json

import numpy as np
import pytest
import zarr
from helpers import make_job

from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job
from rapids_attn.registry import default_stages, parse_stages

HEADS = {
    "enabled": True,
    "metric": "retrieval",
    "examples": 14,
    "pruning": {"steps": 3, "random_orders": 1},
    "probing": {"tasks": ["label", "length"], "folds": 2, "top_k": 2},
    "batch_size": 4,
    "cluster_share": 0.34,  # 3 clusters: every head has a cluster with at least a third of its maps
}


@pytest.fixture(scope="module")
def heads_run(tmp_path_factory, tiny_bert_dir):
    from helpers import CORPUS, write_jsonl

    tmp = tmp_path_factory.mktemp("heads")
    rows = [  # 4 paragraphs, 4 questions each: retrieval ranks each question's paragraph among the 4
        {
            "id": f"q{i}",
            "question": f"what does {CORPUS[i % 4].split()[i % 3 + 1]} say, question {i}?",
            "context": CORPUS[i % 4],
            "topic": f"t{i % 4}",
            "answerable": i % 2 == 0,
        }
        for i in range(16)
    ]
    data = write_jsonl(tmp / "pairs.jsonl", rows)
    cfg = load_job(None, raw=make_job(tmp, tiny_bert_dir, data, heads=HEADS, explain={"report": True}))
    summary = run_job(cfg)
    return cfg, summary


def test_heads_runs_only_when_enabled(tmp_path, tiny_bert_dir, pair_data):
    off = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    assert "heads" not in default_stages(off) and "heads" not in parse_stages(None, off)
    assert "heads" in parse_stages("heads", off)
    on = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, heads={"enabled": True}))
    assert default_stages(on) == ("extract", "learn", "heads", "explain")


def test_stored_scores_equal_an_independent_computation(heads_run, tiny_bert_dir):
    import torch

    from rapids_attn.extract.model import load_tokenizer
    from rapids_attn.heads.metrics import metric_for
    from rapids_attn.pipeline import _index_data

    cfg, _ = heads_run
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    scores = g["heads_scores"]
    names, cols = scores.attrs["conditions"], scores.attrs["columns"]
    pos = g["heads_example"][:]
    assert len(pos) == 14 and names[0] == "base" and "head:1:0" in names and "layer:0" in names
    assert any(n.startswith("prune:importance:") for n in names) and any(n.startswith("cluster:") for n in names)

    ex = _index_data(cfg).read(pos)
    metric = metric_for("retrieval")
    tok = load_tokenizer(cfg.model)
    model = metric.load_model(str(tiny_bert_dir), "cpu", "float32")

    def direct(m):
        return metric.scores(metric.partials(m, tok, ex, "cpu", 128), ex)

    base = direct(model)
    for j, c in enumerate(cols):
        np.testing.assert_allclose(scores[0, :, j], base[c], atol=1e-6)
    # head 0 of layer 1 ablated by the stage's hooks = the same model with that head's projection columns zeroed
    cut = copy.deepcopy(model)
    d = cut.config.hidden_size // cut.config.num_attention_heads
    with torch.no_grad():
        cut.encoder.layer[1].attention.output.dense.weight[:, 0:d] = 0
    want = direct(cut)
    k = names.index("head:1:0")
    for j, c in enumerate(cols):
        np.testing.assert_allclose(scores[k, :, j], want[c], atol=1e-5)


def test_result_joined_to_clusters_and_reported(heads_run):
    cfg, _ = heads_run
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    assert g.attrs["heads_complete"] is True
    assert g["head_importance"].shape == (2, 2) and np.all(np.isfinite(g["head_importance"][:]))
    assert g["head_output"].shape == (14, 2, 2, 16)
    on_disk = json.loads((cfg.run_dir / "summary.json").read_text())
    hi = on_disk["head_importance"]
    assert hi["metric"] == "retrieval" and hi["headline"] == "rr" and 0 <= hi["base"] <= 1
    assert set(hi["by_cluster"]) == {str(c["id"]) for c in on_disk["clusters"]["descriptions"]}
    assert sum(len(e["heads"]) for e in hi["by_cluster"].values()) == 4  # every head has one dominant cluster
    assert set(hi["pruning"]) >= {"importance", "ablation", "random"}
    assert "length" in hi["probing"] or "length" in g.attrs["heads"]["probing"]["skipped"]
    page = (cfg.run_dir / "report" / "index.html").read_text()
    assert "Which heads matter" in page and "head_importance.png" in page and "pruning.png" in page
    assert "Spearman" in page and hi["importance_vs_ablation"]["heads"] == 4
    assert (cfg.run_dir / "report" / "head_importance.png").is_file()


def test_summaries_follow_from_the_stored_per_example_scores(heads_run):
    from rapids_attn.heads.summary import resummarise

    cfg, _ = heads_run
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    info = dict(g.attrs["heads"])
    broken = {**info, "cost": [[9.0, 9.0], [9.0, 9.0]], "pruning": {}}  # what explain reads is recomputed
    again = resummarise(g, broken)
    np.testing.assert_allclose(np.asarray(again["cost"], float), np.asarray(info["cost"], float), atol=1e-6)
    assert again["pruning"]["importance"]["score"] == pytest.approx(info["pruning"]["importance"]["score"])
    assert set(again["pruning_columns"]) == {"recall@1", "rr"}
    assert again["importance_vs_ablation"]["heads"] == 4
