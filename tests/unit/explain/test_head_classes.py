"""The long-context head classes: the order and thresholds of the classification, and head_classes.json from a
job on a tiny GPT-2 whose inputs are long enough (and repetitive enough) for every score to be defined."""

import json

import numpy as np
import pytest
import zarr
from helpers import make_job, repeated_rows, write_jsonl

from rapids_attn.explain.head_classes import classify, head_scores, short_windows_warning
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job

T = {"sink": 0.3, "streaming": 0.9, "retrieval": 0.1}


def test_classes_follow_the_stated_order_and_thresholds():
    nan = np.nan
    scores = {  # one layer, six heads
        "sink": np.array([[0.9, 0.9, 0.9, 0.1, 0.29, nan]]),
        "streaming": np.array([[0.95, 0.95, 0.5, 0.1, 0.89, nan]]),
        "retrieval": np.array([[0.2, 0.05, 0.0, 0.1, nan, nan]]),
    }
    rows = classify(scores, [3], [0, 1, 2, 3, 4, 5], T)
    # heads 4 and 5: their retrieval score is undefined, so whether they are retrieval heads is unknown
    assert [r["class"] for r in rows] == ["retrieval", "streaming", "sink", "retrieval", *["not_applicable"] * 2]
    assert [r["score"] for r in rows[:4]] == [0.2, 0.95, 0.9, 0.1]
    assert rows[4]["score"] is None and rows[4]["scores"]["streaming"] == 0.89
    assert rows[4]["scores"]["retrieval"] is None and rows[5]["score"] is None
    # "other": below every threshold, scored by the score nearest its threshold (0.89 / 0.9 beats 0.29 / 0.3)
    other = classify(
        {"sink": np.array([[0.29]]), "streaming": np.array([[0.89]]), "retrieval": np.array([[0.0]])}, [0], [0], T
    )[0]
    assert other["class"] == "other" and other["score"] == 0.89
    # a retrieval head is one whatever the rest: its streaming score need not be defined
    assert (
        classify(
            {"sink": np.array([[nan]]), "streaming": np.array([[nan]]), "retrieval": np.array([[0.5]])}, [0], [0], T
        )[0]["class"]
        == "retrieval"
    )
    assert all(r["layer"] == 3 for r in rows) and [r["head"] for r in rows] == list(range(6))
    # a higher threshold moves a head down the order
    assert classify(scores, [3], range(6), {**T, "retrieval": 0.5})[0]["class"] == "streaming"


def _store(tmp_path, first, seq_len, causal):
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    stats = np.zeros((*first.shape, 2), np.float32)
    stats[..., 1] = first
    g.create_array("stats", data=stats, chunks=(2, *stats.shape[1:]))
    g.create_array("stat", data=np.array(["entropy", "first"]))
    g.create_array("seq_len", data=np.asarray(seq_len, np.int32))
    g.create_array("layer", data=np.arange(first.shape[1], dtype=np.int32))
    g.create_array("head", data=np.arange(first.shape[2], dtype=np.int32))
    g.attrs["extract_runs"] = [{"shards": 1, "causal": causal}]
    return g


def test_the_sink_score_weighs_rows_and_leaves_out_a_decoders_first_row(tmp_path):
    """A decoder's first row puts all its mass on the first token whatever the head: a one-token input (its
    ``first`` is 1) must not make a head a sink head, and a long input weighs more than a short one."""
    # one layer, one head: 100 tokens at 0.02 (row 0's 1 included: 1 + 99 x 0.0101...), two one-token inputs
    long_first = (1.0 + 99 * 0.01) / 100
    first = np.array([long_first, 1.0, 1.0, np.nan])[:, None, None]
    g = _store(tmp_path, first, [100, 1, 1, 7], causal=True)
    got = head_scores(g)
    assert got["sink"][0, 0] == pytest.approx(0.01, abs=1e-6)  # rows 1..99 of the long input only
    assert np.isnan(got["streaming"][0, 0])
    # an encoder's first row sees every key: kept, and the examples weighted by their rows
    g = _store(tmp_path, np.array([0.02, 1.0, 0.5])[:, None, None], [100, 1, 10], causal=False)
    assert head_scores(g)["sink"][0, 0] == pytest.approx((2 + 1 + 5) / 111)
    # only one-token inputs in a decoder: undefined, not 1
    g = _store(tmp_path, np.array([1.0, 1.0])[:, None, None], [1, 1], causal=True)
    assert np.isnan(head_scores(g)["sink"][0, 0])


def test_short_windows_are_warned_about():
    assert short_windows_warning(0, 64) is None  # nothing windowed
    assert short_windows_warning(3, 512) is None  # BERT's windows: room past the recent window
    w = short_windows_warning(3, 128)
    assert "3 example(s) were read as windows of 128 tokens" in w and "model.max_length" in w and "\n" not in w


@pytest.fixture(scope="module")
def long_run(tmp_path_factory, tiny_gpt2_dir):
    tmp = tmp_path_factory.mktemp("classes")
    rows = repeated_rows(6, 6)
    data = write_jsonl(tmp / "long.jsonl", rows)
    cfg = load_job(
        None,
        raw=make_job(
            tmp,
            tiny_gpt2_dir,
            data,
            explain={"head_classes": {"streaming": 0.5, "min_length": 96}},
            cluster={"n_clusters": 2, "k_sweep": None},
        ),
    )
    return cfg, run_job(cfg)


def test_head_classes_json_holds_every_head_with_scores_from_the_store(long_run):
    cfg, summary = long_run
    doc = json.loads((cfg.run_dir / "head_classes.json").read_text())
    assert doc["thresholds"] == {**T, "streaming": 0.5} and doc["examples"] == 6
    assert doc["applicability"]["min_length"] == 96
    assert doc["windowed_examples"] == 0 and "windows" not in doc["definitions"]
    heads = doc["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    names = [str(x) for x in g["detector"][:]]
    det = np.asarray(g["detectors"][:], np.float64)
    first = np.asarray(g["stats"][:], np.float64)[..., [str(x) for x in g["stat"][:]].index("first")]
    rows = np.asarray(g["seq_len"][:], np.float64)[:, None, None]
    assert g.attrs["extract_runs"][-1]["causal"] is True  # GPT-2: the first row of each example left out
    sink = (first * rows - 1).sum(0) / (rows - 1).sum(0)
    assert np.isfinite(det[..., names.index("streaming")]).all()  # inputs past the sink and the window
    assert np.isfinite(det[..., names.index("retrieval")]).all()  # a repeated text: far copies everywhere
    for h in heads:
        l, k = h["layer"], h["head"]
        assert h["scores"]["sink"] == pytest.approx(sink[l, k], abs=1e-4)
        assert h["scores"]["streaming"] == pytest.approx(det[:, l, k, names.index("streaming")].mean(), abs=1e-4)
        assert h["scores"]["retrieval"] == pytest.approx(det[:, l, k, names.index("retrieval")].mean(), abs=1e-4)
        assert h["class"] in ("retrieval", "streaming", "sink", "other")
    counts = summary["head_classes"]["counts"]
    labels = ("retrieval", "streaming", "sink", "other", "not_applicable")
    assert sum(counts.values()) == 4 and counts == {c: sum(h["class"] == c for h in heads) for c in labels}
    # the noise control: every head's class score has a bootstrap interval around it and a stability share,
    # and two disjoint halves of the six examples were classified (by example: one group)
    for h in heads:
        lo, hi = h["interval"]
        assert lo <= h["score"] <= hi and 0 <= h["same_class"] <= 1
    half = doc["split_half"]
    assert half["examples"] == [3, 3] and half["halves"].startswith("by example")
    assert half["kappa"] is None or -1 <= half["kappa"] <= 1
    assert summary["head_classes"]["split_half"] == half
    # a decoder with every layer and head captured: the exports for KV-cache tools beside head_classes.json
    ex = summary["head_classes"]["exports"]
    assert ex["written"] is True, ex
    assert (cfg.run_dir / "head_classes" / "duo_attention" / "full_attention_heads.tsv").is_file()
