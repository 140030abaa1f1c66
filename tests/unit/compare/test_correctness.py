"""Whether attention statistics predict correctness (issue 46): grouped cross-validation on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest

from rapids_attn.compare.correctness import grouped_auc, predicts_correct


def _data(rng, n=400, signal=True):
    stats = rng.standard_normal((n, 2, 3, 2))
    lengths = rng.integers(50, 300, n)
    groups = np.repeat(np.arange(8), n // 8)
    logit = 2.5 * stats[:, 1, 2, 0] if signal else np.zeros(n)
    right = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    return stats, lengths, right, groups


def test_a_statistic_that_drives_correctness_is_found_on_unseen_groups():
    stats, lengths, right, groups = _data(np.random.default_rng(0))
    out = predicts_correct(stats, lengths, right, groups, ["entropy", "first"], resamples=300)
    assert out["stats"]["auc"] > 0.75 and out["stats"]["ci"][0] > 0.6
    assert out["length"]["ci"][0] < 0.5 < out["length"]["ci"][1] + 0.05  # the length carries nothing here
    top = out["carried_by"][0]
    assert (top["layer"], top["head"], top["stat"]) == (1, 2, "entropy") and top["coef"] > 0
    assert out["features"] == 12 and out["stats"]["folds"] == 5


def test_no_signal_gives_an_interval_around_a_half():
    stats, lengths, right, groups = _data(np.random.default_rng(1), signal=False)
    out = predicts_correct(stats, lengths, right, groups, ["entropy", "first"], resamples=300)
    lo, hi = out["stats"]["ci"]
    assert lo < 0.5 < hi


def test_an_outcome_the_scores_cannot_be_fitted_on_is_refused_in_one_line():
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(6), 20)
    x = rng.standard_normal((120, 1))
    y = (groups % 2).astype(int)
    out = grouped_auc(x, y, groups, resamples=100)
    assert out["folds"] == 5 and out["examples"] == 120 and out["positives"] == 60
    with pytest.raises(ValueError, match="same outcome"):
        grouped_auc(x, np.ones(120), groups)
    with pytest.raises(ValueError, match="two groups"):
        grouped_auc(x, y, np.zeros(120))
