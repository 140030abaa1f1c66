"""The blocked capture (rapids_attn/extract/blocked.py) against the eager path: the same images, statistics,
offset profiles and detectors within 1e-5, and the model's own output unchanged, on tiny BERT, GPT-2, Llama
(grouped-query attention), Mistral (a sliding window) and eleven more architectures (``_more``) built here,
with padding, blocks of a few rows and a subset of heads."""

import copy

import pytest
import torch
from helpers import TINY_VOCAB, tiny_attention_model

import rapids_attn.extract.blocked as blocked_mod
import rapids_attn.extract.blocks as blocks_mod
import rapids_attn.extract.kernels as kernels_mod
from rapids_attn.extract import maps
from rapids_attn.extract.blocked import register
from rapids_attn.extract.capture import AttentionCapture
from rapids_attn.extract.maps import LayerReducer, TokenMasks, block_rows
from rapids_attn.extract.model import resolve_base

VOCAB = TINY_VOCAB


def _bert():
    return tiny_attention_model("bert")


def _gpt2():
    return tiny_attention_model("gpt2")


def _llama():
    return tiny_attention_model("llama")


def _mistral():
    from transformers import MistralConfig, MistralModel

    return MistralModel, MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=160,
        sliding_window=5,
    )


def _more():
    """More architectures, each with what sets its attention apart (a review of 24 found them all equal to
    eager; these guard the ones with their own masks, norms, rotary splits and key-head layouts)."""
    import transformers as T

    common = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    common |= {"num_attention_heads": 4, "max_position_embeddings": 160}
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    window = {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]}
    return {
        # a sliding window on the first layer only
        "qwen2": lambda: (
            T.Qwen2Model,
            T.Qwen2Config(**common, num_key_value_heads=2, use_sliding_window=True, **window),
        ),
        "qwen3": lambda: (T.Qwen3Model, T.Qwen3Config(**common, num_key_value_heads=2, head_dim=8)),  # q/k norms
        "phi3": lambda: (T.Phi3Model, T.Phi3Config(**common, num_key_value_heads=2, sliding_window=5, **ids)),
        "gpt_neox": lambda: (T.GPTNeoXModel, T.GPTNeoXConfig(**common, rotary_pct=0.25)),  # rotary on a quarter
        "opt": lambda: (
            T.OPTModel,
            T.OPTConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                ffn_dim=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                word_embed_proj_dim=32,
                max_position_embeddings=160,
                pad_token_id=1,
                bos_token_id=2,
                eos_token_id=2,
            ),
        ),
        "gemma3": lambda: (
            T.Gemma3TextModel,
            T.Gemma3TextConfig(**common, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, **window, **ids),
        ),
        "gpt_bigcode": lambda: (  # one key head for all (multi-query)
            T.GPTBigCodeModel,
            T.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, multi_query=True, n_positions=160),
        ),
        "starcoder2": lambda: (
            T.Starcoder2Model,
            T.Starcoder2Config(**common, num_key_value_heads=2, sliding_window=5),
        ),
        "roberta": lambda: (T.RobertaModel, T.RobertaConfig(**common, pad_token_id=0)),
        "distilbert": lambda: (
            T.DistilBertModel,
            T.DistilBertConfig(
                vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=160
            ),
        ),
        "modernbert": lambda: (  # a local window of 8 keys on the first layer, global on the second
            T.ModernBertModel,
            T.ModernBertConfig(
                **common, global_attn_every_n_layers=2, local_attention=8, cls_token_id=1, sep_token_id=2, **ids
            ),
        ),
    }


MODELS = {"bert": _bert, "gpt2": _gpt2, "llama": _llama, "mistral": _mistral, **_more()}
ENCODERS = {"bert", "roberta", "distilbert", "modernbert"}


def _models(kind: str):
    cls, cfg = MODELS[kind]()
    torch.manual_seed(0)
    eager = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    blocked = cls._from_config(copy.deepcopy(cfg), attn_implementation=register("sdpa")).eval()
    blocked.load_state_dict(eager.state_dict())
    sdpa = cls._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    return eager, blocked, sdpa, cfg


def _batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.randint(3, 12, (len(lengths), t), generator=g)  # a small alphabet: repeated tokens, detectors
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _reduce(model, batch, lengths, heads, causal, block_bytes):
    masks = TokenMasks.from_ids(batch["input_ids"], torch.tensor([5]), torch.tensor([7]))
    red = LayerReducer(lengths, masks, [0, 1], heads, 8, 4, causal, "cpu", block_bytes=block_bytes)
    AttentionCapture(model, 2).run(batch, red)
    return red


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("heads", [[0, 1, 2, 3], [3, 1]])
def test_blocked_equals_eager(kind, heads):
    eager, blocked, sdpa, _ = _models(kind)
    causal = kind not in ENCODERS
    lengths = [23, 17, 9, 1]
    batch = _batch(lengths)
    ref = _reduce(eager, batch, lengths, heads, causal, 1 << 26)
    # 3 rows per block for 4 examples of 23 keys: many blocks, and blocks that end inside an example's rows
    rows = 3
    budget = rows * (4 * len(heads) * 23 * 4 * 3 + 23 * 4 * 6)
    assert block_rows(4, len(heads), 23, budget) == rows
    got = _reduce(blocked, batch, lengths, heads, causal, budget)
    for name in ("images", "thumbs", "stats", "profile", "detectors"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=1e-5, atol=1e-5, equal_nan=True)
    # the model's own output is the base implementation's (SDPA), untouched by the capture
    with torch.inference_mode():
        want = sdpa(**batch).last_hidden_state
        out = blocked(**batch).last_hidden_state
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("heads", [[0, 1, 2, 3], [3, 1]])
def test_the_capture_base_gives_the_output_from_its_own_weights(kind, heads):
    """extract.attention_base capture: where the capture reads every head, the layer's output is its own
    blocks of weights times the values; the maps are eager's and the output SDPA's, within 1e-5. With two
    heads captured, every layer falls back to SDPA for the output."""
    eager, _, sdpa, cfg = _models(kind)
    own = type(eager)._from_config(copy.deepcopy(cfg), attn_implementation=register("capture")).eval()
    own.load_state_dict(eager.state_dict())
    causal = kind not in ENCODERS
    lengths = [23, 17, 9, 1]
    batch = _batch(lengths)
    ref = _reduce(eager, batch, lengths, heads, causal, 1 << 26)
    masks = TokenMasks.from_ids(batch["input_ids"], torch.tensor([5]), torch.tensor([7]))
    calls = []
    real = blocked_mod.blocked_weights

    def spy(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    for budget in (1 << 26, 2000):  # one block a layer; many blocks
        red = LayerReducer(lengths, masks, [0, 1], heads, 8, 4, causal, "cpu", block_bytes=budget)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(blocked_mod, "blocked_weights", spy)  # the output alone
            mp.setattr(kernels_mod, "blocked_weights", spy)  # the torch kernel
            out = AttentionCapture(own, 2).run(batch, red).last_hidden_state
        assert calls == [len(heads) == 4] * 2
        calls.clear()
        for name in ("images", "thumbs", "stats", "profile", "detectors"):
            torch.testing.assert_close(getattr(red, name), getattr(ref, name), rtol=1e-5, atol=1e-5, equal_nan=True)
        with torch.inference_mode():
            want = sdpa(**batch).last_hidden_state
        for b, n in enumerate(lengths):
            torch.testing.assert_close(out[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)


def _gpt_oss():
    """gpt-oss: attention sinks (s_aux), a sliding-window layer and a full one, grouped-query attention."""
    from transformers import GptOssConfig, GptOssModel

    return GptOssModel, GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        max_position_embeddings=160,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
    )


@pytest.mark.parametrize("base", ["sdpa", "capture"])
@pytest.mark.parametrize("layers", [[0, 1], [0]])
def test_attention_sinks_reach_the_output_and_the_maps(base, layers):
    """transformers' SDPA drops a model's attention sinks; the blocked capture must not: the output (every
    layer's, a layer outside the capture too, and a forward without a capture) and the maps equal eager's
    within 1e-5."""
    cls, cfg = _gpt_oss()
    torch.manual_seed(0)
    eager = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in eager.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)  # sinks that take a real share of the softmax
    # transformers refuses an implementation named for SDPA on gpt-oss (no SDPA support): the job's load resolves
    # the default base to the capture's own output there
    assert resolve_base(base, cfg) == "capture"
    _equals_eager_captured_or_not(cls, cfg, eager, resolve_base(base, cfg), layers, [0, 1, 2, 3])


def _equals_eager_captured_or_not(cls, cfg, eager, base, layers, heads):
    """The blocked model on ``base``: its maps of ``layers`` x ``heads`` and its output, in a capture and in a forward
    without one (every layer's output from the fallback), equal eager's within 1e-5."""
    blocked = cls._from_config(copy.deepcopy(cfg), attn_implementation=register(base)).eval()
    blocked.load_state_dict(eager.state_dict())
    lengths = [23, 17, 9, 1]
    batch = _batch(lengths)
    masks = TokenMasks.from_ids(batch["input_ids"], torch.tensor([5]), torch.tensor([7]))
    ref = LayerReducer(lengths, masks, layers, heads, 8, 4, True, "cpu", block_bytes=1 << 26)
    AttentionCapture(eager, 2).run(batch, ref)
    red = LayerReducer(lengths, masks, layers, heads, 8, 4, True, "cpu", block_bytes=2000)
    out = AttentionCapture(blocked, 2).run(batch, red).last_hidden_state
    for name in ("images", "thumbs", "stats", "profile", "detectors"):
        torch.testing.assert_close(getattr(red, name), getattr(ref, name), rtol=1e-5, atol=1e-5, equal_nan=True)
    with torch.inference_mode():
        want = eager(**batch).last_hidden_state
        alone = blocked(**batch).last_hidden_state
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(alone[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("layers", "heads"), [([0, 1], [0, 1, 2, 3]), ([1], [0, 1, 2, 3]), ([0, 1], [2, 0])])
def test_soft_capping_reaches_the_output_and_the_maps_of_any_heads(layers, heads):
    """Gemma 2 soft-caps its scores, which transformers' SDPA refuses: a layer outside the capture, or one whose
    heads are captured only in part, still gets its output from the blocked softmax (eager's within 1e-5)."""
    from transformers import Gemma2Config, Gemma2Model

    cfg = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=160,
        sliding_window=5,
        attn_logit_softcapping=1.5,  # small enough to change the softmax
        layer_types=["sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    eager = Gemma2Model._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    _equals_eager_captured_or_not(Gemma2Model, cfg, eager, resolve_base("sdpa", cfg), layers, heads)


def test_the_sdpa_base_stays_where_the_model_supports_sdpa():
    assert resolve_base("sdpa", _llama()[1]) == "sdpa"
    assert resolve_base("eager", _gpt_oss()[1]) == "eager"


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_blocked_on_an_additive_mask_equals_eager(kind):
    """The eager base hands the attention function an additive float mask, which may carry more than 0 and
    -inf (a position bias): the blocked path then keeps the scores for the entropy and normalises the rows
    itself, instead of handing the reducer numerators. Same maps."""
    eager, _, _, cfg = _models(kind)
    cls = type(eager)
    on_eager = cls._from_config(copy.deepcopy(cfg), attn_implementation=register("eager")).eval()
    on_eager.load_state_dict(eager.state_dict())
    lengths = [23, 17, 9, 1]
    batch = _batch(lengths)
    causal = kind not in ENCODERS
    ref = _reduce(eager, batch, lengths, [0, 1, 2, 3], causal, 1 << 26)
    got = _reduce(on_eager, batch, lengths, [0, 1, 2, 3], causal, 2000)
    for name in ("images", "thumbs", "stats", "profile", "detectors"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("band_view", [False, True], ids=["band-pass", "band-view"])
@pytest.mark.parametrize("pairs_cache", [None, 0, 20000], ids=["pairs-cached", "pairs-recomputed", "pairs-some"])
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_blocked_equals_eager_past_the_recent_window(kind, pairs_cache, band_view, monkeypatch):
    """Inputs longer than the sink and the recent window, so the streaming and retrieval detectors are
    defined (the token ids repeat: far copies exist). The recent band comes from one pass against each row's band
    or (long inputs; forced here) from the block's strided view. The batch's pattern positions are moved to the
    device once, or, past the budget (0 here), each block's are listed again on the host, and kept while the
    budget (the batch's, not each example's) lasts."""
    if pairs_cache is not None:
        monkeypatch.setattr(maps, "PAIRS_CACHE_BYTES", pairs_cache)
    if band_view:
        monkeypatch.setattr(maps, "BAND_VIEW_KEYS", 0)
    eager, blocked, _, _ = _models(kind)
    causal = kind not in ENCODERS
    lengths = [150, 97]
    batch = _batch(lengths, seed=1)
    ref = _reduce(eager, batch, lengths, [0, 1, 2, 3], causal, 1 << 26)
    got = _reduce(blocked, batch, lengths, [0, 1, 2, 3], causal, 1 << 16)
    patterns = got.patterns
    held = [p for p in patterns._held.values() if p is not None]
    size = sum(t.numel() * t.element_size() for p in held for t in p)
    if pairs_cache is None:
        assert patterns.kept and not patterns._held
    elif pairs_cache == 0:
        assert not patterns.kept and not held
    else:
        assert not patterns.kept and held and 0 < size <= pairs_cache
    assert torch.isfinite(ref.detectors).all()
    for name in ("images", "stats", "profile", "detectors"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=1e-5, atol=1e-5)


def test_a_sliding_window_is_in_the_maps():
    """Mistral's window of 5: no map puts mass more than 4 tokens back, in the eager and the blocked path."""
    eager, blocked, _, cfg = _models("mistral")
    lengths = [20]
    batch = _batch(lengths)
    red = _reduce(blocked, batch, lengths, [0, 1, 2, 3], True, 1 << 10)
    seen = []
    AttentionCapture(eager, 2).run(batch, lambda layer, w: seen.append(w))
    w = seen[0][0]
    far = torch.tril(torch.ones(20, 20, dtype=torch.bool), diagonal=-cfg.sliding_window)
    assert float(w[:, far].abs().max()) == 0.0 and float(w[:, ~far].sum()) > 0
    assert float(red.profile[0, :, :, 0].abs().max()) > 0  # offset -4 is inside the window: seen


def test_a_plain_sink_gets_whole_maps_from_the_blocked_path():
    eager, blocked, _, _ = _models("llama")
    batch = _batch([7, 5])
    a, b = [], []
    AttentionCapture(eager, 2).run(batch, lambda layer, w: a.append((layer, w)))
    AttentionCapture(blocked, 2).run(batch, lambda layer, w: b.append((layer, w)))
    assert [x for x, _ in a] == [x for x, _ in b] == [0, 1]
    for (_, wa), (_, wb) in zip(a, b, strict=True):
        torch.testing.assert_close(wb[0], wa[0], rtol=1e-5, atol=1e-6)  # the unpadded example, every row
        torch.testing.assert_close(wb[1, :, :5, :5], wa[1, :, :5, :5], rtol=1e-5, atol=1e-6)


def test_a_causal_block_reads_later_keys_a_prefix_mask_shows():
    """A causal block reads keys up to its last row, unless a 4-D mask lets its rows see later keys (a
    prefix-LM mask: image or prompt tokens attended both ways under is_causal)."""
    from rapids_attn.extract.blocks import _visible_keys

    causal = torch.ones(10, 10, dtype=torch.bool).tril()[None, None]
    assert _visible_keys(None, 0, 4, 0, 10) == 4
    assert _visible_keys(causal, 0, 4, 0, 10) == 4
    prefix = causal.clone()
    prefix[..., :6, :6] = True  # the first 6 tokens see each other
    assert _visible_keys(prefix, 0, 4, 0, 10) == 10
    assert _visible_keys(prefix, 6, 8, 0, 10) == 8


def test_one_scores_buffer_serves_every_block_of_a_forward(monkeypatch):
    """A forward's blocks of scores, in every layer, are views of one buffer (blocks.ScratchPool), allocated once
    and released when the forward ends: fresh CPU memory per block, or per layer, would page-fault past glibc's
    mmap threshold."""
    eager, blocked, _, _ = _models("llama")
    lengths = [23, 17, 9, 1]
    batch = _batch(lengths)
    allocations, pools, products = [], [], []
    real_matmul, real_get = torch.matmul, blocks_mod.ScratchPool.get

    def get(pool, numel, device):
        pools.append(pool)
        view = real_get(pool, numel, device)
        if not any(buf is pool._buf for buf in allocations):
            allocations.append(pool._buf)
        return view

    def matmul(a, b, out=None):
        if out is not None:
            products.append(out.data_ptr() - pools[-1]._buf.data_ptr())  # where in the buffer it lands
        return real_matmul(a, b, out=out)

    monkeypatch.setattr(blocks_mod.ScratchPool, "get", get)
    monkeypatch.setattr(torch, "matmul", matmul)
    budget = 3 * (4 * 4 * 23 * 4 * 3 + 23 * 4 * 6)  # 3 rows a block: many blocks per layer
    got = _reduce(blocked, batch, lengths, [0, 1, 2, 3], True, budget)
    monkeypatch.undo()
    assert len(pools) == 2 and pools[0] is pools[1]  # both layers ask the forward's pool
    assert len(allocations) == 1  # which allocates one buffer
    assert len(products) > 2 * 2 and set(products) == {0}  # every block's scores at the start of the buffer
    assert pools[0]._buf is None  # released when the forward ends
    ref = _reduce(eager, batch, lengths, [0, 1, 2, 3], True, 1 << 26)
    torch.testing.assert_close(got.stats, ref.stats, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_half_precision_additive_mask_hides_its_keys(dtype):
    """An additive mask hides a key with its dtype's least value: float16's is -65504, which added to a score stays far
    above the blocked path's MASKED; any value at or below it (or -inf) is a hidden key all the same, weighing 0."""
    from rapids_attn.extract.blocks import MASKED, mask_rows

    least = torch.finfo(dtype).min
    mask = torch.zeros(2, 1, 3, 5, dtype=dtype)
    mask[0, :, :, 3:] = least
    mask[1, :, 1, 0] = float("-inf")
    mask[1, :, 2, 4] = -0.5  # a bias, not a hidden key
    scores = torch.randn(2, 4, 3, 5) * 10
    before = scores.clone()
    hide = mask_rows(scores, mask, 0, 3, 5, False, None)
    want = (mask <= least).expand(-1, 4, -1, -1)
    assert torch.equal(hide.expand(2, 4, 3, 5), want)
    assert bool((scores[want] == MASKED).all())
    torch.testing.assert_close(scores[~want], (before + mask.float())[~want])


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_blocked_on_a_float16_models_eager_mask_gives_its_padding_no_weight(kind):
    """The eager base's mask of a float16 model is float16 (finfo(float16).min where a key is hidden): the padded
    keys of a short example weigh exactly 0 in the blocked path's maps, as in the model's own softmax."""
    eager, _, _, cfg = _models(kind)
    half = type(eager)._from_config(copy.deepcopy(cfg), attn_implementation=register("eager")).eval()
    half.load_state_dict(eager.state_dict())
    half = half.to(torch.float16)
    batch = _batch([9, 5])
    seen = []
    AttentionCapture(half, 2).run(batch, lambda layer, w: seen.append(w))
    for w in seen:
        assert float(w[1, :, :5, 5:].abs().max()) == 0.0  # the short example's rows: nothing on its padding
        torch.testing.assert_close(w[1, :, :5, :5].sum(-1), torch.ones(4, 5), rtol=0, atol=1e-3)
