"""Head detectors (TransformerLens's previous-token, duplicate-token and induction patterns)."""

import pytest
import torch
from detector_reference import detector_score, detector_scores, previous_token_pattern

from rapids_attn.extract.maps import map_stats, repeat_masks
from rapids_attn.extract.signature import DETECTOR_NAMES, STAT_NAMES

N = 12


def prev_map(n):
    a = torch.zeros(n, n)
    a[0, 0] = 1
    a[torch.arange(1, n), torch.arange(n - 1)] = 1
    return a


def test_previous_token_detector_is_one_on_a_pure_map_and_1_over_n_on_uniform():
    none = torch.zeros(N, dtype=torch.bool)
    prev = STAT_NAMES.index("prev")
    assert float(map_stats(prev_map(N)[None], none, none, False)[0, prev]) == pytest.approx(1.0)
    uniform = torch.full((1, N, N), 1 / N)
    assert float(map_stats(uniform, none, none, False)[0, prev]) == pytest.approx(1 / N)


def test_repeat_masks_follow_transformerlens():
    ids = torch.tensor([5, 7, 9, 5, 7, 9])  # a sequence repeated once
    dup, ind = repeat_masks(ids)
    assert dup.nonzero().tolist() == [[3, 0], [4, 1], [5, 2]]
    # induction: the token after the earlier copy (row 3 = token 5 -> position 1, ..., row 5 = token 9 -> 3)
    assert ind.nonzero().tolist() == [[3, 1], [4, 2], [5, 3]]
    assert not ind[:3].any()  # nothing repeats yet in the first half


def test_detector_scores_pure_and_uniform():
    ids = torch.tensor([1, 2, 3, 4, 1, 2, 3, 4])
    n = len(ids)
    dup, ind = repeat_masks(ids)
    pure_ind = torch.eye(n)  # rows without an induction target attend to themselves
    for i, j in ind.nonzero().tolist():
        pure_ind[i] = 0
        pure_ind[i, j] = 1
    scores = dict(zip(DETECTOR_NAMES, detector_scores(pure_ind[None], ids)[0].tolist()))
    assert scores["induction_cond"] == pytest.approx(1.0)  # pure where the pattern is possible
    assert scores["induction_head"] == pytest.approx(4 / 8)  # TransformerLens: 4 of 8 rows have a target
    assert scores["duplicate_token_head"] == pytest.approx(0.0)  # not on the duplicate itself
    assert scores["duplicate_token_cond"] == pytest.approx(0.0)
    uniform = torch.full((1, n, n), 1 / n)
    assert float(detector_score(uniform, dup, conditional=True)[0]) == pytest.approx(1 / n)
    assert float(detector_score(uniform, dup)[0]) == pytest.approx(4 / n / n)  # 4 rows, 1/n each, of n


def test_previous_token_head_is_transformerlens_score_not_the_prev_stat():
    """On a pure previous-token map of n tokens, row 0 has no previous token: TransformerLens scores
    (n - 1) / n, the ``prev`` stat (a mean over rows 1..n-1) 1."""
    ids = torch.arange(N)
    scores = dict(zip(DETECTOR_NAMES, detector_scores(prev_map(N)[None], ids)[0].tolist()))
    assert scores["previous_token_head"] == pytest.approx((N - 1) / N)
    none = torch.zeros(N, dtype=torch.bool)
    assert float(map_stats(prev_map(N)[None], none, none, False)[0, STAT_NAMES.index("prev")]) == pytest.approx(1.0)
    assert float(detector_score(prev_map(N)[None], previous_token_pattern(N))[0]) == pytest.approx((N - 1) / N)


def test_no_repeats_gives_zero_and_nan_conditionally():
    ids = torch.arange(6)
    scores = detector_scores(torch.full((2, 6, 6), 1 / 6), ids)
    names = list(DETECTOR_NAMES)
    for name in ("duplicate_token_head", "induction_head"):
        assert (scores[:, names.index(name)] == 0).all()  # TransformerLens: no target, no mass on it
    for name in ("duplicate_token_cond", "induction_cond"):
        assert torch.isnan(scores[:, names.index(name)]).all()  # undefined


@pytest.mark.parametrize("causal", [True, False])
def test_windowed_streaming_and_retrieval_count_what_each_window_shows(causal):
    """Under model.long_inputs: windows a row sees its window only: a row counts for the streaming score where
    its window holds a key past the sink and the recent window, and a retrieval target where its window holds
    it; the reducer fed window by window equals the references on the placed map with that visibility, and
    differs from reading the placed map as if every row had seen the whole input."""
    from detector_reference import retrieval_score, streaming_score

    from rapids_attn.extract.maps import LayerReducer, TokenMasks
    from rapids_attn.extract.windows import WindowSink, plan_windows

    g = torch.Generator().manual_seed(0)
    n, width, overlap, heads = 300, 120, 30, 2
    ids = torch.randint(3, 23, (n,), generator=g)  # 20 tokens: far copies everywhere
    plan = plan_windows(ids.tolist(), None, width, overlap, (0, 0), causal)
    size = max(len(w.positions) for w in plan.windows)
    block = torch.zeros(len(plan.windows), heads, size, size)
    for k, w in enumerate(plan.windows):
        m = len(w.positions)
        s = torch.randn(heads, m, m, generator=g) * 3
        s[..., 0] += 2.0  # a sink on each window's first token
        if causal:
            s = s.masked_fill(torch.ones(m, m, dtype=torch.bool).triu(1), float("-inf"))
        block[k, :, :m, :m] = s.softmax(-1)
    masks = TokenMasks.from_ids(ids[None], torch.tensor([1]), torch.tensor([2]))
    red = LayerReducer([n], masks, [0], list(range(heads)), 8, 4, causal, "cpu")
    sink = WindowSink(red, plan, causal)
    sink.add_rows(0, block, 0, selected=True)
    sink.end_layer(0)
    dense = torch.zeros(heads, n, n)
    visible = torch.zeros(n, n, dtype=torch.bool)
    sinks = torch.full((n, 4), -1)
    for k, w in enumerate(plan.windows):
        rows = w.positions[w.owned]
        dense[:, rows[:, None], w.positions[None, :]] = block[k][:, w.owned][..., : len(w.positions)]
        visible[rows, w.span[0] : w.span[1]] = True
        sinks[rows] = w.positions[:4]  # the window's first tokens: what the model read as its start
    if causal:
        visible &= torch.ones(n, n, dtype=torch.bool).tril()
    got = red.detectors[0, 0]
    st, rt = DETECTOR_NAMES.index("streaming"), DETECTOR_NAMES.index("retrieval")
    want_s, want_r = streaming_score(dense, causal, visible, sinks), retrieval_score(dense, ids, visible)
    assert torch.isfinite(want_s).all() and torch.isfinite(want_r).all()
    torch.testing.assert_close(got[:, st], want_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[:, rt], want_r, atol=1e-5, rtol=1e-5)
    # the whole input's reading counts rows their windows never let past the recent window, and the input's first
    # tokens as the sink where the model read each window's own
    assert (streaming_score(dense, causal) - want_s).abs().max() > 1e-3
    assert (streaming_score(dense, causal, visible) - want_s).abs().max() > 1e-3
    assert (retrieval_score(dense, ids) - want_r).abs().max() > 1e-3
