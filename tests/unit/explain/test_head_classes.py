"""The long-context head classes: the order and thresholds of the classification, and head_classes.json from a
job on a tiny GPT-2 whose inputs are long enough (and repetitive enough) for every score to be defined."""

import json

import numpy as np
import pytest
import zarr
from helpers import make_job, write_jsonl

from rapids_attn.explain.head_classes import classify
from rapids_attn.job import load_job
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
    assert [r["class"] for r in rows] == ["retrieval", "streaming", "sink", "retrieval", "other", "other"]
    assert [r["score"] for r in rows[:4]] == [0.2, 0.95, 0.9, 0.1]
    assert rows[4]["score"] == 0.89  # "other": the score nearest its threshold (0.89 / 0.9 beats 0.29 / 0.3)
    assert rows[4]["scores"]["retrieval"] is None and rows[5]["score"] is None
    assert all(r["layer"] == 3 for r in rows) and [r["head"] for r in rows] == list(range(6))
    # a higher threshold moves a head down the order
    assert classify(scores, [3], range(6), {**T, "retrieval": 0.5})[0]["class"] == "streaming"


@pytest.fixture(scope="module")
def long_run(tmp_path_factory, tiny_gpt2_dir):
    tmp = tmp_path_factory.mktemp("classes")
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
        "and",
        "the",
        "dog",
        "ran",
        "to",
        "the",
        "park",
        "while",
        "birds",
        "sang",
    ]
    rows = [
        {
            "id": f"d{i}",
            "question": f"doc {i}",
            "context": " ".join(words * (6 + i % 3)),
            "topic": "t",
            "answerable": True,
        }
        for i in range(6)
    ]
    data = write_jsonl(tmp / "long.jsonl", rows)
    cfg = load_job(
        None,
        raw=make_job(
            tmp,
            tiny_gpt2_dir,
            data,
            explain={"head_classes": {"streaming": 0.5}},
            cluster={"n_clusters": 2, "k_sweep": None},
        ),
    )
    return cfg, run_job(cfg)


def test_head_classes_json_holds_every_head_with_scores_from_the_store(long_run):
    cfg, summary = long_run
    doc = json.loads((cfg.run_dir / "head_classes.json").read_text())
    assert doc["thresholds"] == {**T, "streaming": 0.5} and doc["examples"] == 6
    heads = doc["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    names = [str(x) for x in g["detector"][:]]
    det = np.asarray(g["detectors"][:], np.float64)
    first = np.asarray(g["stats"][:], np.float64)[..., [str(x) for x in g["stat"][:]].index("first")]
    assert np.isfinite(det[..., names.index("streaming")]).all()  # inputs past the sink and the window
    assert np.isfinite(det[..., names.index("retrieval")]).all()  # a repeated text: far copies everywhere
    for h in heads:
        l, k = h["layer"], h["head"]
        assert h["scores"]["sink"] == pytest.approx(first[:, l, k].mean(), abs=1e-4)
        assert h["scores"]["streaming"] == pytest.approx(det[:, l, k, names.index("streaming")].mean(), abs=1e-4)
        assert h["scores"]["retrieval"] == pytest.approx(det[:, l, k, names.index("retrieval")].mean(), abs=1e-4)
        assert h["class"] in ("retrieval", "streaming", "sink", "other")
    counts = summary["head_classes"]["counts"]
    assert sum(counts.values()) == 4 and counts == {
        c: sum(h["class"] == c for h in heads) for c in ("retrieval", "streaming", "sink", "other")
    }
