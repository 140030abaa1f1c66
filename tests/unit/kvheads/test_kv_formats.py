"""rapids_attn.kvheads.formats: the model's shape from its config, and each file read back the way its consumer
reads it (kvpress's / duo-attention's DuoAttention loader, vLLM's dual-chunk attention config, HeadKV's head
scores, the keep-index file), against hand-computed values."""

import io
import json

import numpy as np
import pytest

from rapids_attn.kvheads.formats import (
    DUO_CONFIG,
    DUO_TSV,
    VERTICAL_AND_SLASH,
    ExportError,
    ModelShape,
    group_heads,
    head_scores,
    keep_indices,
    keep_spans,
    vertical_slash_config,
    write_duo_attention,
    write_json,
)

SHAPE = ModelShape(layers=3, heads=4, kv_heads=2, name="tiny")


# --- ModelShape ---------------------------------------------------------------------------------------------


def test_shape_from_a_llama_config_with_grouped_query_attention():
    from transformers import LlamaConfig

    s = ModelShape.from_config(
        LlamaConfig(hidden_size=64, num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=2), "m"
    )
    assert (s.layers, s.heads, s.kv_heads, s.group, s.name) == (5, 8, 2, 4, "m")


def test_shape_from_a_multi_head_config():
    from transformers import GPT2Config, LlamaConfig

    s = ModelShape.from_config(LlamaConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=6))
    assert (s.layers, s.heads, s.kv_heads, s.group) == (3, 6, 6, 1)
    g = ModelShape.from_config(GPT2Config(n_layer=7, n_head=3, n_embd=48))  # GPT-2's own names
    assert (g.layers, g.heads, g.kv_heads, g.group) == (7, 3, 3, 1)


def test_shape_from_a_config_dict():
    s = ModelShape.from_config(
        {"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3, "_name_or_path": "org/x"}
    )
    assert (s.layers, s.heads, s.kv_heads, s.group, s.name) == (2, 6, 3, 2, "org/x")
    assert ModelShape.from_config({"n_layer": 4, "n_head": 2}) == ModelShape(4, 2, 2, "")
    # a multimodal config's text config
    mm = ModelShape.from_config({"text_config": {"num_hidden_layers": 9, "num_attention_heads": 4}}, "vl")
    assert (mm.layers, mm.heads, mm.kv_heads) == (9, 4, 4)


def test_shape_refusals():
    with pytest.raises(ExportError, match="num_key_value_heads") as e:
        ModelShape.from_config({"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 4})
    assert "\n" not in str(e.value)
    with pytest.raises(ExportError, match="num_hidden_layers"):
        ModelShape.from_config({"hidden_size": 8})
    with pytest.raises(ExportError):
        ModelShape(0, 4, 2)
    # a config that says 0 key-value heads is refused, not read as one per query head
    with pytest.raises(ExportError, match="0 key-value heads"):
        ModelShape.from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 0})


def test_check_names_the_missing_layers_or_heads_in_one_line():
    SHAPE.check(range(3), range(4), "x")  # every layer and head: fine
    with pytest.raises(ExportError) as e:
        SHAPE.check([0, 1], range(4), "exports")
    msg = str(e.value)
    assert "\n" not in msg and "layers 0-1 (2)" in msg and "has 3" in msg and msg.startswith("exports:")
    assert "no extract.layers" in msg
    with pytest.raises(ExportError) as e:
        SHAPE.check(range(3), [0, 2, 3], "exports")
    msg = str(e.value)
    assert "\n" not in msg and "heads [0, 2, 3]" in msg and "4 query heads" in msg
    with pytest.raises(ExportError, match="layers"):
        SHAPE.check([1, 0, 2], range(4), "exports")  # out of order: a consumer indexes by position


# --- DuoAttention -------------------------------------------------------------------------------------------


def test_group_heads_max_and_mean_by_hand():
    v = np.array(
        [
            [0.1, 0.7, 0.3, 0.2],
            [0.9, 0.0, 0.4, 0.6],
            [0.5, 0.5, 0.0, 1.0],
        ]
    )
    # query heads 0, 1 read key-value head 0; 2, 3 read key-value head 1 (repeat_kv)
    np.testing.assert_array_equal(group_heads(v, SHAPE, "max"), [[0.7, 0.3], [0.9, 0.6], [0.5, 1.0]])
    np.testing.assert_allclose(group_heads(v, SHAPE, "mean"), [[0.4, 0.25], [0.45, 0.5], [0.5, 0.5]])
    with pytest.raises(ExportError, match="shape"):
        group_heads(v[:, :3], SHAPE)
    with pytest.raises(ExportError, match="combine"):
        group_heads(v, SHAPE, "min")


def test_duo_attention_reads_back_as_kvpress_and_duo_attention_read_it(tmp_path):
    rng = np.random.default_rng(0)
    kv = rng.random((3, 2))
    kv[0, 0], kv[2, 1] = 0.0, 1.0
    paths = write_duo_attention(tmp_path / "duo", kv, 4, 64, {"rapids_attn": {"model": "m"}})
    assert [p.name for p in paths] == [DUO_TSV, DUO_CONFIG]
    text = (tmp_path / "duo" / DUO_TSV).read_text()
    # kvpress DuoAttentionPress.load_attention_pattern / duo-attention load_attn_pattern
    got = np.clip(np.loadtxt(io.StringIO(text), dtype=float, delimiter="\t"), 0, 1)
    assert got.shape == (3, 2)
    np.testing.assert_allclose(got, kv, atol=5e-7)
    cfg = json.loads((tmp_path / "duo" / DUO_CONFIG).read_text())
    assert cfg["sink_size"] == 4 and cfg["recent_size"] == 64 and cfg["rapids_attn"] == {"model": "m"}


@pytest.mark.parametrize("bad", [1.5, -0.1, np.nan, np.inf])
def test_duo_attention_refuses_a_value_out_of_range(tmp_path, bad):
    kv = np.full((3, 2), 0.5)
    kv[1, 1] = bad
    with pytest.raises(ExportError, match=r"\[1, 1\]") as e:
        write_duo_attention(tmp_path / "duo", kv, 4, 64, {})
    assert "\n" not in str(e.value)
    assert not (tmp_path / "duo").exists()


# --- MInference / vLLM / SGLang ---------------------------------------------------------------------------------


def _vllm_layer(doc, layer, num_heads):
    """vLLM DualChunkFlashAttentionImpl: ``{int(i): j for i, j in cfg[layer].items()}``, then every head."""
    by_head = {int(i): j for i, j in doc[layer].items()}
    return [by_head[i] for i in range(num_heads)]


def test_vertical_slash_config_reads_as_vllm_reads_it(tmp_path):
    rng = np.random.default_rng(1)
    vertical = rng.integers(1, 100, (3, 4))
    slash = rng.integers(1, 100, (3, 4))
    score = rng.random((3, 4))
    path = write_json(tmp_path / "sparse_attention_config.json", vertical_slash_config(vertical, slash, score, SHAPE))
    doc = json.loads(path.read_text())
    assert isinstance(doc, list) and len(doc) == 3
    for layer in range(3):
        heads = _vllm_layer(doc, layer, 4)
        for h, entry in enumerate(heads):
            assert len(entry) == 4 and entry[0] == VERTICAL_AND_SLASH
            assert entry[1] == vertical[layer, h] and entry[2] == slash[layer, h]
            assert entry[3] == pytest.approx(score[layer, h], abs=5e-5)


def test_vertical_slash_config_refusals():
    ones = np.ones((3, 4))
    with pytest.raises(ExportError, match="vertical_size"):
        vertical_slash_config(np.zeros((3, 4)), ones, ones, SHAPE)
    with pytest.raises(ExportError, match="slash_size"):
        vertical_slash_config(ones, np.ones((2, 4)), ones, SHAPE)
    with pytest.raises(ExportError, match="score"):
        vertical_slash_config(ones, ones, ones * 1.2, SHAPE)


# --- HeadKV / Retrieval_Head ------------------------------------------------------------------------------------


def test_head_scores_one_line_layer_major_means(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.random((6, 3, 4))
    x[0, 1, 2] = x[3, 1, 2] = np.nan  # two examples that do not define head 1-2's score
    x[5, 0, 0] = np.nan
    path = write_json(tmp_path / "head_score" / "m.json", head_scores(x, SHAPE), one_line=True)
    text = path.read_text()
    assert text.count("\n") == 1 and text.endswith("\n")
    with path.open() as f:  # HeadKV / Retrieval_Head
        doc = json.loads(f.readline())
    assert list(doc) == ["0-0", "0-1", "0-2", "0-3", "1-0", "1-1", "1-2", "1-3", "2-0", "2-1", "2-2", "2-3"]
    assert len(doc["1-2"]) == 4 and len(doc["0-0"]) == 5 and len(doc["2-3"]) == 6
    means = np.array([np.mean(v) for v in doc.values()]).reshape(3, 4)  # HeadKV's reshape in the file's order
    np.testing.assert_allclose(means, np.nanmean(x, axis=0), atol=5e-5)


def test_head_scores_refusals():
    with pytest.raises(ExportError, match="every head's score is 0"):
        head_scores(np.zeros((2, 3, 4)), SHAPE)
    x = np.ones((2, 3, 4))
    x[:, 2, 1] = np.nan
    with pytest.raises(ExportError, match="2-1"):
        head_scores(x, SHAPE)
    with pytest.raises(ExportError, match="shape"):
        head_scores(np.ones((2, 3, 3)), SHAPE)


# --- the keep-index file ----------------------------------------------------------------------------------------


def _kept(doc):
    """[layer, kv head] tokens kept, from the document's spans."""
    return np.array([[sum(b - a for a, b in spans) for _, spans in sorted(layer.items())] for layer in doc["layers"]])


def test_keep_spans_meets_the_budget_streaming_the_lowest_values_first():
    rng = np.random.default_rng(3)
    v = rng.random((4, 2))
    T, sink, recent = 1000, 4, 64
    for budget in (68, 300, 500, 750, 999):
        doc = keep_spans(v, budget, T, sink, recent)
        kept = _kept(doc)
        assert kept.mean() <= budget and doc["mean_kept"] == pytest.approx(kept.mean(), abs=0.01)
        streamed = kept < T
        k = int(streamed.sum())
        assert doc["streamed_heads"] == k
        # the fewest streamed heads that meet the budget
        want = min(j for j in range(9) if (j * (sink + recent) + (8 - j) * T) / 8 <= budget)
        assert k == want
        # the k lowest values
        assert set(np.flatnonzero(streamed.ravel())) == set(np.argsort(v.ravel(), kind="stable")[:k])


def test_keep_spans_ties_go_by_layer_then_head():
    doc = keep_spans(np.full((2, 3), 0.5), 500, 1000, 4, 64)
    # 6 heads, budget half: 4 streamed ((4 * 68 + 2 * 1000) / 6 = 378.7; 3 give 534 > 500)
    assert _kept(doc).ravel().tolist() == [68, 68, 68, 68, 1000, 1000]


def test_keep_spans_refusal_and_no_streaming():
    v = np.array([[0.1, 0.9]])
    with pytest.raises(ExportError, match="sink"):
        keep_spans(v, 67, 1000, 4, 64)
    for budget in (1000, 5000):  # budget at or above the context: everything kept
        doc = keep_spans(v, budget, 1000, 4, 64)
        assert doc["streamed_heads"] == 0 and _kept(doc).tolist() == [[1000, 1000]]
    # a context no longer than the sink and the window: nothing to drop, any budget
    assert keep_spans(v, 10, 60, 4, 64)["streamed_heads"] == 0
    with pytest.raises(ExportError):
        keep_spans(np.array([[0.1, np.nan]]), 500, 1000, 4, 64)


def test_keep_indices_expands_the_spans():
    doc = keep_spans(np.array([[0.1, 0.9]]), 600, 1000, 4, 64)
    assert doc["streamed_heads"] == 1
    np.testing.assert_array_equal(keep_indices(doc, 0, 0), np.r_[0:4, 936:1000])
    np.testing.assert_array_equal(keep_indices(doc, 0, 1), np.arange(1000))
    # through JSON, as a consumer reads the file
    again = json.loads(json.dumps(doc))
    np.testing.assert_array_equal(keep_indices(again, 0, 0), np.r_[0:4, 936:1000])
