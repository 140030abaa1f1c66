"""The accuracy harness (benchmarks/kv_eval.py: needle in a haystack with kvpress's DuoAttentionPress streaming the
heads a ranking puts lowest) runs end to end on a tiny random grouped-query Llama: every ranking and ratio gives
its trials, the press compressed the cache where one was applied, and the table and raw results are written. The
model's answers mean nothing here; the figures that do need a real model and a GPU (docs/kv-heads.md)."""

import importlib.util
import json
import os

import numpy as np
import pytest

if os.environ.get("RAPIDS_ATTN_CONSUMER_TIER") != "1" and importlib.util.find_spec("kvpress") is None:
    pytest.skip("the consumer tier runs in its own environment: bash tests/consumers/run.sh", allow_module_level=True)

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from benchmarks import kv_eval
from rapids_attn.kvheads.formats import write_duo_attention

TEXT = [
    "the river ran past the old mill while the miller counted sacks of grain by the door",
    "a secret number was written on the wall of the tower and every guard knew the day",
] * 20
# the tokenizer learns the question's words whole: kvpress masks a streamed head's keys at decoding with one fake
# key per group that every query of the question must score below zero, a search that needs fewer query vectors
# than the head's dimensions (64 here)
CORPUS = [*TEXT, kv_eval.QUESTION, kv_eval.NEEDLE.format(n=1234567890)] * 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-llama-lm")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", model_max_length=512
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    pattern = write_duo_attention(out / "duo", np.array([[0.2, 0.9], [0.6, 0.1]]), 4, 8, {})[0].parent
    hay = out / "hay.txt"
    hay.write_text(" ".join(TEXT))
    return out, pattern, hay


def test_the_harness_runs_every_ranking_and_ratio(tiny, tmp_path, capsys):
    model, pattern, hay = tiny
    out = tmp_path / "trials.json"
    args = ["--model", str(model), "--pattern", str(pattern), "--haystack", str(hay), "--device", "cpu"]
    args += ["--rankings", "ours", "random", "none", "--ratios", "0.5", "--lengths", "160", "--depths", "0.5"]
    args += ["--needles", "2", "--max-new-tokens", "3", "--out", str(out)]
    assert kv_eval.main(args) == 0
    trials = json.loads(out.read_text())["trials"]
    assert sorted({(t["ranking"], t["ratio"]) for t in trials}) == [("none", 0.0), ("ours", 0.5), ("random", 0.5)]
    assert all(len([t for t in trials if t["ranking"] == r]) == 2 for r in ("ours", "random", "none"))
    # the press streamed half the key-value heads over the context beyond its sink and window
    for t in trials:
        if t["ranking"] == "none":
            assert t["compression"] is None
        else:
            assert 0 < t["compression"] <= 0.5
    printed = capsys.readouterr().out
    assert "| ours | 0.5 |" in printed and "| none | 0 |" in printed


def test_the_needle_sits_at_its_depth(tiny):
    from transformers import AutoTokenizer

    model, _, hay = tiny
    tok = AutoTokenizer.from_pretrained(model)
    ids = tok.encode(hay.read_text(), add_special_tokens=False)
    needle = kv_eval.NEEDLE.format(n=4321)
    for depth in (0.0, 0.5, 1.0):
        text = kv_eval.build_context(tok, ids, 160, depth, needle)
        at = text.index(needle) / len(text)
        assert abs(at - depth) < 0.15, (depth, at)
    assert abs(len(tok.encode(kv_eval.build_context(tok, ids, 160, 0.5, needle), add_special_tokens=False)) - 160) < 8
