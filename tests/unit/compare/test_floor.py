"""The noise floor (issue 46): change beside seed-to-seed change, intervals over questions and seeds, and
Benjamini-Hochberg across heads, on synthetic distances whose truth is known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import false_discovery_control

from rapids_attn.compare.floor import benjamini_hochberg, bootstrap_excess, floor_pairs, noise_floor


def test_benjamini_hochberg_matches_scipy_and_the_step_up_rule():
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(0, 0.002, 8), rng.uniform(0, 1, 40)])
    called, adjusted = benjamini_hochberg(p, 0.05)
    np.testing.assert_allclose(adjusted, false_discovery_control(p, method="bh"), rtol=1e-12)
    assert (called == (adjusted <= 0.05)).all()
    # the step-up rule: a p-value above its own threshold is still called when a larger one passes its own
    called, _ = benjamini_hochberg(np.array([0.03, 0.04, 0.2]), 0.1)
    assert called.tolist() == [True, True, False]  # 0.04 <= 0.1 * 2/3
    called, adjusted = benjamini_hochberg(np.array([np.nan, 0.001]), 0.05)
    assert called.tolist() == [False, True] and np.isnan(adjusted[0])


def test_floor_pairs_name_each_pair_once():
    assert floor_pairs("base", ["a", "b", "c"], "shuf") == [
        ("base", "a"),
        ("base", "b"),
        ("base", "c"),
        ("a", "b"),
        ("a", "c"),
        ("b", "c"),
        ("base", "shuf"),
    ]


def _distances(rng, n=120, tunes=("f0", "f1", "f2"), lift=None):
    """Per-example distances of 2 layers x 4 heads: every pair of models differs by noise around 0.1; the
    base-to-fine-tune distance of the heads in ``lift`` is higher by the lift."""
    lift = lift or {}
    shape = (n, 2, 4)
    out = {}
    for i, a in enumerate(tunes):
        d = 0.1 + 0.02 * rng.standard_normal(shape)
        for (layer, head), v in lift.items():
            d[:, layer, head] += v
        out[("base", a)] = np.abs(d)
        for b in tunes[i + 1 :]:
            out[(a, b)] = np.abs(0.1 + 0.02 * rng.standard_normal(shape))
    return out


def test_only_heads_whose_change_exceeds_the_seed_floor_are_called_changed():
    rng = np.random.default_rng(1)
    d = _distances(rng, lift={(0, 1): 0.08, (1, 3): 0.05})
    out = noise_floor(d, "base", ["f0", "f1", "f2"], resamples=500, seed=0)
    changed = np.asarray(out["heads"]["changed"])
    assert changed.sum() == 2 and changed[0, 1] and changed[1, 3]
    assert [(r["layer"], r["head"]) for r in out["changed"]] == [(0, 1), (1, 3)]  # by excess, largest first
    excess = np.asarray(out["heads"]["excess"])
    assert excess[0, 1, 0] == pytest.approx(0.08, abs=0.01)
    assert excess[0, 1, 1] <= excess[0, 1, 0] <= excess[0, 1, 2]
    # enough resamples that the smallest p-value can pass BH's first step over 8 heads
    assert out["resamples"] >= 20 * 8 / 0.05
    assert out["n_within_floor"] >= 5  # the six unchanged heads mostly reach 0


def test_a_change_no_larger_than_seed_to_seed_change_is_not_a_finding():
    """Every fine-tune moves every head by as much as two seeds differ: nothing is called changed, at any size."""
    rng = np.random.default_rng(2)
    out = noise_floor(_distances(rng), "base", ["f0", "f1", "f2"], resamples=500, seed=0)
    assert out["n_changed"] == 0
    change = np.asarray(out["heads"]["change"])[..., 0]
    assert (change > 0.09).all()  # large changes, all within the floor


def test_the_interval_widens_when_the_seeds_disagree():
    """The bootstrap resamples fine-tunes as well as questions: one fine-tune far from the others widens it."""
    rng = np.random.default_rng(3)
    n, s = 200, 3
    change = 0.2 + 0.01 * rng.standard_normal((s, n, 1))
    floor = 0.1 + 0.01 * rng.standard_normal((3, n, 1))
    agree = bootstrap_excess(change, floor, 0.95, 2000, 0)
    spread = change.copy()
    spread[2] += 0.1  # one seed changed far more
    disagree = bootstrap_excess(spread, floor, 0.95, 2000, 0)
    width = lambda b: b.excess[0, 2] - b.excess[0, 1]
    assert width(disagree) > 5 * width(agree)


def test_the_shuffled_control_separates_task_change_from_training_change():
    rng = np.random.default_rng(4)
    d = _distances(rng, lift={(0, 0): 0.1, (0, 2): 0.1})
    ctrl = 0.1 + 0.02 * rng.standard_normal((120, 2, 4))
    ctrl[:, 0, 2] += 0.1  # training on shuffled labels moves head (0, 2) as much: not the task
    d[("base", "shuf")] = np.abs(ctrl)
    out = noise_floor(d, "base", ["f0", "f1", "f2"], "shuf", resamples=500, seed=0)
    assert np.asarray(out["heads"]["changed"])[0, [0, 2]].all()
    task = np.asarray(out["control"]["task_specific"])
    assert task[0, 0] and not task[0, 2] and out["control"]["n_task_specific"] == 1


def test_one_fine_tune_has_no_floor():
    with pytest.raises(ValueError, match="two fine-tunes"):
        noise_floor({("base", "f0"): np.zeros((3, 1, 1))}, "base", ["f0"])


def test_the_causal_check_finds_costly_changed_heads_and_not_a_shuffled_cost():
    rng = np.random.default_rng(5)
    out = noise_floor(_distances(rng, lift={(0, 1): 0.08, (1, 3): 0.08}), "base", ["f0", "f1", "f2"], resamples=500)
    from rapids_attn.compare.floor import causal_check

    cost = np.full((2, 4), 0.01)
    cost[0, 1], cost[1, 3] = 0.3, 0.25  # the changed heads are the costly ones
    ci = np.stack([cost - 0.02, cost + 0.02], -1)
    got = causal_check(out, cost, ci, permutations=2000)
    assert got["changed"] == 2 and got["difference"] == pytest.approx(0.265)
    assert got["p"] < 0.05 and got["spearman"] > 0.4
    assert got["changed_costly"] == 2 and got["others_costly"] == 0
    # costs unrelated to the change: nothing to find (exactly 2 of the 28 ways to pick 2 of 8 heads reach it)
    cost = np.full((2, 4), 0.01)
    cost[0, 0], cost[1, 0] = 0.3, 0.25
    got = causal_check(out, cost, permutations=2000)
    assert got["difference"] < 0 and got["p"] > 0.5
