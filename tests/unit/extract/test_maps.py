"""Tests for rapids_attn.extract.maps: the scalar signature on hand-built maps, area_resize,
token masks, and the punctuation / separator vocabularies of real tokenizers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapids_attn.extract.maps import LayerReducer, TokenMasks, area_resize, map_stats, punctuation_ids, separator_ids
from rapids_attn.extract.signature import STAT_NAMES

N = 7
S = {name: i for i, name in enumerate(STAT_NAMES)}


def stats_of(a: torch.Tensor, sep=None, punct=None, causal: bool = False) -> dict[str, float]:
    """map_stats of one [n, n] map as {name: value}."""
    n = a.shape[-1]
    sep = torch.zeros(n, dtype=torch.bool) if sep is None else sep
    punct = torch.zeros(n, dtype=torch.bool) if punct is None else punct
    out = map_stats(a.unsqueeze(0), sep, punct, causal)
    assert out.shape == (1, len(STAT_NAMES)) and out.dtype == torch.float32
    return {name: float(out[0, i]) for name, i in S.items()}


def shifted(n: int, offset: int) -> torch.Tensor:
    """Row i puts all its mass on i + offset; rows where that falls outside attend to themselves."""
    a = torch.zeros(n, n)
    for i in range(n):
        j = i + offset
        a[i, j if 0 <= j < n else i] = 1.0
    return a


def mean_distance(a: np.ndarray) -> float:
    n = a.shape[0]
    return float(np.mean([sum(a[i, j] * abs(i - j) for j in range(n)) for i in range(n)]))


def test_stat_names_are_the_documented_ten():
    assert STAT_NAMES == ("entropy", "entropy_norm", "first", "sep", "punct", "self", "prev", "next", "distance", "max")


def test_identity_map():
    s = stats_of(torch.eye(N))
    assert s["self"] == pytest.approx(1.0)
    assert s["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert s["entropy_norm"] == pytest.approx(0.0, abs=1e-6)
    assert s["max"] == pytest.approx(1.0)
    assert s["distance"] == pytest.approx(0.0)
    assert s["prev"] == pytest.approx(0.0)
    assert s["next"] == pytest.approx(0.0)
    assert s["first"] == pytest.approx(1 / N)  # only row 0 puts mass on position 0


def test_uniform_map():
    a = torch.full((N, N), 1 / N)
    s = stats_of(a)
    assert s["entropy"] == pytest.approx(math.log(N), rel=1e-5)
    assert s["entropy_norm"] == pytest.approx(1.0, rel=1e-5)
    assert s["first"] == pytest.approx(1 / N, rel=1e-5)
    assert s["max"] == pytest.approx(1 / N, rel=1e-5)
    assert s["self"] == pytest.approx(1 / N, rel=1e-5)
    assert s["prev"] == pytest.approx(1 / N, rel=1e-5)
    assert s["next"] == pytest.approx(1 / N, rel=1e-5)
    assert s["distance"] == pytest.approx(mean_distance(a.numpy()), rel=1e-5)
    # and that independent value is the textbook (n^2 - 1) / (3n)
    assert s["distance"] == pytest.approx((N * N - 1) / (3 * N), rel=1e-5)


def test_previous_token_map():
    s = stats_of(shifted(N, -1))  # row 0 attends to itself, row i to i - 1
    assert s["prev"] == pytest.approx(1.0)
    assert s["next"] == pytest.approx(0.0)
    assert s["self"] == pytest.approx(1 / N)
    assert s["distance"] == pytest.approx((N - 1) / N)
    assert s["entropy"] == pytest.approx(0.0, abs=1e-6)


def test_next_token_map():
    s = stats_of(shifted(N, +1))  # row i attends to i + 1, the last row to itself
    assert s["next"] == pytest.approx(1.0)
    assert s["prev"] == pytest.approx(0.0)
    assert s["self"] == pytest.approx(1 / N)
    assert s["distance"] == pytest.approx((N - 1) / N)


def test_first_token_map():
    a = torch.zeros(N, N)
    a[:, 0] = 1.0
    s = stats_of(a)
    assert s["first"] == pytest.approx(1.0)
    assert s["max"] == pytest.approx(1.0)
    assert s["sep"] == pytest.approx(0.0)
    assert s["distance"] == pytest.approx(mean_distance(a.numpy()))


def test_sep_map_and_position_zero_is_never_sep():
    sep_id, word_id = 102, 7
    ids = torch.tensor([[sep_id, word_id, word_id, sep_id, word_id, word_id, word_id]])
    masks = TokenMasks.from_ids(ids, torch.tensor([sep_id]), torch.tensor([], dtype=torch.long))
    # position 0 holds a sep id but is counted as "first" only; position 3 is a separator
    assert masks.sep[0].tolist() == [False, False, False, True, False, False, False]

    to_sep = torch.zeros(N, N)
    to_sep[:, 3] = 1.0
    s = stats_of(to_sep, sep=masks.sep[0])
    assert s["sep"] == pytest.approx(1.0)
    assert s["first"] == pytest.approx(0.0)

    to_first = torch.zeros(N, N)
    to_first[:, 0] = 1.0
    s = stats_of(to_first, sep=masks.sep[0])
    assert s["first"] == pytest.approx(1.0)
    assert s["sep"] == pytest.approx(0.0)  # mass on position 0 is not counted twice


def test_punct_mass_with_mask():
    ids = torch.tensor([[1, 5, 9, 5, 2, 9, 3]])
    punct_ids = torch.tensor([5, 9])
    masks = TokenMasks.from_ids(ids, torch.tensor([], dtype=torch.long), punct_ids)
    assert masks.punct[0].tolist() == [False, True, True, True, False, True, False]
    a = torch.full((N, N), 1 / N)
    s = stats_of(a, punct=masks.punct[0])
    assert s["punct"] == pytest.approx(4 / N, rel=1e-5)
    # all mass on one punctuation column
    a = torch.zeros(N, N)
    a[:, 2] = 1.0
    assert stats_of(a, punct=masks.punct[0])["punct"] == pytest.approx(1.0)
    a = torch.zeros(N, N)
    a[:, 4] = 1.0
    assert stats_of(a, punct=masks.punct[0])["punct"] == pytest.approx(0.0)


def test_causal_uniform_map():
    a = torch.tril(torch.ones(N, N))
    a = a / a.sum(-1, keepdim=True)  # row i uniform over 0..i
    s = stats_of(a, causal=True)
    assert s["entropy_norm"] == pytest.approx(1.0, rel=1e-5)  # row 0 (one key) is excluded
    assert s["entropy"] == pytest.approx(np.mean([math.log(i + 1) for i in range(N)]), rel=1e-5)
    assert s["distance"] == pytest.approx(mean_distance(a.numpy()), rel=1e-5)
    assert s["first"] == pytest.approx(np.mean([1 / (i + 1) for i in range(N)]), rel=1e-5)
    # read as bidirectional, the same map is not uniform over the n keys
    assert stats_of(a, causal=False)["entropy_norm"] < 0.9


def test_stats_per_head_and_single_token():
    a = torch.stack([torch.eye(N), torch.full((N, N), 1 / N)])
    out = map_stats(a, torch.zeros(N, dtype=torch.bool), torch.zeros(N, dtype=torch.bool), causal=False)
    assert out.shape == (2, len(STAT_NAMES))
    assert out[0, S["entropy_norm"]] == pytest.approx(0.0, abs=1e-6)
    assert out[1, S["entropy_norm"]] == pytest.approx(1.0, rel=1e-5)
    one = map_stats(torch.ones(1, 1, 1), torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool), True)
    assert one[0, S["self"]] == 1.0 and one[0, S["first"]] == 1.0 and one[0, S["entropy"]] == 0.0
    # one token: no previous or next token, no second key to spread over: undefined, not 0
    undefined = [S["entropy_norm"], S["prev"], S["next"]]
    assert torch.isnan(one[0, undefined]).all()
    assert torch.isfinite(one[0, [j for j in range(len(STAT_NAMES)) if j not in undefined]]).all()


# --- area_resize ------------------------------------------------------------------------------


def random_stochastic(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, n, generator=g)
    return a / a.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    "n,size",
    [
        (4, 16),
        (8, 16),
        (16, 16),
        (32, 8),
        (48, 16),
        (64, 32),  # sizes that divide: exact
        (5, 16),  # upsampling by a non-integer factor
        (21, 8),  # downsampling by a non-integer factor
        (37, 32),  # the common case: n a little above image_size
        (200, 32),  # the docstring's own example
    ],
)
def test_area_resize_preserves_the_mean(n, size):
    for a in (random_stochastic(n, seed=n), torch.eye(n)):
        out = area_resize(a, size)
        assert out.shape == (size, size)
        # area averaging keeps the average value, so total mass scales by (size / n)^2
        assert float(out.mean()) == pytest.approx(float(a.mean()), rel=1e-4)
        assert float(out.sum()) == pytest.approx(float(a.sum()) * (size / n) ** 2, rel=1e-4)


def test_area_resize_exact_blocks_when_sizes_divide():
    a = random_stochastic(32)
    out = area_resize(a, 8)
    expected = a.reshape(8, 4, 8, 4).mean(dim=(1, 3))
    assert torch.allclose(out, expected, atol=1e-6)
    up = area_resize(torch.eye(4), 8)  # upsampling replicates each cell into a 2x2 block
    assert torch.equal(up, torch.eye(4).repeat_interleave(2, 0).repeat_interleave(2, 1))


def test_area_resize_keeps_block_diagonal_structure():
    n, size = 24, 8
    a = torch.zeros(n, n)
    for b in range(4):  # four 6x6 blocks
        a[b * 6 : (b + 1) * 6, b * 6 : (b + 1) * 6] = 1 / 6
    out = area_resize(a, size)
    blocks = torch.zeros(size, size)
    for b in range(4):
        blocks[b * 2 : (b + 1) * 2, b * 2 : (b + 1) * 2] = 1.0
    assert torch.allclose(out[blocks == 0], torch.zeros(1), atol=0)
    assert torch.allclose(out[blocks == 1], torch.tensor(1 / 6), atol=1e-6)


def test_area_resize_keeps_leading_dims():
    a = torch.stack([random_stochastic(10, seed=s) for s in range(6)]).reshape(2, 3, 10, 10)
    out = area_resize(a, 4)
    assert out.shape == (2, 3, 4, 4)
    assert torch.allclose(out[1, 2], area_resize(a[1, 2], 4))


# --- LayerReducer -----------------------------------------------------------------------------


def test_layer_reducer_crops_selects_heads_and_skips_other_layers():
    lengths = [3, 5]
    ids = torch.tensor([[1, 2, 1, 0, 0], [1, 2, 3, 1, 2]])
    masks = TokenMasks.from_ids(ids, torch.tensor([3]), torch.tensor([2]))
    red = LayerReducer(
        lengths, masks, layers=[1, 2], heads=[2, 0], image_size=4, thumb_size=2, causal=False, device="cpu"
    )
    g = torch.Generator().manual_seed(0)
    ws = {layer: torch.softmax(torch.randn(2, 3, 5, 5, generator=g), -1) for layer in (1, 2)}
    for w in ws.values():
        w[0, :, :, 3:] = 1e3  # garbage in the padding of example 0: must never be read
        w[0, :, 3:, :] = 1e3
    red(0, torch.full_like(ws[1], float("nan")))  # layer 0 is not kept: ignored
    red(1, ws[1])
    red(2, ws[2])  # the second kept layer reuses each example's cached weights
    assert torch.isfinite(red.images).all() and torch.isfinite(red.stats).all()
    for pos, layer in enumerate((1, 2)):
        for b, n in enumerate(lengths):
            for k, h in enumerate([2, 0]):
                crop = ws[layer][b, h, :n, :n]
                assert torch.allclose(red.images[b, pos, k], area_resize(crop, 4))
                assert torch.allclose(red.thumbs[b, pos, k], area_resize(area_resize(crop, 4), 2))
                ref = plain_stats(crop[None].contiguous(), masks.sep[b, :n], masks.punct[b, :n], False)[0]
                torch.testing.assert_close(red.stats[b, pos, k], ref, rtol=1e-5, atol=1e-6)
                det = reference_detectors(crop[None], ids[b, :n])[0]
                torch.testing.assert_close(red.detectors[b, pos, k, :5], det, rtol=1e-5, atol=1e-6, equal_nan=True)
                assert torch.isnan(red.detectors[b, pos, k, 5:]).all()  # too short for the long-context classes
    assert red.images.shape == (2, 2, 2, 4, 4) and red.stats.shape == (2, 2, 2, len(STAT_NAMES))


@pytest.mark.parametrize("causal", [False, True])
def test_layer_reducer_divides_each_example_by_its_own_length_down_to_one_token(causal):
    """The layer's means are finished for the whole batch at once: each example's by its own length, NaN
    where a statistic is undefined for it (a one-token map's prev, next and normalised entropy; a
    conditional detector without targets), whatever the other examples' lengths."""
    from rapids_attn.extract.maps import offset_profile

    lengths, t = [1, 2, 7, 5], 7
    ids = torch.tensor([[4, 0, 0, 0, 0, 0, 0], [4, 4, 0, 0, 0, 0, 0], [4, 5, 3, 4, 5, 6, 4], [6, 3, 6, 3, 6, 0, 0]])
    masks = TokenMasks.from_ids(ids, torch.tensor([3]), torch.tensor([6]))
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(len(lengths), 2, t, t, generator=g)
    hidden = torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]  # [batch, keys]: padding
    scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    w = torch.softmax(scores, -1)
    w[hidden[:, None, :, None].expand_as(w)] = 1e3  # the padding's rows: never read
    red = LayerReducer(lengths, masks, [0], [0, 1], 4, 2, causal, "cpu")
    red(0, w)
    for b, n in enumerate(lengths):
        crop = w[b, :, :n, :n]
        ref = plain_stats(crop.contiguous(), masks.sep[b, :n], masks.punct[b, :n], causal)
        torch.testing.assert_close(red.stats[b, 0], ref, rtol=1e-5, atol=1e-6, equal_nan=True)
        torch.testing.assert_close(red.profile[b, 0], offset_profile(crop), rtol=1e-5, atol=1e-6)
        det = reference_detectors(crop, ids[b, :n])
        torch.testing.assert_close(red.detectors[b, 0, :, :5], det, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.isnan(red.stats[0, 0, :, [S["prev"], S["next"], S["entropy_norm"]]]).all()
    assert torch.isfinite(red.stats[2]).all()


def test_layer_reducer_without_thumbnails():
    masks = TokenMasks.from_ids(torch.tensor([[1, 2]]), torch.tensor([9]), torch.tensor([9]))
    red = LayerReducer([2], masks, [0], [0], image_size=4, thumb_size=0, causal=True, device="cpu")
    red(0, torch.eye(2).reshape(1, 1, 2, 2))
    assert red.thumbs is None
    assert red.stats[0, 0, 0, S["self"]] == pytest.approx(1.0)


# --- punctuation_ids / separator_ids on real tokenizers ---------------------------------------


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from rapids_attn.extract.model import resolve_model_name

    return AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))


@pytest.fixture(scope="module")
def bpe_tokenizer(tiny_gpt2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_gpt2_dir)


def test_minilm_punctuation_and_separators(minilm_tokenizer):
    tok = minilm_tokenizer
    punct = set(punctuation_ids(tok).tolist())
    for p in (".", ",", "?"):
        assert tok.convert_tokens_to_ids(p) in punct, p
    for w in ("the", "[SEP]", "[CLS]", "[PAD]", "##s"):
        assert tok.convert_tokens_to_ids(w) not in punct, w
    seps = separator_ids(tok).tolist()
    assert seps == [tok.sep_token_id]  # BERT has no eos token
    assert tok.convert_tokens_to_ids("[SEP]") in seps


def test_bpe_punctuation_and_separators(bpe_tokenizer):
    tok = bpe_tokenizer
    seps = separator_ids(tok).tolist()
    assert seps == [tok.convert_tokens_to_ids("<|endoftext|>")]
    punct = set(punctuation_ids(tok).tolist())
    dot = tok("fox.", add_special_tokens=False)["input_ids"][-1]
    assert tok.convert_ids_to_tokens(dot) == "."
    assert dot in punct
    q = tok(" invented?", add_special_tokens=False)["input_ids"][-1]
    assert tok.convert_ids_to_tokens(q) == "?" and q in punct
    the = tok(" the", add_special_tokens=False)["input_ids"]
    assert len(the) == 1 and tok.convert_ids_to_tokens(the[0]) == "Ġthe"
    assert the[0] not in punct
    assert tok.convert_tokens_to_ids("<|endoftext|>") not in punct
    # a leading-space variant, if the BPE learned one, is punctuation too
    vocab = tok.get_vocab()
    if "Ġ." in vocab:
        assert vocab["Ġ."] in punct
    # every id in the list decodes to punctuation only
    for i in punct:
        s = tok.convert_ids_to_tokens(i).replace("Ġ", "").replace("Ċ", "").strip()
        assert s and all(not c.isalnum() for c in s), tok.convert_ids_to_tokens(i)


def test_minilm_hash_sign_is_punctuation(minilm_tokenizer):
    tok = minilm_tokenizer
    assert tok.tokenize("issue #5") == ["issue", "#", "5"]
    punct = set(punctuation_ids(tok).tolist())
    assert tok.convert_tokens_to_ids("#") in punct
    assert tok.convert_tokens_to_ids("###") in punct


def test_bpe_pieces_of_accented_letters_are_not_punctuation(bpe_tokenizer):
    tok = bpe_tokenizer
    punct = set(punctuation_ids(tok).tolist())
    for word in ("Köln", "façade", "Málaga"):
        ids = tok(word, add_special_tokens=False)["input_ids"]
        flagged = [tok.convert_ids_to_tokens(i) for i in ids if i in punct]
        assert flagged == [], (word, flagged)


def test_bpe_multibyte_punctuation_tokens_are_punctuation():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ["don’t say “yes” — or ‘no’."] * 20, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    punct = set(punctuation_ids(tok).tolist())
    for text, mark in (("don’t", "’"), ("“yes”", "”")):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        whole = [i for i in ids if tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)]) == mark]
        assert whole, f"the test tokenizer should have learned {mark} as one token"
        assert all(i in punct for i in whole), mark


# --- the fused signature against the statistics' plain definitions ------------------------------


def reference_detectors(a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[head, n, n], ids [n] -> [head, 5]: TransformerLens's head_detector written out, head by head (its
    get_previous_token/duplicate_token/induction_head_detection_pattern, and the score of
    compute_head_attention_similarity_score with error_measure="mul": (A * P).sum() / A.sum()), then the
    duplicate and induction scores over the rows that have a target (NaN when none has)."""
    n = len(ids)
    prev = torch.ones(n - 1).diag(-1) if n > 1 else torch.zeros(1, 1)
    dup = torch.tril((ids[:, None] == ids[None, :]).int(), diagonal=-1)
    shifted = torch.roll(dup, shifts=1, dims=1)
    ind = torch.tril(torch.cat((torch.zeros(n, 1, dtype=dup.dtype), shifted[:, 1:]), dim=1))
    out = []
    for m in a.double():
        row = [float((m * p).sum() / m.sum()) for p in (prev, dup, ind)]
        for p in (dup, ind):
            rows = p.sum(1) > 0
            row.append(float((m * p).sum() / m[rows].sum()) if rows.any() else math.nan)
        out.append(row)
    return torch.tensor(out, dtype=torch.float32)


def plain_stats(a: torch.Tensor, sep: torch.Tensor, punct: torch.Tensor, causal: bool) -> torch.Tensor:
    """Every statistic of STAT_NAMES written out as its definition, one elementwise pass each."""
    h, n, _ = a.shape
    ent_rows = -(a * torch.log(a.clamp_min(1e-30))).sum(-1)
    seen = torch.arange(1, n + 1).float() if causal else torch.full((n,), float(n))
    valid = seen > 1
    nan = torch.full((h,), math.nan)
    ent_norm = (ent_rows[:, valid] / torch.log(seen[valid])).mean(-1) if valid.any() else nan
    idx = torch.arange(n).float()
    dist = (idx[None, :] - idx[:, None]).abs()
    return torch.stack(
        [
            ent_rows.mean(-1),
            ent_norm,
            a[:, :, 0].mean(-1),
            a[:, :, sep].sum(-1).mean(-1),
            a[:, :, punct].sum(-1).mean(-1),
            a.diagonal(dim1=-2, dim2=-1).mean(-1),
            a.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1) if n > 1 else nan,  # no previous token
            a.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1) if n > 1 else nan,
            (a * dist).sum(-1).mean(-1),
            a.amax(-1).mean(-1),
        ],
        dim=-1,
    )


@pytest.mark.parametrize("causal", [False, True])
def test_signature_matches_the_plain_definitions_on_padded_crops(causal):
    from rapids_attn.extract.maps import SignatureWeights, map_signature

    g = torch.Generator().manual_seed(3)
    T, n, h = 40, 29, 5
    scores = torch.randn(h, T, T, generator=g) * 3
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    weights = torch.softmax(scores, -1)
    weights[:, :, 7] = 0.0  # exact zeros: the entropy's 0 log 0
    weights = weights / weights.sum(-1, keepdim=True)
    crop = weights[:, :n, :n]  # a strided view, as the reducer passes it
    ids = torch.randint(0, 6, (n,), generator=g)  # a small vocabulary: many repeats
    sep, punct = ids == 2, ids == 4
    sep[0] = False
    stats, det = map_signature(crop, SignatureWeights.build(sep, punct, causal, ids))
    torch.testing.assert_close(stats, plain_stats(crop.contiguous(), sep, punct, causal), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(det, reference_detectors(crop.contiguous(), ids), rtol=1e-5, atol=1e-6)
    # without token ids the detectors are not computed; the stats are the same
    alone, none = map_signature(crop, SignatureWeights.build(sep, punct, causal))
    assert none is None
    torch.testing.assert_close(alone, stats, rtol=1e-6, atol=1e-7)
    # half-precision maps (a model run in float16) are reduced in float32
    half, _ = map_signature(crop.half(), SignatureWeights.build(sep, punct, causal, ids))
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, plain_stats(crop.half().float(), sep, punct, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_signature_of_the_shortest_maps(n, causal):
    from rapids_attn.extract.maps import SignatureWeights, map_signature

    a = torch.tril(torch.ones(n, n)) if causal else torch.ones(n, n)
    a = (a / a.sum(-1, keepdim=True))[None]
    ids = torch.full((n,), 5)  # every token repeats the one before
    none = torch.zeros(n, dtype=torch.bool)
    stats, det = map_signature(a, SignatureWeights.build(none, none, causal, ids))
    torch.testing.assert_close(stats, plain_stats(a, none, none, causal), rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(det, reference_detectors(a, ids), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.isnan(det[:, 3:]).all() == (n == 1)  # the conditional scores: no row has a target at n = 1
    assert not torch.isnan(det[:, :3]).any()  # TransformerLens's: 0 there


@pytest.mark.parametrize("causal", [False, True])
def test_long_context_detectors_match_their_plain_definitions(causal):
    """streaming and retrieval (rapids_attn.extract.maps) on maps longer than the sink and the recent window,
    whole and in blocks of rows, against the plain references; and what each is high on."""
    from detector_reference import retrieval_score, streaming_score

    from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS

    g = torch.Generator().manual_seed(5)
    n, h = 2 * RECENT_WINDOW + 37, 3
    ids = torch.randint(3, 40, (n,), generator=g)
    ids[100:110] = ids[5:15]  # a copied span far back: induction targets beyond the window
    scores = torch.randn(h, n, n, generator=g)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    scores[0] += 8.0 * ((j < SINK_TOKENS) | ((i - j).abs() < 8))  # head 0 streams
    ind = torch.zeros(n, n, dtype=torch.bool)
    ind[:, 1:] = (ids[:, None] == ids[None, :-1]) & (j[:, 1:] <= i)
    scores[1] += 12.0 * (ind & (i - j >= RECENT_WINDOW))  # head 1 retrieves
    if causal:
        scores = scores.masked_fill(j > i, float("-inf"))
    a = torch.softmax(scores, -1)
    masks = TokenMasks.from_ids(ids[None], torch.tensor([1]), torch.tensor([2]))
    whole = LayerReducer([n], masks, [0], [0, 1, 2], 8, 0, causal, "cpu")
    whole(0, a[None])
    blocks = LayerReducer([n], masks, [0], [0, 1, 2], 8, 0, causal, "cpu", block_bytes=1)
    for r0 in reversed(range(0, n, 13)):  # blocks of 13 rows, in any order
        blocks.add_rows(0, a[None, :, r0 : r0 + 13], r0)
    blocks.end_layer(0)
    stream, retr = streaming_score(a, causal), retrieval_score(a, ids)
    for red in (whole, blocks):
        torch.testing.assert_close(red.detectors[0, 0, :, 5], stream, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(red.detectors[0, 0, :, 6], retr, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(red.detectors[0, 0, :, :5], reference_detectors(a, ids), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            red.stats[0, 0], plain_stats(a, masks.sep[0], masks.punct[0], causal), rtol=1e-5, atol=1e-5
        )
    assert stream[0] > 0.9 > stream[2] and retr[1] > 0.5 > retr[2]


def test_a_windows_first_token_counts_as_first_not_twice():
    """Windows: a row's `first` is its weight on its window's first token; where that token is a separator (an
    EOS inside the text), it is not counted as `sep` too, as position 0 never is."""
    from rapids_attn.extract.signature import SINK_TOKENS, STAT_NAMES

    n = 10
    ids = torch.tensor([[1, 2, 3, 4, 5, 9, 6, 7, 8, 9]])  # 9: the separator, at 5 (a window's start) and at 9
    masks = TokenMasks.from_ids(ids, torch.tensor([9]), torch.tensor([], dtype=torch.long))
    red = LayerReducer([n], masks, [0], [0], 8, 0, True, "cpu")
    a = torch.zeros(1, 1, 5, n)
    a[0, 0, :4, 5] = 1.0  # rows 5..8 of a window that starts at 5: all on its first token
    a[0, 0, 4, 5], a[0, 0, 4, 9] = 0.25, 0.75  # row 9: a quarter on it, the rest on the later separator
    sinks = torch.tensor([[5, 6, 7, 8]]).expand(5, SINK_TOKENS)
    spans = torch.tensor([[5, 10, 9]]).expand(5, 3)
    red.add_rows(0, a, 5, selected=True, example=0, sinks=sinks, spans=spans, log_seen=torch.ones(5))
    red.end_layer(0)
    stats = red.stats[0, 0, 0]
    assert stats[STAT_NAMES.index("first")].item() == pytest.approx(4.25 / n)
    assert stats[STAT_NAMES.index("sep")].item() == pytest.approx(0.75 / n)
