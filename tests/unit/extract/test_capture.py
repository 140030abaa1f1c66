"""Tests for rapids_attn.extract.capture: forward hooks on the attention modules deliver exactly the
maps that ``output_attentions=True`` returns, one per layer in order; causal models are detected."""

from __future__ import annotations

import pytest
import torch
from helpers import make_job, write_jsonl

from rapids_attn.errors import ModelError
from rapids_attn.extract.capture import AttentionCapture, attention_modules
from rapids_attn.extract.signature import STAT_NAMES
from rapids_attn.job import ModelConfig
from rapids_attn.store.zarr_store import StoreLayout

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tide pools hold crabs.",
    "When was the printing press invented? In the fifteenth century, in Mainz.",
]
MODELS = ["tiny_bert_dir", "tiny_gpt2_dir", "tiny_llama_dir"]


@pytest.fixture(scope="module", params=MODELS)
def loaded(request):
    from rapids_attn.extract.model import load_model, load_tokenizer

    d = request.getfixturevalue(request.param)
    cfg = ModelConfig(name=str(d))
    model, tok = load_model(cfg, "cpu", "float32"), load_tokenizer(cfg)
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    assert (batch["attention_mask"] == 0).any(), "the batch must contain padding"
    return request.param, model, batch


def collect(capture: AttentionCapture, batch: dict) -> list[tuple[int, torch.Tensor]]:
    got: list[tuple[int, torch.Tensor]] = []
    capture.run(batch, lambda layer, w: got.append((layer, w.detach().clone())))
    return got


@torch.inference_mode()
def reference(model, batch) -> tuple[torch.Tensor, ...]:
    return model(**batch, output_attentions=True).attentions


def test_hook_mode_selected_and_matches_output_attentions(loaded):
    _name, model, batch = loaded
    n_layers = model.config.num_hidden_layers
    cap = AttentionCapture(model, n_layers)
    assert cap.mode == "hooks"
    assert len(cap.modules) == n_layers == 2
    hooks_before = [list(m._forward_hooks) for m in cap.modules]  # transformers may keep its own
    got = collect(cap, batch)
    assert [layer for layer, _ in got] == list(range(n_layers))  # every layer once, in order
    assert [list(m._forward_hooks) for m in cap.modules] == hooks_before  # ours are removed
    ref = reference(model, batch)
    for (_, w), r in zip(got, ref):
        assert w.shape == r.shape == (len(TEXTS), 2, batch["input_ids"].shape[1], batch["input_ids"].shape[1])
        assert torch.allclose(w, r, atol=1e-6)
    # rows are distributions over the keys
    assert torch.allclose(got[0][1].sum(-1), torch.ones(()), atol=1e-5)


def test_output_attentions_fallback_gives_the_same_maps(loaded):
    _name, model, batch = loaded
    n_layers = model.config.num_hidden_layers
    hooks = collect(AttentionCapture(model, n_layers), batch)
    cap = AttentionCapture(model, n_layers, use_hooks=False)
    assert cap.mode == "output_attentions" and cap.modules == []
    plain = collect(cap, batch)
    assert [layer for layer, _ in plain] == [layer for layer, _ in hooks] == list(range(n_layers))
    for (_, a), (_, b) in zip(hooks, plain):
        assert torch.allclose(a, b, atol=1e-6)


def test_layer_count_mismatch_falls_back(loaded):
    _name, model, _batch = loaded
    assert AttentionCapture(model, n_layers=3).mode == "output_attentions"


def test_decoders_are_causal_and_bert_is_not(loaded):
    name, model, batch = loaded
    got = collect(AttentionCapture(model, model.config.num_hidden_layers), batch)
    upper = [float(torch.triu(w, diagonal=1).abs().sum()) for _, w in got]
    if name == "tiny_bert_dir":
        assert min(upper) > 0
    else:
        assert upper == [0.0] * len(upper)  # exactly zero above the diagonal


def test_attention_modules_found_in_layer_order(tiny_gpt2_dir):
    from transformers import GPT2Model

    model = GPT2Model.from_pretrained(tiny_gpt2_dir, attn_implementation="eager")
    mods, index = attention_modules(model)
    assert index == 1
    assert mods == [blk.attn for blk in model.h]


# --- Extractor._probe_causal ------------------------------------------------------------------


def make_extractor(tmp_path, model_dir):
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.registry import job_model

    JobConfig = job_model()

    data = write_jsonl(
        tmp_path / "d.jsonl", [{"id": "a", "question": "q", "context": "c", "topic": "t", "answerable": True}]
    )
    job = make_job(tmp_path, model_dir, data)
    layout = StoreLayout(
        n_examples=1,
        layers=[0, 1],
        heads=[0, 1],
        feature_dim=16,
        image_size=8,
        thumb_size=4,
        shard_size=6,
        stat_names=list(STAT_NAMES),
    )
    return Extractor(ShardTask.from_job(JobConfig.model_validate(job), layout, max_length=64))


@pytest.mark.parametrize("model,causal", [("tiny_bert_dir", False), ("tiny_gpt2_dir", True), ("tiny_llama_dir", True)])
def test_probe_causal(request, tmp_path, model, causal):
    ex = make_extractor(tmp_path, request.getfixturevalue(model))
    assert ex.capture.mode == "blocked"  # extract.attention: auto, and each of these models supports it
    assert ex.causal is causal
    assert ex._probe_causal() is causal


def _save(model, out, tok=None):
    from helpers import bpe_tokenizer

    model.save_pretrained(out)
    (tok or bpe_tokenizer()).save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ["led", "led-wide", "prophetnet"])
def test_attention_that_is_not_a_map_of_probabilities_is_refused_by_the_probe(tmp_path, kind):
    """LED's encoder returns Longformer's band ([T, 2w + 1], cropped to T x T it would pass for a map when the
    band is wider than the text) and ProphetNet's its scores before the softmax: the worker's probe refuses
    both in one line, where the job stored them as maps."""
    from helpers import bpe_tokenizer
    from transformers import LEDConfig, LEDModel, ProphetNetConfig, ProphetNetModel

    n = len(bpe_tokenizer())
    torch.manual_seed(0)
    small = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 2}
    if kind.startswith("led"):
        cfg = LEDConfig(
            vocab_size=n, d_model=32, encoder_ffn_dim=32, decoder_ffn_dim=32, max_encoder_position_embeddings=256,
            max_decoder_position_embeddings=128, attention_window=[64, 64] if kind == "led-wide" else [4, 4], **small,
        )  # fmt: skip
        model = LEDModel(cfg)
    else:
        model = ProphetNetModel(
            ProphetNetConfig(
                vocab_size=n, hidden_size=32, num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=2,
                num_decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
                ngram=2, num_buckets=8, relative_max_distance=16,
            )
        )  # fmt: skip
    folder = _save(model, tmp_path / kind)
    want = "not probabilities" if kind == "prophetnet" else r"returns attention of shape 1x2x\d+x\d+ for \d+ tokens"
    with pytest.raises(ModelError, match=want):
        make_extractor(tmp_path, folder)


def test_the_probe_check_takes_sinks_and_half_precision_and_refuses_what_is_not_a_map():
    from rapids_attn.extract.capture import check_probe_map

    p = torch.softmax(torch.randn(1, 2, 5, 5), -1)
    check_probe_map(torch.nn.Identity(), 0, p, 5)
    check_probe_map(torch.nn.Identity(), 0, p * 0.7, 5)  # a learned sink's share: rows below 1
    check_probe_map(torch.nn.Identity(), 0, p.to(torch.bfloat16), 5)  # bf16 rows sum to 1 within its eps
    for bad, what in [
        (p[..., :4], "shape 1x2x5x4"),
        (p[:, :, None], "shape 1x2x1x5x5"),
        (p * 1.01, "not probabilities"),
        (p - 0.05, "not probabilities"),
        (p * float("nan"), r"not finite \(NaN or inf\) in float32"),  # issue 35: the dtype's words
        (torch.zeros_like(p), "not probabilities"),
    ]:
        with pytest.raises(ModelError, match=what):
            check_probe_map(torch.nn.Identity(), 0, bad, 5)


# --- no attention weights -> ModelError -------------------------------------------------------


def test_sdpa_attention_in_hook_mode_raises_model_error(tiny_bert_dir):
    """A model running a fused kernel (SDPA) returns None where the weights should be."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_bert_dir, attn_implementation="sdpa").eval()
    cap = AttentionCapture(model, model.config.num_hidden_layers)
    assert cap.mode == "hooks"
    ids = torch.tensor([[101, 1037, 1038, 102]])
    hooks_before = [list(m._forward_hooks) for m in cap.modules]
    sink_calls = []
    with pytest.raises(ModelError, match="model.name: layer 0 .*no attention weights"):
        cap.run({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, lambda *a: sink_calls.append(a))
    assert sink_calls == []
    assert [list(m._forward_hooks) for m in cap.modules] == hooks_before  # removed even on failure


class _NoWeightsModel(torch.nn.Module):
    """No _can_record_outputs, and its output carries no attentions: the fallback must refuse it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, input_ids, attention_mask=None, output_attentions=False):
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=torch.zeros(1), attentions=None)


def test_model_without_attention_output_raises_model_error():
    cap = AttentionCapture(_NoWeightsModel(), n_layers=2)
    assert cap.mode == "output_attentions"
    with pytest.raises(ModelError, match="_NoWeightsModel returned no attention weights"):
        cap.run({"input_ids": torch.ones(1, 3, dtype=torch.long)}, lambda *a: None)
