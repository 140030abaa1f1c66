"""Head detectors (TransformerLens's previous-token, duplicate-token and induction patterns)."""

import pytest
import torch

from rapids_attn.extract.maps import (
    DETECTOR_NAMES,
    STAT_NAMES,
    detector_score,
    detector_scores,
    map_stats,
    previous_token_pattern,
    repeat_masks,
)

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
