"""Head-wise probing: the informative head is found, folds are shared and seeded, task labels parse, and the
nested best-heads selection does not leak."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rapids_attn.heads import probe
from rapids_attn.heads.probe import best_heads_probe, probe_heads, task_labels


def _planted(n=300, layers=2, heads=3, d=8, at=(1, 2), seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    x = rng.normal(size=(n, layers, heads, d)).astype(np.float16)
    x[:, at[0], at[1], :3] += 4.0 * np.eye(3)[y]  # the class, linearly, in one head only
    return x, y


def test_the_planted_head_is_found_and_the_others_sit_at_the_majority_baseline():
    x, y = _planted()
    out = probe_heads(x, y, folds=5, seed=0)
    acc = out["accuracy"]
    assert acc.shape == (2, 3) and out["accuracy_std"].shape == (2, 3)
    assert acc[1, 2] > 0.95
    others = np.delete(acc.ravel(), 1 * 3 + 2)
    assert np.all(np.abs(others - out["majority"]) < 0.12), (others, out["majority"])
    assert out["majority"] == pytest.approx(np.bincount(y).max() / len(y), abs=0.02)
    assert (out["folds"], out["n"], out["classes"]) == (5, 300, 3)


def test_every_head_gets_the_same_seeded_folds(monkeypatch):
    x, y = _planted(n=60, heads=2, at=(1, 1))
    seen = []
    real = probe.cross_val_score

    def spy(estimator, xx, yy, cv):
        seen.append([test.tolist() for _, test in cv])
        return real(estimator, xx, yy, cv=cv)

    monkeypatch.setattr(probe, "cross_val_score", spy)
    first = probe_heads(x, y, folds=3, seed=7)
    assert len(seen) == 2 * 2 + 1  # every head, then the majority baseline
    assert all(s == seen[0] for s in seen)
    again = probe_heads(x, y, folds=3, seed=7)
    assert seen[-1] == seen[0]
    np.testing.assert_array_equal(first["accuracy"], again["accuracy"])
    probe_heads(x, y, folds=3, seed=8)
    assert seen[-1] != seen[0]


def test_rows_marked_minus_one_are_left_out_and_too_small_classes_are_refused():
    x, y = _planted(n=60)
    y = y.copy()
    y[:10] = -1
    assert probe_heads(x, y, folds=3)["n"] == 50
    y[10:] = 0
    y[10:12] = 1
    with pytest.raises(ValueError, match="class sizes"):
        probe_heads(x, y, folds=3)


@pytest.mark.parametrize(
    ("text", "wh"),
    [
        ("What is the capital of France?", "what"),
        ("How many people live there?", "how"),
        ("In what year did it open?", "what"),
        ("WHO designed the bridge?", "who"),
        ("Whose idea was it, and why?", "who"),
        ("Somewhat odd: when did it end?", "when"),
        ("Which river, and where does it flow?", "which"),
        ("Name the largest city.", "other"),
        ("Showhow is not a word; why not?", "why"),
    ],
)
def test_wh_word_is_the_first_wh_word_on_word_boundaries(text, wh):
    assert probe._wh_word(text) == wh


def test_wh_word_merges_rare_types_into_other():
    texts = ["What a?"] * 6 + ["Who b?"] * 6 + ["Why c?"] * 2 + ["Name d."] * 4
    y, classes = task_labels("wh_word", {"text": texts}, folds=5)
    assert classes == ["other", "what", "who"]
    assert np.bincount(y).tolist() == [6, 6, 6]  # two why + four without a wh-word


def test_label_task_excludes_unlabelled_and_needs_two_classes():
    labels = ["answerable"] * 7 + ["impossible"] * 6 + [""] * 3 + ["odd"] * 2
    y, classes = task_labels("label", {"label": labels}, folds=5)
    assert classes == ["answerable", "impossible"]  # "odd" merged into other, still under 5: excluded
    assert y.tolist() == [0] * 7 + [1] * 6 + [-1] * 5
    assert task_labels("label", {"label": [""] * 20}) is None
    assert task_labels("label", {"label": ["a"] * 20}) is None
    with pytest.raises(ValueError, match="unknown probing task"):
        task_labels("sentiment", {"label": labels})


def test_length_bins_are_nearly_equal_frequency_and_deterministic():
    n_tokens = np.random.default_rng(0).poisson(30, size=1200)
    y, classes = task_labels("length", {"n_tokens": n_tokens})
    assert len(classes) == 6
    sizes = np.bincount(y)
    assert sizes.min() > 0.6 * 200 and sizes.max() < 1.4 * 200, sizes
    for k, name in enumerate(classes):  # a length sits in the bin whose range names it
        lo, hi = map(int, name.split("-"))
        assert np.all((n_tokens[y == k] >= lo) & (n_tokens[y == k] <= hi))
    again, _ = task_labels("length", {"n_tokens": n_tokens.copy()})
    np.testing.assert_array_equal(y, again)


def test_few_distinct_lengths_give_fewer_bins_none_empty_or_too_small():
    y, classes = task_labels("length", {"n_tokens": [5] * 50 + [6] * 40 + [7] * 3 + [9] * 30}, folds=5)
    assert classes == ["5-5", "6-6", "7-9"]  # the 3 sevens join their smaller neighbour
    assert np.bincount(y).tolist() == [50, 40, 33]
    assert task_labels("length", {"n_tokens": [12] * 40}) is None


def test_best_heads_beat_noise_and_find_the_planted_head():
    x, y = _planted(n=200, layers=2, heads=3)
    acc = probe_heads(x, y, folds=4)["accuracy"]
    noise = np.random.default_rng(1).normal(size=(200, 16))
    out = best_heads_probe(x, y, noise, top_k=1, accuracy=acc, folds=4)
    assert out["best_heads"] > 0.95 and out["reference"] < 0.5
    assert out["heads_chosen"] == [(1, 2)] and out["heads_by_accuracy"] == [(1, 2)] and out["k"] == 1


def test_nested_selection_does_not_leak_on_pure_noise():
    rng = np.random.default_rng(3)
    n = 300
    x = rng.normal(size=(n, 4, 6, 8)).astype(np.float32)
    y = rng.integers(0, 2, size=n)
    base = probe_heads(x, y, folds=5, seed=0)
    out = best_heads_probe(x, y, rng.normal(size=(n, 8)), top_k=3, accuracy=base["accuracy"], folds=5)
    assert out["best_heads"] < base["majority"] + 0.1, (out, base["majority"])
    assert len(out["heads_chosen"]) == 3


def test_72_heads_of_width_32_over_1000_examples_probe_well_under_a_minute():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 6, 12, 32)).astype(np.float16)
    y = rng.integers(0, 4, size=1000)
    start = time.perf_counter()
    out = probe_heads(x, y, folds=5)
    assert time.perf_counter() - start < 45
    assert out["accuracy"].shape == (6, 12)


def test_heads_are_ranked_on_each_outer_training_fold_only(monkeypatch):
    x, y = _planted(n=60, heads=2, at=(1, 1))
    x = x.astype(np.float32)
    x[:, 0, 0, 0] = np.arange(60)  # a row id, to see which rows the ranking gets
    seen = []
    real = probe._head_scores

    def spy(xx, yy, splits, max_iter, n_jobs):
        seen.append(set(xx[:, 0, 0, 0].astype(int).tolist()))
        return real(xx, yy, splits, max_iter, n_jobs)

    monkeypatch.setattr(probe, "_head_scores", spy)
    best_heads_probe(x, y, x[:, 1, 1], top_k=1, accuracy=np.zeros((2, 2)), folds=3, seed=5)
    outer = probe._splits(y, 3, 5)
    assert seen == [set(train.tolist()) for train, _ in outer]
