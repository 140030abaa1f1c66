"""Our DuoAttention pair (full_attention_heads.tsv + config.json) loaded by kvpress 0.5.5's own DuoAttentionPress on
a tiny grouped-query Llama.

kvpress reads a pattern only from mit-han-lab/duo-attention over HTTP (``load_attention_pattern``, keyed by model
name); the subclass below reads our folder with the same lines kvpress runs on the downloaded text, so everything
after the file read (head ranking, streaming mask, key masking, compression ratio) is kvpress's own code.
"""

import importlib.util
import json
import os
from io import StringIO

import numpy as np
import pytest

# the main tier (the project's .venv, no kvpress) skips this module; the consumer tier (run.sh sets
# RAPIDS_ATTN_CONSUMER_TIER=1) fails on the import instead, so that it never passes without running it
if os.environ.get("RAPIDS_ATTN_CONSUMER_TIER") != "1" and importlib.util.find_spec("kvpress") is None:
    pytest.skip("the consumer tier runs in its own environment: bash tests/consumers/run.sh", allow_module_level=True)

import torch
from kvpress import DuoAttentionPress
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from rapids_attn.kvheads.formats import DUO_CONFIG, DUO_TSV, ModelShape, group_heads, write_duo_attention

SINK, RECENT = 4, 8
# [layer, query head] (4 query heads on 2 key-value heads); max per group -> [[0.2, 0.9], [0.6, 0.1]]: the two
# lowest key-value heads are (1, 1) and (0, 0)
QUERY_VALUES = np.array([[0.2, 0.05, 0.9, 0.3], [0.6, 0.4, 0.1, 0.0]])
EXPECTED_KV = np.array([[0.2, 0.9], [0.6, 0.1]])
EXPECTED_MASK = np.array([[True, False], [False, True]])


def read_like_kvpress(folder):
    """kvpress 0.5.5 DuoAttentionPress.load_attention_pattern, the requests.get(...) text replaced by our files."""
    config = json.loads((folder / DUO_CONFIG).read_text())
    text = (folder / DUO_TSV).read_text()
    head_scores = np.loadtxt(StringIO(text), dtype=float, delimiter="\t")
    head_scores = np.clip(head_scores, 0, 1)
    return config["sink_size"], config["recent_size"], head_scores


class LocalDuoAttentionPress(DuoAttentionPress):
    """DuoAttentionPress reading our exported folder instead of the duo-attention repository."""

    def __init__(self, folder, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def load_attention_pattern(self, model):
        return read_like_kvpress(self.folder)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def exported(tmp_path, model):
    shape = ModelShape.from_config(model.config, "tiny-llama")
    assert (shape.layers, shape.heads, shape.kv_heads) == (2, 4, 2)
    kv = group_heads(QUERY_VALUES, shape, "max")
    np.testing.assert_array_equal(kv, EXPECTED_KV)
    write_duo_attention(tmp_path, kv, SINK, RECENT, {"model": shape.name})
    return tmp_path


def prefill_then_decode(model, ids, press=None):
    """Prefill ``ids[:, :-1]`` (under ``press`` when given), then decode ``ids[:, -1]`` on the cache it left."""
    cache = DynamicCache()
    with torch.no_grad():
        if press is None:
            prefill = model(ids[:, :-1], past_key_values=cache, use_cache=True).logits
        else:
            with press(model):
                prefill = model(ids[:, :-1], past_key_values=cache, use_cache=True).logits
        step = model(ids[:, -1:], past_key_values=cache, use_cache=True).logits
    return prefill, step


def test_tsv_round_trips_through_kvpress_parsing(tmp_path):
    values = np.array([[0.0, 0.25, 1.0], [0.123456, 0.5, 0.999999], [0.75, 0.333333, 0.01]])
    write_duo_attention(tmp_path, values, SINK, RECENT, {"model": "m"})
    sink, recent, scores = read_like_kvpress(tmp_path)
    assert (sink, recent) == (SINK, RECENT)
    assert scores.shape == values.shape  # [layers, kv_heads]
    np.testing.assert_allclose(scores, values, atol=5e-7)


def test_press_streams_our_lowest_heads(model, exported):
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (1, 65))  # 64 context tokens (> sink + recent) and one decoded
    press = LocalDuoAttentionPress(exported, head_compression_ratio=0.5)

    base_prefill, base_step = prefill_then_decode(model, ids)
    prefill, step = prefill_then_decode(model, ids, press)

    assert (press.sink_size, press.recent_size) == (SINK, RECENT)
    np.testing.assert_array_equal(press.streaming_mask.cpu().numpy(), EXPECTED_MASK)
    k_len = ids.shape[1] - 1
    expected_ratio = EXPECTED_MASK.mean() * (1 - (SINK + RECENT) / k_len)
    assert press.compression_ratio > 0
    assert press.compression_ratio == pytest.approx(expected_ratio)

    assert torch.isfinite(prefill).all() and torch.isfinite(step).all()
    # kvpress masks the streamed heads' middle keys from the first decoded token on (its attention patch leaves
    # the prefill itself whole)
    torch.testing.assert_close(prefill, base_prefill)
    assert not torch.allclose(step, base_step, atol=1e-5)


def test_no_compression_within_the_window(model, exported):
    torch.manual_seed(2)
    ids = torch.randint(0, 128, (1, SINK + RECENT - 2))  # the context fits in sink + recent
    press = LocalDuoAttentionPress(exported, head_compression_ratio=0.0)

    base_prefill, base_step = prefill_then_decode(model, ids)
    prefill, step = prefill_then_decode(model, ids, press)

    assert not press.streaming_mask.any()
    assert press.compression_ratio == 0
    torch.testing.assert_close(prefill, base_prefill)
    torch.testing.assert_close(step, base_step)
