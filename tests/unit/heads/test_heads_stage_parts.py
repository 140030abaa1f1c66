"""The heads stage's pure parts: cluster sets, pruning masks, ablation summaries and pruning curves."""

import numpy as np
import pytest

from rapids_attn.heads.stage import dominant_heads, pruning_masks
from rapids_attn.heads.summary import mean_ci, pruning_curves, removable, summarise_ablation
from rapids_attn.stagekit import sample_positions


def test_sample_positions_leave_out_probes_and_are_seeded():
    groups = ["a"] * 8 + ["probe:repeated-tokens"] * 2
    assert list(sample_positions(10, groups, None, 0)) == list(range(8))
    a, b = sample_positions(10, groups, 5, 3), sample_positions(10, groups, 5, 3)
    assert list(a) == list(b) and len(a) == 5 and list(a) == sorted(a) and max(a) < 8


def test_dominant_heads_by_share_of_non_noise_maps():
    # 10 examples, kept layers [1, 3], kept heads [0, 2]
    c = np.zeros((10, 2, 2), np.int32)
    c[:, 0, 1] = 1  # layer 1 head 2: all cluster 1
    c[:6, 1, 0], c[6:, 1, 0] = 2, 0  # layer 3 head 0: 60% cluster 2
    c[:4, 1, 1], c[4:, 1, 1] = 2, -1  # layer 3 head 2: noise aside, all cluster 2
    out = dominant_heads(c, [1, 3], [0, 2], 0.5)
    assert out == {0: [(1, 0)], 1: [(1, 2)], 2: [(3, 0), (3, 2)]}
    assert 2 not in dominant_heads(c, [1, 3], [0, 2], 0.7) or dominant_heads(c, [1, 3], [0, 2], 0.7)[2] == [(3, 2)]


def test_pruning_masks_remove_heads_cumulatively_in_order():
    order = [(1, 0), (0, 1), (0, 0), (1, 1)]
    masks = pruning_masks(order, 2, 2, steps=4)
    assert [c for c, _ in masks] == [0, 1, 2, 3]
    for c, keep in masks:
        assert keep.sum() == 4 - c
        for layer, head in order[:c]:
            assert keep[layer, head] == 0
    assert masks[-1][1][1, 1] == 1  # never all heads


def test_mean_ci_is_a_t_interval():
    from scipy import stats

    x = np.array([1.0, 2.0, 4.0, 7.0])
    m, lo, hi = mean_ci(x)
    want = stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x))
    assert m == pytest.approx(3.5) and (lo, hi) == pytest.approx(want)
    assert mean_ci(np.array([np.nan, 2.0]))[0] == 2.0


def test_summarise_ablation_pairs_examples_and_signs_cost():
    rng = np.random.default_rng(0)
    base = rng.random(200)
    names = ["base", "head:0:0", "head:0:1", "head:1:0", "head:1:1", "layer:0"]
    y = np.stack([base, base - 0.2, base, base + 0.05, base - 0.01 * rng.random(200), base - 0.3])
    out = summarise_ablation(names, {"recall@1": y, "rr": y}, "recall@1", 2, 2, higher_is_better=True)
    assert out["base"] == pytest.approx(base.mean())
    assert np.asarray(out["effect"])[0, 0] == pytest.approx(-0.2)
    assert np.asarray(out["cost"])[0, 0] == pytest.approx(0.2)
    assert np.asarray(out["cost"])[1, 0] == pytest.approx(-0.05)
    # paired: a constant shift has a zero-width interval even though the scores themselves vary
    assert np.asarray(out["effect_ci"])[0, 0] == pytest.approx([-0.2, -0.2])
    assert out["most_costly"][0] == {"layer": 0, "head": 0, "cost": pytest.approx(0.2), "ci": pytest.approx([0.2, 0.2])}
    assert out["significant"] == {"worse": 2, "better": 1}  # (0,0) and (1,1) hurt, (1,0) helps; (0,1) is 0
    assert out["sets"]["layer:0"]["cost"] == pytest.approx(0.3)
    assert out["sets"]["layer:0"]["ci"] == pytest.approx([0.3, 0.3])  # the cost's interval, not the effect's
    loss = summarise_ablation(names, {"loss": y}, "loss", 2, 2, higher_is_better=False)
    assert np.asarray(loss["cost"])[0, 0] == pytest.approx(-0.2)  # a lower loss is no cost


def test_pruning_curves_merge_random_orders_and_count_removable_heads():
    names = [f"prune:{o}:{c}" for o in ("importance", "random0", "random1") for c in (0, 2, 4)]
    scores = np.array(
        [[0.9] * 5, [0.895] * 5, [0.5] * 5, [0.9] * 5, [0.7] * 5, [0.6] * 5, [0.9] * 5, [0.8] * 5, [0.4] * 5]
    )
    out = pruning_curves(names, {"recall@1": scores}, "recall@1", 0.9, True)
    assert out["importance"]["removed"] == [0, 2, 4] and out["importance"]["removable"] == 2
    assert out["random"]["score"] == pytest.approx([0.9, 0.75, 0.5])
    assert out["random"]["min"] == pytest.approx([0.9, 0.7, 0.4]) and out["random"]["orders"] == 2
    assert out["random"]["removable"] == 0
    assert removable([0, 3, 6], [2.0, 2.005, 2.5], 2.0, higher_is_better=False) == 3


def test_rank_agreement_of_importance_and_ablation():
    from rapids_attn.heads.summary import rank_agreement

    cost = np.array([[0.3, 0.1], [0.2, np.nan]])
    same = np.array([[3.0, 1.0], [2.0, 9.0]])
    out = rank_agreement(cost, same, -same)
    assert out["heads"] == 3
    assert out["raw"]["spearman"] == pytest.approx(1.0) and out["raw"]["kendall"] == pytest.approx(1.0)
    assert out["normalised"]["spearman"] == pytest.approx(-1.0)


def test_probes_say_their_folds_and_why_a_task_was_skipped():
    """Two folds and no label field: the result records both, and the report's note says so (it said "5-fold"
    whatever the run did, and left the skipped tasks to the store's attributes)."""
    from types import SimpleNamespace

    from rapids_attn.explain.heads import _probes_note
    from rapids_attn.heads.summary import run_probes

    rng = np.random.default_rng(0)
    n = 40
    capture = {"heads": rng.normal(size=(n, 2, 2, 4)).astype(np.float32), "hidden": rng.normal(size=(n, 8))}
    meta = {
        "text": [f"{'who' if i % 2 else 'what'} is it {i}?" for i in range(n)],
        "label": [""] * n,
        "n_tokens": list(range(5, 5 + n)),
    }
    out = run_probes(capture, meta, SimpleNamespace(tasks=["label", "wh_word"], folds=2, top_k=2), seed=0)
    assert out["folds"] == 2 and "wh_word" in out["tasks"]
    assert "no labels" in out["skipped"]["label"] and "data.label_field" in out["skipped"]["label"]
    note = _probes_note({"probing": {"wh_word": {}}, "probing_folds": 2, "probing_skipped": out["skipped"]})
    assert "2-fold" in note and "5-fold" not in note and "not probed: label (the examples have no labels" in note
    assert _probes_note({"probing": {}, "probing_skipped": {}}) == "no probes were run (heads.probing)."
