"""Head interventions (rapids_attn.heads.hooks) against hook-free edits of the weights themselves."""

from __future__ import annotations

import copy

import pytest
import torch

from rapids_attn.heads.hooks import (
    HeadIntervention,
    HeadMeans,
    ablation_mask,
    gate_importance,
    head_sites,
)

ARCHS = ["tiny_bert_dir", "tiny_gpt2_dir", "tiny_llama_dir"]


@pytest.fixture(params=ARCHS)
def model(request):
    from transformers import AutoModel

    return AutoModel.from_pretrained(request.getfixturevalue(request.param)).eval()


def _inputs(model, lengths=(7, 4), seed=0) -> dict:
    """A right-padded batch of random ids: sequences of different length, so padding is present."""
    gen = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(3, model.config.vocab_size, (len(lengths), n), generator=gen)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def _hidden(model, batch) -> torch.Tensor:
    return model(**batch).last_hidden_state


def _slice(site, head) -> slice:
    return slice(head * site.head_dim, (head + 1) * site.head_dim)


@torch.no_grad()
def _edited_copy(model, heads, means=None):
    """A deep copy whose output projections ignore ``heads``' inputs (columns zeroed) and, if
    ``means`` [L, H, d] is given, add that head's mean output through the bias instead."""
    edited = copy.deepcopy(model)
    sites = head_sites(edited)
    for layer, head in heads:
        proj, sl = sites[layer].module, _slice(sites[layer], head)
        linear = isinstance(proj, torch.nn.Linear)
        w_slice = proj.weight[:, sl].clone() if linear else proj.weight[sl, :].clone()
        if means is not None:
            m = means[layer, head].to(proj.weight.dtype)
            shift = w_slice @ m if linear else m @ w_slice
            if proj.bias is None:
                proj.bias = torch.nn.Parameter(torch.zeros_like(shift))
            proj.bias += shift
        if linear:
            proj.weight[:, sl] = 0
        else:
            proj.weight[sl, :] = 0
    return edited


def _close(a, b, mask, atol=1e-6):
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep], atol=atol, rtol=0)


def test_sites_one_per_layer_with_head_split(model):
    sites = head_sites(model)
    assert [s.layer for s in sites] == [0, 1]
    assert all(s.n_heads == 2 and s.n_heads * s.head_dim == 32 for s in sites)


def test_single_head_ablation_equals_zeroed_columns(model):
    batch = _inputs(model)
    base = _hidden(model, batch)
    for layer in range(2):
        for head in range(2):
            with HeadIntervention(model, keep=ablation_mask(2, 2, [(layer, head)])):
                hooked = _hidden(model, batch)
            _close(hooked, _hidden(_edited_copy(model, [(layer, head)]), batch), batch["attention_mask"])
            assert not torch.allclose(hooked, base)  # the head mattered, so the check can fail


def test_head_set_across_layers_equals_zeroed_columns(model):
    heads = [(0, 1), (1, 0)]
    batch = _inputs(model)
    with HeadIntervention(model, keep=ablation_mask(2, 2, heads)):
        hooked = _hidden(model, batch)
    _close(hooked, _hidden(_edited_copy(model, heads), batch), batch["attention_mask"])


def test_per_example_masks_equal_separate_runs(model):
    batch = _inputs(model)
    keep = torch.stack([ablation_mask(2, 2, [(0, 0)]), ablation_mask(2, 2, [(1, 1), (0, 1)])])
    with HeadIntervention(model) as hooks:
        hooks.keep = keep
        together = _hidden(model, batch)
        for b in range(2):
            hooks.keep = keep[b]
            _close(together[b], _hidden(model, batch)[b], batch["attention_mask"][b])


def test_mean_ablation_equals_bias_shift(model):
    heads = [(0, 0), (1, 1)]
    batch = _inputs(model)
    means = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(1))
    with HeadIntervention(model, keep=ablation_mask(2, 2, heads), means=means):
        hooked = _hidden(model, batch)
    edited = _hidden(_edited_copy(model, heads, means=means), batch)
    _close(hooked, edited, batch["attention_mask"], atol=1e-5)
    with HeadIntervention(model, keep=ablation_mask(2, 2, heads)):
        assert not torch.allclose(_hidden(model, batch), hooked)  # means differ from zeros


def test_head_means_average_non_padding_tokens(model):
    batches = [_inputs(model, (7, 4), seed=0), _inputs(model, (3, 5, 2), seed=1)]
    captured = {0: [], 1: []}  # plain torch hooks, no rapids_attn code: the reference
    handles = [
        s.module.register_forward_pre_hook(lambda m, a, layer=s.layer: captured[layer].append(a[0]))
        for s in head_sites(model)
    ]
    try:
        for batch in batches:
            _hidden(model, batch)
    finally:
        for h in handles:
            h.remove()
    expected = torch.stack(
        [
            torch.cat([x[b["attention_mask"].bool()] for x, b in zip(captured[layer], batches, strict=True)])
            .double()
            .mean(0)
            .reshape(2, 16)
            for layer in range(2)
        ]
    )
    hm = HeadMeans(model)
    for batch in batches:
        with torch.no_grad(), hm.hook(batch["attention_mask"]):
            model(**batch)
    torch.testing.assert_close(hm.means(), expected)
    assert not any(s.module._forward_pre_hooks for s in head_sites(model))


def _rms_norm_in_input_dtype(self, x):
    """Llama's RMSNorm with the same formula, without its cast to float32 (kept float64 here)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_gate_importance_matches_central_difference(model, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # LlamaRMSNorm computes in float32 even in a float64 model; its rounding (~1e-7) divided by
    # 2 * eps would swamp the finite difference, so the whole model runs in float64 here.
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_in_input_dtype)
    model = model.double()
    batches = [_inputs(model, (7, 4), seed=0), _inputs(model, (5, 6, 3), seed=2)]
    proj = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def loss_fn(out, batch):  # per-example loss [B]: a masked mean of a projection of the states
        mask = batch["attention_mask"].double()
        return ((out.last_hidden_state @ proj) * mask).sum(1) / mask.sum(1)

    raw, norm = gate_importance(model, batches, loss_fn)
    eps, per_example = 1e-4, []
    with torch.no_grad(), HeadIntervention(model) as hooks:
        for batch in batches:
            diff = torch.zeros(len(batch["input_ids"]), 2, 2, dtype=torch.float64)
            for layer in range(2):
                for head in range(2):
                    losses = []
                    for sign in (1, -1):
                        gates = torch.ones(2, 2, dtype=torch.float64)
                        gates[layer, head] += sign * eps
                        hooks.gates = gates
                        losses.append(loss_fn(model(**batch), batch))
                    diff[:, layer, head] = (losses[0] - losses[1]) / (2 * eps)
            per_example.append(diff)
    expected = torch.cat(per_example).abs().mean(0)  # E_x |dL(x)/dg|, over all 5 examples
    torch.testing.assert_close(raw, expected, rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(norm.norm(dim=1), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(norm, raw / raw.norm(dim=1, keepdim=True))
    # a scalar (batch) loss counts each batch as one example: the mean over batches of |dL_batch/dg|
    raw_batch, _ = gate_importance(model, batches, lambda out, b: loss_fn(out, b).sum())
    expected_batch = torch.stack([d.sum(0).abs() for d in per_example]).mean(0)
    torch.testing.assert_close(raw_batch, expected_batch, rtol=1e-4, atol=1e-10)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert not model.training


def test_hooks_removed_after_context_and_on_exception(model):
    batch = _inputs(model)
    before = _hidden(model, batch)
    with HeadIntervention(model, keep=ablation_mask(2, 2, [(0, 0), (1, 1)])):
        assert not torch.equal(_hidden(model, batch), before)
    assert torch.equal(_hidden(model, batch), before)
    with pytest.raises(RuntimeError, match="boom"), HeadIntervention(model, gates=torch.zeros(2, 2)):
        raise RuntimeError("boom")
    assert not any(s.module._forward_pre_hooks for s in head_sites(model))
    assert torch.equal(_hidden(model, batch), before)


def test_gates_scale_and_pool_sees_each_head(model):
    batch = _inputs(model)
    seen = {}
    gates = torch.ones(2, 2)
    gates[1, 0] = 0.0
    with HeadIntervention(model, gates=gates, pool=lambda layer, out: seen.setdefault(layer, out)):
        gated = _hidden(model, batch)
    _close(gated, _hidden(_edited_copy(model, [(1, 0)]), batch), batch["attention_mask"])
    assert tuple(seen[0].shape) == (2, 7, 2, 16)
    assert torch.count_nonzero(seen[1][:, :, 0]) == 0 and torch.count_nonzero(seen[1][:, :, 1]) > 0


def test_bad_masks_are_named(tiny_bert_dir):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_bert_dir).eval()
    batch = _inputs(model)
    with HeadIntervention(model, keep=torch.ones(3, 2, 2)), pytest.raises(ValueError, match="keep has 3"):
        _hidden(model, batch)
    with pytest.raises(ValueError, match=r"head \(2, 0\) is outside 2 layers"):
        ablation_mask(2, 2, [(2, 0)])
    with pytest.raises(ValueError, match="no tokens seen"):
        HeadMeans(model).means()
    with pytest.raises(ValueError, match=r"scalar or \[2\] losses, got \(2, 7\)"):
        gate_importance(model, [batch], lambda out, b: out.last_hidden_state.sum(-1))
    assert all(p.requires_grad for p in model.parameters())  # restored after the error


def test_unsupported_model_names_its_class():
    class ToyNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

    with pytest.raises(ValueError, match="ToyNet"):
        head_sites(ToyNet())
    with pytest.raises(ValueError, match="ToyNet"):
        HeadIntervention(ToyNet())


@pytest.mark.parametrize(
    ("cls", "cfg", "expected"),
    [
        (
            "BertForQuestionAnswering",
            {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
            ["bert.encoder.layer.0.attention.output.dense"],
        ),
        (
            "DistilBertModel",
            {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64},
            ["transformer.layer.0.attention.out_lin"],
        ),
        (
            "BartModel",
            {
                "d_model": 32,
                "encoder_layers": 1,
                "decoder_layers": 1,
                "encoder_attention_heads": 2,
                "decoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 64,
            },
            ["encoder.layers.0.self_attn.out_proj", "decoder.layers.0.self_attn.out_proj"],
        ),  # no cross-attn
        (
            "Qwen3Model",
            {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "head_dim": 16,
                "num_key_value_heads": 1,
                "intermediate_size": 64,
            },
            ["layers.0.self_attn.o_proj"],
        ),
    ],
)
def test_sites_of_other_architectures(cls, cfg, expected):
    import transformers

    model = getattr(transformers, cls)(
        transformers.AutoConfig.for_model(getattr(transformers, cls).config_class.model_type, **cfg)
    )
    names = {id(m): n for n, m in model.named_modules()}
    sites = head_sites(model)
    assert [names[id(s.module)] for s in sites][: len(expected)] == expected
    assert len(sites) == 2 and sites[0].n_heads * sites[0].head_dim == _in(sites[0].module)


def _in(module) -> int:
    return module.weight.shape[1] if isinstance(module, torch.nn.Linear) else module.weight.shape[0]
