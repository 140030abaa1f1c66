"""Our sparse_attention_config, HeadKV head scores and kv_budget files read the way their consumers read them.

- vLLM's dual-chunk attention (vllm/attention/backends/dual_chunk_flash_attn.py, DualChunkFlashAttentionImpl
  __init__): ``{int(i): j for i, j in sparse_attention_config[layer_idx].items()}``, then one entry per query head
  of the rank, ``[cfg[i] for i in range(start_head, end_head)]``, each ``[pattern, vertical_size, slash_size,
  score]`` (MInference's best_pattern json has the same layout).
- HeadKV / Retrieval_Head: ``json.load`` then ``{k: np.mean(v)}``, keys ``"<layer>-<head>"`` split on ``-``.
"""

import json

import numpy as np
import pytest

from rapids_attn.kvheads.formats import (
    SPARSE_CONFIG,
    VERTICAL_AND_SLASH,
    ExportError,
    ModelShape,
    head_scores,
    keep_indices,
    keep_spans,
    vertical_slash_config,
    write_json,
)

SHAPE = ModelShape(layers=3, heads=4, kv_heads=2, name="tiny")


def vllm_layer_config(doc, layer_idx, num_heads, tp_rank=0):
    """DualChunkFlashAttentionImpl.__init__'s reading of ``sparse_attention_config`` for one layer and rank."""
    by_head = {int(i): j for i, j in doc[layer_idx].items()}
    start_head = num_heads * tp_rank
    return [by_head[i] for i in range(start_head, start_head + num_heads)]


def vllm_head_sizes(per_head):
    """The per-head vertical and slash sizes the prefill uses, only the vertical_and_slash pattern supported."""
    assert all(p[0] == VERTICAL_AND_SLASH for p in per_head)
    return [int(p[1]) for p in per_head], [int(p[2]) for p in per_head]


def test_sparse_attention_config_read_by_vllm(tmp_path):
    rng = np.random.default_rng(0)
    vertical = rng.integers(1, 1000, (SHAPE.layers, SHAPE.heads))
    slash = rng.integers(1, 6000, (SHAPE.layers, SHAPE.heads))
    score = rng.uniform(0, 1, (SHAPE.layers, SHAPE.heads))
    path = write_json(tmp_path / SPARSE_CONFIG, vertical_slash_config(vertical, slash, score, SHAPE))

    doc = json.loads(path.read_text())
    assert isinstance(doc, list) and len(doc) == SHAPE.layers
    for layer in range(SHAPE.layers):
        assert sorted(doc[layer], key=int) == [str(h) for h in range(SHAPE.heads)]
        per_head = vllm_layer_config(doc, layer, SHAPE.heads)
        v, s = vllm_head_sizes(per_head)
        assert v == vertical[layer].tolist() and s == slash[layer].tolist()
        np.testing.assert_allclose([p[3] for p in per_head], score[layer], atol=5e-5)
    # tensor parallel: rank 1 of 2 reads heads 2-3 of every layer
    assert vllm_layer_config(doc, 0, SHAPE.heads // 2, tp_rank=1) == [doc[0]["2"], doc[0]["3"]]


def test_sparse_attention_config_refuses_a_wrong_shape():
    ones = np.ones((SHAPE.layers, SHAPE.heads - 1))
    with pytest.raises(ExportError):
        vertical_slash_config(ones, ones, ones * 0.5, SHAPE)


def test_head_scores_read_by_headkv(tmp_path):
    rng = np.random.default_rng(1)
    per_example = rng.uniform(0, 1, (5, SHAPE.layers, SHAPE.heads))
    per_example[0, 1, 2] = np.nan  # an example that does not define one head's score
    path = write_json(tmp_path / "head_score" / "tiny.json", head_scores(per_example, SHAPE))

    raw = json.loads(path.read_text())
    scores = {k: np.mean(v) for k, v in raw.items()}  # HeadKV's reading
    coords = sorted(tuple(int(x) for x in k.split("-")) for k in scores)
    assert coords == [(i, h) for i in range(SHAPE.layers) for h in range(SHAPE.heads)]
    assert len(raw["1-2"]) == 4 and all(len(v) == 5 for k, v in raw.items() if k != "1-2")
    expected = np.nanmean(per_example, axis=0)
    for (i, h), k in ((c, f"{c[0]}-{c[1]}") for c in coords):
        assert scores[k] == pytest.approx(expected[i, h], abs=1e-4)


def test_keep_spans_round_trip(tmp_path):
    kv = np.array([[0.2, 0.9], [0.6, 0.1], [0.5, 0.7]])  # [layer, kv head]
    T, sink, recent, budget = 100, 4, 12, 60
    path = write_json(tmp_path / "kv_budget.json", keep_spans(kv, budget, T, sink, recent))
    doc = json.loads(path.read_text())

    assert len(doc["layers"]) == kv.shape[0]
    assert all(sorted(layer, key=int) == [str(k) for k in range(kv.shape[1])] for layer in doc["layers"])
    kept = np.array([[len(keep_indices(doc, i, k)) for k in range(kv.shape[1])] for i in range(kv.shape[0])])
    # streamed: the sink and the recent window, lowest values first, as few as keep the mean within budget
    streamed = kept == sink + recent
    assert streamed.sum() == doc["streamed_heads"] == 3
    assert np.sort(kv[streamed]).tolist() == np.sort(kv.ravel())[:3].tolist()
    assert ((kept == T) | streamed).all()
    assert kept.mean() <= budget and kept.mean() == pytest.approx(doc["mean_kept"])
    i, k = np.argwhere(streamed)[0]
    idx = keep_indices(doc, i, k)
    assert idx.tolist() == list(range(sink)) + list(range(T - recent, T))
    assert keep_indices(doc, *np.argwhere(~streamed)[0]).tolist() == list(range(T))
