"""The relevance worker batches by token length (rapids_attn/relevance/work.py) and the head distance skips
padded query rows (rapids_attn/relevance/atlas.py, ``js_sums``), issue 32: the result is each example's own,
in the examples' order, and the padding paid is what sorting implies, less than arrival order's."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from rapids_attn.devices import ExtractDevices
from rapids_attn.job import ModelConfig
from rapids_attn.relevance.atlas import js_sums
from rapids_attn.relevance.work import ANSWER, SECOND, RelevanceTask, RelevanceWorker

METHODS = ("head_mean", "last_layer", "rollout", "grad_rollout", "flow", "pagerank")


def _task(model_dir, examples, batch_size=3, **kw) -> RelevanceTask:
    task = RelevanceTask(
        model=ModelConfig(name=str(model_dir)),
        device=ExtractDevices("cpu"),
        threads=1,
        max_length=128,
        batch_size=batch_size,
        examples=tuple(examples),
        methods=METHODS,
        query="auto",
        residual=0.5,
        flow_max_tokens=40,  # the longest inputs get no flow: the skipped count must not depend on the order
        pagerank_layer=-1,
        pagerank_heads=None,
        atlas=True,
        key="test",
    )
    return replace(task, **kw)


def _forwards(worker):
    """Record each forward's attention mask (the worker's batches, in the order they ran); returns (masks, handle)."""
    masks: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        masks.append(kwargs["attention_mask"].detach().cpu())

    return masks, worker.model.register_forward_pre_hook(hook, with_kwargs=True)


def _mixed_pairs():
    """Question-context pairs with gold answers whose lengths arrive unsorted: long, short, long, ..."""
    from helpers import CORPUS

    from rapids_attn.data.example import Example

    out = []
    for i, reps in enumerate([6, 1, 4, 1, 7, 2, 3, 1]):
        context = " ".join([CORPUS[i % 5]] * reps)
        words = CORPUS[i % 5].rstrip(".?").split()
        out.append(Example(id=f"q{i}", text=f"what about {words[1]}?", text_pair=context, answers=(words[-1],)))
    return out


def _mixed_texts():
    from helpers import CORPUS

    from rapids_attn.data.example import Example

    return [Example(id=f"t{i}", text=" ".join([CORPUS[i % 5]] * r)) for i, r in enumerate([5, 1, 3, 1, 6, 2, 1])]


@pytest.fixture(scope="module")
def bert(tiny_bert_dir):
    return RelevanceWorker(_task(tiny_bert_dir, _mixed_pairs()))


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2_dir):
    return RelevanceWorker(_task(tiny_gpt2_dir, _mixed_texts()))


def _check_equal(got, want, atol=2e-5):
    """Relevance to float tolerance (NaN where NaN), roles and lengths exactly."""
    assert got.relevance.shape == want.relevance.shape
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.roles, want.roles)
    np.testing.assert_array_equal(np.isnan(got.relevance), np.isnan(want.relevance))
    np.testing.assert_allclose(got.relevance, want.relevance, atol=atol, rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize("which", ["bert", "gpt2"])
def test_sorted_batches_give_each_example_its_own_result_in_arrival_order(which, request):
    """Batched by length, every example's relevance, roles and length land at its own place and equal the
    example run alone (no padding at all) and the arrival-order batches; the distance sums and rows too."""
    worker = request.getfixturevalue(which)
    model_dir = request.getfixturevalue("tiny_bert_dir" if which == "bert" else "tiny_gpt2_dir")
    examples = _mixed_pairs() if which == "bert" else _mixed_texts()
    task = _task(model_dir, examples)
    masks, handle = _forwards(worker)
    try:
        got = worker.run(task)
    finally:
        handle.remove()
    # the batches ran shortest first (so this is not arrival order, which is unsorted here)
    ran = np.concatenate([m.sum(1).numpy() for m in masks])
    assert np.all(np.diff(ran) >= 0) and not np.all(np.diff(got.lengths) >= 0)
    assert sorted(ran.tolist()) == sorted(got.lengths.tolist())

    arrival = worker.run(replace(task, sort_by_length=False))
    _check_equal(got, arrival)
    alone = [worker.run(replace(task, examples=(e,))) for e in examples]
    t = got.relevance.shape[-1]
    for i, one in enumerate(alone):
        n = int(one.lengths[0])
        assert got.lengths[i] == n
        np.testing.assert_array_equal(got.roles[i, :n], one.roles[0])
        assert np.all(got.roles[i, n:] == 0) and np.all(np.isnan(got.relevance[i, :, n:]))
        np.testing.assert_allclose(got.relevance[i, :, :n], one.relevance[0], atol=2e-5, rtol=1e-4, equal_nan=True)
    assert t == max(int(one.lengths[0]) for one in alone)
    if which == "bert":  # the pairs' roles: second segment and answer bits are there to be misplaced
        assert np.any(got.roles & SECOND) and np.any(got.roles & ANSWER)
    assert got.flow_skipped == arrival.flow_skipped == sum(one.flow_skipped for one in alone) > 0
    assert got.distance_rows == arrival.distance_rows == sum(one.distance_rows for one in alone) == got.lengths.sum()
    # float32 maps: a row's JS is a difference of entropies near ln T, so each row carries ~1e-7 of rounding
    summed = sum(one.distance_sums for one in alone)
    atol = 1e-7 * got.distance_rows
    np.testing.assert_allclose(got.distance_sums, summed, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(got.distance_sums, arrival.distance_sums, rtol=1e-5, atol=atol)
    assert got.query == ("first" if which == "bert" else "last")


def test_sorted_batches_pay_exactly_the_sorted_padding(bert, tiny_bert_dir):
    """The word fox k times is k + 2 tokens ([CLS] ... [SEP]), so the padding is known in advance: lengths
    32 4 19 7 31 5 13 26 (137 real tokens) in batches of 3 pay 3x7 + 3x26 + 2x32 = 163 tokens sorted
    (4 5 7 | 13 19 26 | 31 32), 3x32 + 3x31 + 2x26 = 241 in arrival order (32 4 19 | 7 31 5 | 13 26)."""
    from rapids_attn.data.example import Example

    words = [30, 2, 17, 5, 29, 3, 11, 24]
    task = _task(tiny_bert_dir, [Example(id=str(i), text=" ".join(["fox"] * k)) for i, k in enumerate(words)])
    masks, handle = _forwards(bert)
    try:
        got = bert.run(task)
    finally:
        handle.remove()
    assert [m.shape for m in masks] == [(3, 7), (3, 26), (2, 32)] and sum(m.numel() for m in masks) == 163
    assert got.lengths.tolist() == [k + 2 for k in words] and int(got.lengths.sum()) == 137
    assert got.padded_tokens == 163
    arrival = bert.run(replace(task, sort_by_length=False))
    assert arrival.padded_tokens == 241
    _check_equal(got, arrival)


def _maps(rng, b, h, t, lengths, dtype=torch.float64):
    a = np.zeros((b, h, t, t))
    for e, n in enumerate(lengths):
        s = rng.normal(0, 2, size=(h, n, n))
        x = np.exp(s - s.max(-1, keepdims=True))
        a[e, :, :n, :n] = x / x.sum(-1, keepdims=True)
    return torch.from_numpy(a).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_js_sums_reads_only_the_valid_query_rows(dtype):
    """A padded batch gives the sum of its examples' unpadded slices, whatever the padded query rows hold
    (a fully masked softmax row can be NaN; here also inf and noise): they never enter the sums."""
    rng = np.random.default_rng(3)
    lengths = [4, 11, 7]
    a = _maps(rng, 3, 5, 11, lengths, dtype)
    clean, clean_rows = js_sums(a, torch.tensor(lengths))
    dirty = a.clone()
    for e, n in enumerate(lengths):
        dirty[e, :, n:, :] = [float("inf"), 3.0, float("nan")][e]  # the second example fills its 11 rows
    got, rows = js_sums(dirty, torch.tensor(lengths))
    want = torch.zeros(5, 5, dtype=torch.float64)
    for e, n in enumerate(lengths):
        s, r = js_sums(a[e : e + 1, :, :n, :n], torch.tensor([n]))
        assert r == n
        want += s
    assert rows == clean_rows == sum(lengths)
    assert got.dtype == torch.float64 and torch.isfinite(got).all()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    torch.testing.assert_close(clean, want, atol=tol, rtol=tol)
