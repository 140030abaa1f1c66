"""rapids_attn.compare: two models' maps of the same inputs compared head by head, block by block from their
queries and keys, on tiny models built here (BERT, GPT-2, Llama with grouped-query attention)."""

import copy

import numpy as np
import pytest
import torch
from helpers import TINY_VOCAB, tiny_attention_model

from rapids_attn.compare.intervals import head_intervals
from rapids_attn.compare.pairwise import QueryKeys, check_same_tokens, compare_batch, pair_sums
from rapids_attn.errors import ModelError
from rapids_attn.extract.blocked import register
from rapids_attn.extract.capture import AttentionCapture

VOCAB = TINY_VOCAB
LENGTHS = [23, 17, 9, 1]


def _pair(kind: str):
    """A model (blocked capture over SDPA) and an exact copy; the eager twin of each for the reference."""
    cls, cfg = tiny_attention_model(kind)
    torch.manual_seed(0)
    a = cls._from_config(copy.deepcopy(cfg), attn_implementation=register("sdpa")).eval()
    return a, copy.deepcopy(a), cls, cfg


def _eager(model, cls, cfg):
    twin = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    twin.load_state_dict(model.state_dict())
    return twin


def _batch(lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), t), generator=g)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _compare(a, b, batch):
    return compare_batch(AttentionCapture(a, 2), AttentionCapture(b, 2), batch)


def _reference(a, b, batch):
    """The measures from whole eager maps (output_attentions), in float64."""
    with torch.inference_mode():
        ma = a(**batch, output_attentions=True).attentions
        mb = b(**batch, output_attentions=True).attentions
    n, layers, heads = batch["input_ids"].shape[0], len(ma), ma[0].shape[1]
    cos, js = np.zeros((n, layers, heads)), np.zeros((n, layers, heads))
    for i, t in enumerate(batch["attention_mask"].sum(-1).tolist()):
        for layer in range(layers):
            p = ma[layer][i, :, :t, :].double()
            q = mb[layer][i, :, :t, :].double()
            cos[i, layer] = ((p * q).sum((1, 2)) / (p.norm(dim=(1, 2)) * q.norm(dim=(1, 2)))).numpy()
            m = (p + q) / 2
            h = lambda x: -torch.xlogy(x, x).sum(-1)
            js[i, layer] = (h(m) - (h(p) + h(q)) / 2).mean(-1).numpy()
    return cos, js


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_a_model_against_itself_is_cosine_1_and_divergence_0_exactly(kind):
    a, same, _, _ = _pair(kind)
    cos, js = _compare(a, same, _batch())
    assert cos.shape == js.shape == (4, 2, 4)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(js, torch.zeros_like(js))


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_the_measures_are_those_of_the_whole_maps(kind):
    """Against cosine and Jensen-Shannon computed from both models' whole eager maps, padding rows left out."""
    a, b, cls, cfg = _pair(kind)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = _batch()
    cos, js = _compare(a, b, batch)
    want_cos, want_js = _reference(_eager(a, cls, cfg), _eager(b, cls, cfg), batch)
    np.testing.assert_allclose(cos.numpy(), want_cos, rtol=0, atol=1e-5)
    np.testing.assert_allclose(js.numpy(), want_js, rtol=0, atol=1e-6)
    assert (js[:3] > 1e-4).all()  # every head moved (the one-token example's single weight is 1 in both)


def _capped_or_sinks(kind: str):
    """Gemma 2 (soft-capped scores, a sliding-window layer) or gpt-oss (attention sinks that take a real share of
    the softmax, a sliding-window layer): the branches of the weights' softmax the three models above skip."""
    from transformers import Gemma2Config, Gemma2Model, GptOssConfig, GptOssModel

    common = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 160,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    if kind == "gemma2":
        return Gemma2Model, Gemma2Config(**common, attn_logit_softcapping=1.5)
    return GptOssModel, GptOssConfig(**common, num_local_experts=2, num_experts_per_tok=1)


@pytest.mark.parametrize("kind", ["gemma2", "gpt_oss"])
def test_soft_capped_scores_and_attention_sinks_are_those_of_the_whole_maps(kind):
    """Both models loaded as the compare stage loads them (the job's default base, ``capture``, made the forwards'
    base by ``forward_base`` and resolved for the model): against the whole eager maps, and exact against itself."""
    from rapids_attn.compare.pairwise import forward_base
    from rapids_attn.extract.model import resolve_base

    cls, cfg = _capped_or_sinks(kind)
    torch.manual_seed(0)
    eager_a = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager_b = copy.deepcopy(eager_a)
    with torch.no_grad():
        for layer in eager_a.layers:
            # scores of a few units, not the initial weights' hundredths: soft-capping at 1.5 then bends them
            layer.self_attn.q_proj.weight.mul_(30.0)
            layer.self_attn.k_proj.weight.mul_(30.0)
            if kind == "gpt_oss":
                layer.self_attn.sinks.normal_(0.0, 2.0)
        eager_b.load_state_dict(eager_a.state_dict())
        for p in eager_b.parameters():
            p.add_(0.05 * torch.randn_like(p))
    name = register(resolve_base(forward_base("capture"), cfg))

    def blocked(eager):
        m = cls._from_config(copy.deepcopy(cfg), attn_implementation=name).eval()
        m.load_state_dict(eager.state_dict())
        return m

    a, b = blocked(eager_a), blocked(eager_b)
    batch = _batch()
    cos, js = _compare(a, b, batch)
    want_cos, want_js = _reference(eager_a, eager_b, batch)
    np.testing.assert_allclose(cos.numpy(), want_cos, rtol=0, atol=1e-5)
    np.testing.assert_allclose(js.numpy(), want_js, rtol=0, atol=1e-6)
    assert (js[:3] > 1e-4).all()  # every head moved (the one-token example's single weight is 1 in both)
    cos, js = _compare(a, copy.deepcopy(a), batch)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(js, torch.zeros_like(js))


def test_the_forwards_run_sdpa_where_the_job_extracts_with_the_captures_own_softmax():
    from rapids_attn.compare.pairwise import forward_base

    assert forward_base("capture") == "sdpa"
    assert forward_base("eager") == "eager" and forward_base("flash_attention_2") == "flash_attention_2"


def test_one_heads_query_changed_puts_that_head_first_and_leaves_the_rest_alone():
    """The last layer's head 2 with new query weights: it alone changes (the layers before it see the same
    inputs, and its layer's other heads the same queries and keys), and its interval excludes zero."""
    a, b, _, cfg = _pair("bert")
    d = cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        q = b.encoder.layer[1].attention.self.query
        q.weight[2 * d : 3 * d] = torch.randn(d, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    batches = [_batch(seed=s) for s in range(4)]
    cos, js = (torch.cat(x).numpy() for x in zip(*(_compare(a, b, x) for x in batches), strict=True))
    changed = np.zeros((2, 4), dtype=bool)
    changed[1, 2] = True
    assert (js[:, ~changed] == 0).all() and (cos[:, ~changed] == 1).all()
    divergence, distance = head_intervals(js), head_intervals(1 - cos)
    assert divergence.ranked()[0] == (1, 2) and distance.ranked()[0] == (1, 2)
    assert divergence.excludes(0.0)[1, 2] and distance.excludes(0.0)[1, 2]
    assert not divergence.excludes(0.0)[~changed].any()
    assert (divergence.low[~changed] == 0).all() and (divergence.high[~changed] == 0).all()


def test_padding_rows_and_blocks_change_nothing():
    """An example compared inside a padded batch, in blocks of a few rows, as when compared alone in one block."""
    a, b, _, _ = _pair("gpt2")
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=None))
    batch = _batch()
    qa, qb = QueryKeys(), QueryKeys()
    AttentionCapture(a, 2).run(batch, qa)
    AttentionCapture(b, 2).run(batch, qb)
    lengths = batch["attention_mask"].sum(-1)
    whole = pair_sums(qa, qb, lengths)
    blocks = pair_sums(qa, qb, lengths, block_bytes=2 * 4 * 4 * 23 * 4 * 3)  # about 2 rows a block
    for x, y in zip(whole, blocks, strict=True):
        # float32 rows: a divergence of 1e-3 is a difference of entropies near 3 (cancellation), so 1e-4 relative
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)
    alone = _compare(a, b, {k: v[1:2, : LENGTHS[1]] for k, v in batch.items()})
    for x, y in zip(whole, alone, strict=True):
        torch.testing.assert_close(x[1:2], y, rtol=1e-5, atol=1e-6)


def test_models_with_different_tokenizers_are_refused_in_one_line():
    from transformers import BertTokenizerFast

    def tokenizer(words, lower=True):
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        return BertTokenizerFast(vocab={w: i for i, w in enumerate([*specials, *words])}, do_lower_case=lower)

    base = tokenizer(["the", "cat", "sat", "The"])
    check_same_tokens("base", base, "copy", tokenizer(["the", "cat", "sat", "The"]), ["The cat sat"])
    with pytest.raises(ModelError) as e:
        check_same_tokens("base", base, "other", tokenizer(["the", "dog", "sat", "The"]), ["the cat"])
    assert str(e.value) == (
        "compare: base and other tokenize the inputs differently (their vocabularies differ); map-to-map measures "
        "(cosine, Jensen-Shannon) need the same tokens: compare these models on their per-map statistics only"
    )
    with pytest.raises(ModelError, match=r"\(they encode 'The cat sat' differently\)"):
        check_same_tokens("base", base, "cased", tokenizer(["the", "cat", "sat", "The"], lower=False), ["The cat sat"])


def test_head_intervals():
    rng = np.random.default_rng(0)
    x = np.zeros((50, 2, 3))
    x[:, 0, 1] = 0.5 + rng.normal(0, 0.1, 50)
    x[:, 1, 2] = 0.25  # constant: its value, both ends
    r = head_intervals(x, n_resamples=500)
    assert r.ranked()[:2] == [(0, 1), (1, 2)] and r.n_examples == 50
    assert r.low[0, 1] < r.mean[0, 1] < r.high[0, 1] and 0.4 < r.low[0, 1] and r.high[0, 1] < 0.6
    assert r.low[1, 2] == r.mean[1, 2] == r.high[1, 2] == 0.25
    assert r.excludes(0.0).sum() == 2
    with pytest.raises(ValueError, match="examples, layers, heads"):
        head_intervals(np.zeros((0, 2, 3)))
