"""Tests for rapids_attn.extract.batching: length-bucketed batches under a token budget, and
tokenization with truncation flags."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rapids_attn.data.example import Example
from rapids_attn.extract.batching import BatchCost, length_batches, tokenize


def check_batches(lengths: list[int], budget: int, max_bs: int) -> list[list[int]]:
    batches = length_batches(lengths, budget, max_bs)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths))), "every index exactly once"
    for b in batches:
        assert b, "no empty batch"
        assert len(b) <= max_bs
        longest = max(lengths[i] for i in b)
        if len(b) * longest > budget:
            assert len(b) == 1 and lengths[b[0]] > budget, (b, [lengths[i] for i in b])
    return batches


def test_simple_packing():
    lengths = [10, 50, 20, 50, 10, 30]
    batches = check_batches(lengths, budget=100, max_bs=8)
    # sorted longest first: 50, 50 | 30, 20, 10 | 10 -> (30*3 = 90 <= 100, 4*30 = 120 > 100)
    assert [[lengths[i] for i in b] for b in batches] == [[50, 50], [30, 20, 10], [10]]


def test_over_budget_inputs_get_a_batch_of_their_own():
    lengths = [300, 5, 400, 5, 5]
    batches = check_batches(lengths, budget=100, max_bs=16)
    assert [2] in batches and [0] in batches
    assert sorted(len(b) for b in batches) == [1, 1, 3]


def test_max_batch_size():
    batches = check_batches([3] * 25, budget=10_000, max_bs=4)
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4, 4, 1]


def test_empty_and_single():
    assert length_batches([], 100, 4) == []
    assert length_batches([7], 100, 4) == [[0]]
    assert length_batches([700], 100, 4) == [[0]]


def test_batches_are_length_sorted_so_padding_stays_small():
    lengths = [5, 100, 6, 99, 7, 98]
    batches = check_batches(lengths, budget=300, max_bs=3)
    assert [sorted(lengths[i] for i in b) for b in batches] == [[98, 99, 100], [5, 6, 7]]


@pytest.mark.parametrize("seed", range(8))
def test_random_length_lists(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 200)
    lengths = [rng.randint(1, 600) for _ in range(n)]
    budget = rng.choice([64, 256, 1000, 4096])
    max_bs = rng.choice([1, 3, 16, 512])
    batches = check_batches(lengths, budget, max_bs)
    # greedy packing: a batch is only closed when the next input would break a limit
    order = [i for b in batches for i in b]
    for b, nxt in itertools.pairwise(batches):
        longest = max(lengths[i] for i in b)
        assert len(b) == max_bs or (len(b) + 1) * longest > budget
        assert lengths[nxt[0]] <= min(lengths[i] for i in b)
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)


# --- tokenize ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_tok():
    from transformers import AutoTokenizer

    from rapids_attn.extract.model import resolve_model_name

    return AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))


def test_tokenize_text_pairs_with_special_tokens(bert_tok):
    ex = [Example("a", "who ran?", "ann ran to the shop."), Example("b", "why?", "because.")]
    tok = tokenize(bert_tok, ex, max_length=64)
    assert tok.truncated == [False, False]
    for e, ids in zip(ex, tok.input_ids):
        q = bert_tok(e.text, add_special_tokens=False)["input_ids"]
        c = bert_tok(e.text_pair, add_special_tokens=False)["input_ids"]
        cls, sep = bert_tok.cls_token_id, bert_tok.sep_token_id
        assert ids == [cls, *q, sep, *c, sep]
    assert tok.lengths == [len(x) for x in tok.input_ids]


def test_tokenize_single_texts(bert_tok):
    tok = tokenize(bert_tok, [Example("a", "hello world"), Example("b", "the fox")], max_length=32)
    assert all(ids[0] == bert_tok.cls_token_id and ids[-1] == bert_tok.sep_token_id for ids in tok.input_ids)
    assert tok.input_ids[0].count(bert_tok.sep_token_id) == 1


def test_truncation_flags_exactly_the_long_inputs(bert_tok):
    max_length = 16
    ctx_short = "the fox ran."
    ctx_long = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
    ex = [
        Example("s", "who ran?", ctx_short),
        Example("l", "who jumps over the dog?", ctx_long),
        Example("s2", "a", "b"),
        Example("l2", "why?", ctx_long),
    ]
    full = [len(bert_tok(e.text, e.text_pair)["input_ids"]) for e in ex]
    tok = tokenize(bert_tok, ex, max_length=max_length)
    assert tok.truncated == [n > max_length for n in full] == [False, True, False, True]
    for ids, was_cut, n in zip(tok.input_ids, tok.truncated, full):
        if was_cut:
            assert len(ids) == max_length
            assert ids[0] == bert_tok.cls_token_id and ids[-1] == bert_tok.sep_token_id
            assert ids.count(bert_tok.sep_token_id) == 2  # both segments kept, the longest one cut
        else:
            assert len(ids) == n
    # longest-first: the question survives intact, the context is cut
    q = bert_tok("who jumps over the dog?", add_special_tokens=False)["input_ids"]
    assert tok.input_ids[1][1 : 1 + len(q)] == q


def test_input_exactly_at_max_length_is_not_truncated(bert_tok):
    e = Example("x", "one two three", "four five")
    n = len(bert_tok(e.text, e.text_pair)["input_ids"])
    tok = tokenize(bert_tok, [e], max_length=n)
    assert tok.truncated == [False] and tok.lengths == [n]
    tok = tokenize(bert_tok, [e], max_length=n - 1)
    assert tok.truncated == [True] and tok.lengths == [n - 1]


def test_mixed_singles_and_pairs_rejected(bert_tok):
    with pytest.raises(ValueError, match="mixes"):
        tokenize(bert_tok, [Example("a", "x", "y"), Example("b", "z")], max_length=32)


def test_attention_budget_bounds_batch_times_length_squared():
    lengths = [500, 480, 300, 290, 120, 100, 100, 90, 40, 30]
    budget = 200 * 200 * 2
    batches = length_batches(lengths, token_budget=10_000, max_batch_size=64, attention_budget=budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * longest * longest <= budget
    # without it, the token budget alone would put the two longest inputs together
    assert any(0 in b and 1 in b for b in length_batches(lengths, 10_000, 64))
    assert not any(0 in b and 1 in b for b in batches)


def _cost_of(batches, lengths, cost):
    return sum(cost(len(b), max(lengths[i] for i in b)) for b in batches)


def test_least_cost_grouping_keeps_a_long_input_off_short_ones():
    """Greedy packing fills the token budget: one 100-token input pads nine 10-token ones (10 x 100^2 attention
    pairs for 100^2 + 9 x 10^2 real). The least-cost grouping gives it a batch of its own."""
    lengths = [100] + [10] * 9
    assert length_batches(lengths, 1000, 64) == [list(range(10))]
    cost = BatchCost(token=100.0, batch=1000.0)
    batches = length_batches(lengths, 1000, 64, cost=cost)
    assert batches == [[0], list(range(1, 10))]
    assert _cost_of(batches, lengths, cost) < _cost_of([list(range(10))], lengths, cost)


@pytest.mark.parametrize("seed", range(6))
def test_least_cost_grouping_is_optimal_and_within_the_budgets(seed):
    """Against every grouping of the sorted lengths into consecutive runs (brute force on 9 inputs): the least
    cost, every index once, the budgets kept (an over-budget input alone)."""
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(1, 20), rng.randint(20, 120)]) for _ in range(9)]
    budget, max_bs, att = 240, 4, 120 * 120 * 2
    cost = BatchCost(token=rng.choice([0.0, 30.0, 300.0]), batch=rng.choice([0.0, 500.0, 20_000.0]))
    got = length_batches(lengths, budget, max_bs, att, cost=cost)
    assert sorted(i for b in got for i in b) == list(range(9))
    for b in got:
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or (len(b) <= max_bs and len(b) * longest <= budget and len(b) * longest**2 <= att)
    order = sorted(range(9), key=lambda i: -lengths[i])
    best = math.inf
    for cuts in itertools.product([0, 1], repeat=8):  # a cut after sorted position k or not
        runs, cur = [], [order[0]]
        for k, cut in enumerate(cuts):
            if cut:
                runs.append(cur)
                cur = []
            cur.append(order[k + 1])
        runs.append(cur)
        ok = all(
            len(r) == 1
            or (
                len(r) <= max_bs
                and len(r) * max(lengths[i] for i in r) <= budget
                and len(r) * max(lengths[i] for i in r) ** 2 <= att
            )
            for r in runs
        )
        if ok:
            best = min(best, _cost_of(runs, lengths, cost))
    assert _cost_of(got, lengths, cost) == pytest.approx(best)


def test_the_extractor_groups_by_least_cost_on_the_cpu_only():
    assert BatchCost.for_model(384, "cuda:0") is None
    c = BatchCost.for_model(384, "cpu")
    assert c.token == 768 and c.batch == 64 * 768
