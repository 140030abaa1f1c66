"""tools/pattern_cnn/mechanistic.py: the evaluation-only generator of softmax(QK^T) maps.

The family checks measure each map from its attention, role masks, segments and token ids with their own code (not
the generator's target masks), and most compare the family against the other families' maps, so a family that lost
its defining circuit (or a circuit that leaked into every family) fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from tools.pattern_cnn import mechanistic as mech

PER_FAMILY = 12


@pytest.fixture(scope="module")
def traced() -> dict[str, list[tuple[mech.MechanisticMap, mech.Trace]]]:
    pairs = mech.generate_traced(0, PER_FAMILY)
    out: dict[str, list] = {f: [] for f in mech.FAMILIES}
    for m, t in pairs:
        out[m.family].append((m, t))
    return out


def _visible(m: mech.MechanisticMap) -> np.ndarray:
    n = m.n
    return np.tril(np.ones((n, n), bool)) if m.causal else np.ones((n, n), bool)


def _mass(m: mech.MechanisticMap, target: np.ndarray) -> float:
    """Mean mass on ``target`` over the rows that can see one (nan when none can)."""
    target = target & _visible(m)
    rows = target.any(axis=1)
    return float((m.attn * target).sum(axis=1)[rows].mean()) if rows.any() else float("nan")


def _lift(m: mech.MechanisticMap, column: np.ndarray) -> float:
    """Mass on the marked key columns divided by their share of the visible keys (1 = no preference)."""
    target = np.broadcast_to(column[None, :], (m.n, m.n)) & _visible(m)
    rows = target.any(axis=1)
    if not rows.any():
        return float("nan")
    share = target.sum(axis=1) / _visible(m).sum(axis=1)
    return float(((m.attn * target).sum(axis=1)[rows] / share[rows]).mean())


def _offset(m: mech.MechanisticMap, k: int) -> float:
    i = np.arange(m.n)
    return _mass(m, i[None, :] == i[:, None] + k)


def _entropy(m: mech.MechanisticMap) -> float:
    a = m.attn.astype(np.float64)
    h = -(a * np.log(np.where(a > 0, a, 1.0))).sum(axis=1)
    keys = _visible(m).sum(axis=1)
    rows = keys > 1
    return float((h[rows] / np.log(keys[rows])).mean())


def _same_segment(m: mech.MechanisticMap) -> np.ndarray:
    return m.segment[:, None] == m.segment[None, :]


def _duplicate(m: mech.MechanisticMap, t: mech.Trace) -> np.ndarray:
    tok = t.tokens
    return (tok[:, None] == tok[None, :]) & np.tril(np.ones((m.n, m.n), bool), -1)


def _induction(m: mech.MechanisticMap, t: mech.Trace) -> np.ndarray:
    tok = t.tokens
    before = np.concatenate([[-1], tok[:-1]])
    return (before[None, :] == tok[:, None]) & np.tril(np.ones((m.n, m.n), bool))


def _band(m: mech.MechanisticMap, width: int) -> np.ndarray:
    i = np.arange(m.n)
    return np.abs(i[:, None] - i[None, :]) <= width


def _top3_mass(m: mech.MechanisticMap) -> float:
    return float(np.sort(m.attn, axis=1)[:, -3:].sum(axis=1).mean())


MEASURES = {
    "self": lambda m, t: _offset(m, 0),
    "prev": lambda m, t: _offset(m, -1),
    "next": lambda m, t: _offset(m, 1),
    "first": lambda m, t: _mass(m, np.broadcast_to(np.arange(m.n)[None, :] == 0, (m.n, m.n))),
    "sep": lambda m, t: _mass(m, np.broadcast_to(m.sep[None, :], (m.n, m.n))),
    "punct": lambda m, t: _mass(m, np.broadcast_to(m.punct[None, :], (m.n, m.n))),
    "duplicate": lambda m, t: _mass(m, _duplicate(m, t)),
    "induction": lambda m, t: _mass(m, _induction(m, t)),
}


def _mean(values) -> float:
    return float(np.nanmean(np.asarray(values, dtype=float)))


def _by_family(traced, measure) -> dict[str, float]:
    return {f: _mean([measure(m, t) for m, t in pairs]) for f, pairs in traced.items()}


# -------------------------------------------------------------------------------------------------------- structure


def test_maps_are_row_stochastic_float32(traced):
    for pairs in traced.values():
        for m, _ in pairs:
            assert m.attn.dtype == np.float32 and m.attn.shape == (m.n, m.n)
            assert np.isfinite(m.attn).all() and (m.attn >= 0).all()
            np.testing.assert_allclose(m.attn.sum(axis=1), 1.0, atol=1e-5)


def test_causal_maps_are_lower_triangular_and_about_a_third(traced):
    causal = [m.causal for pairs in traced.values() for m, _ in pairs]
    assert 0.2 < np.mean(causal) < 0.5
    for f, pairs in traced.items():
        for m, _ in pairs:
            if m.causal:
                assert f not in mech.BIDIRECTIONAL_ONLY
                assert not np.triu(m.attn, 1).any()
            else:  # a bidirectional map uses the keys after the query too
                assert np.triu(m.attn, 1).sum() > 0
    assert not any(m.causal for f in mech.BIDIRECTIONAL_ONLY for m in mech.generate(3, 20, (f,)))


def test_roles_segments_and_lengths(traced):
    ns = []
    for pairs in traced.values():
        for m, t in pairs:
            ns.append(m.n)
            assert mech.N_MIN <= m.n <= mech.N_MAX
            for mask in (m.sep, m.punct):
                assert mask.dtype == bool and mask.shape == (m.n,)
            assert not (m.sep & m.punct).any()
            assert not m.sep[0] and not m.punct[0]
            assert 1 <= m.sep.sum() <= 3
            assert t.tokens.shape == (m.n,) and t.tokens[0] == mech.CLS
            seg = m.segment
            assert seg.shape == (m.n,) and np.issubdtype(seg.dtype, np.integer)
            assert seg[0] == 0 and (np.diff(seg) >= 0).all() and (np.diff(seg) <= 1).all()
            assert np.bincount(seg).max() <= mech.MAX_SEGMENT_SHARE * m.n
            # a separator or sentence end closes its segment
            closes = m.sep | np.isin(t.tokens, (mech.PERIOD, mech.QUESTION))
            np.testing.assert_array_equal(np.diff(seg), closes[:-1].astype(int))
    assert 50 < np.median(ns) < 130
    assert np.mean([m.punct.any() for pairs in traced.values() for m, _ in pairs]) > 0.9
    assert max(ns) > 200 and min(ns) < 40


def test_lengths_cover_the_range():
    ns = np.array([mech.sample(5, i).n for i in range(400)])
    assert ns.min() < 25 and ns.max() > 300
    assert 60 <= np.median(ns) <= 120


def test_seeded_determinism_and_indexing():
    a, b = mech.sample(7, 13), mech.sample(7, 13)
    np.testing.assert_array_equal(a.attn, b.attn)
    np.testing.assert_array_equal(a.segment, b.segment)
    assert a.family == mech.FAMILIES[13 % len(mech.FAMILIES)]
    assert not np.array_equal(mech.sample(8, 13).attn, a.attn)
    assert mech.sample(7, 13, "band").family == "band"
    small, large = mech.generate(7, 2), mech.generate(7, 3)
    assert len(small) == 2 * len(mech.FAMILIES) and len(large) == 3 * len(mech.FAMILIES)
    for f, fam in enumerate(mech.FAMILIES):
        for r in range(2):
            m = small[f * 2 + r]
            assert m.family == fam
            np.testing.assert_array_equal(m.attn, large[f * 3 + r].attn)
            np.testing.assert_array_equal(m.attn, mech.sample(7, r * len(mech.FAMILIES) + f).attn)
    only = mech.generate(7, 2, ("induction",))
    np.testing.assert_array_equal(only[1].attn, small[mech.FAMILIES.index("induction") * 2 + 1].attn)


def test_constants_and_bad_family():
    assert mech.KNOWN == ("self", "prev", "next", "first", "sep", "punct", "block", "broad", "band", "hetero")
    assert mech.UNSEEN == ("duplicate", "induction")
    assert mech.FAMILIES == mech.KNOWN + mech.UNSEEN
    assert "next" in mech.BIDIRECTIONAL_ONLY
    with pytest.raises(ValueError):
        mech.sample(0, 0, "diagonal")
    with pytest.raises(ValueError):
        mech.generate(0, 1, ("self", "nope"))


# --------------------------------------------------------------------------------------------------------- families


@pytest.mark.parametrize("family", list(MEASURES))
def test_family_measure_is_highest_on_its_own_maps(traced, family):
    scores = _by_family(traced, MEASURES[family])
    own = scores.pop(family)
    assert own > max(scores.values()), (family, own, scores)


def test_positional_families(traced):
    for family, k in (("self", 0), ("prev", -1), ("next", 1)):
        maps = [m for m, _ in traced[family]]
        own = _mean([_offset(m, k) for m in maps])
        uniform = _mean([1.0 / m.n for m in maps])
        others = [_mean([_offset(m, j) for m in maps]) for j in (-2, -1, 0, 1, 2) if j != k]
        assert own > 0.5 and own > 10 * uniform and own > 3 * max(others), (family, own, others)


def test_first_puts_mass_on_column_zero(traced):
    assert _mean([MEASURES["first"](m, t) for m, t in traced["first"]]) > 0.5


def test_sep_and_punct_prefer_their_role_columns(traced):
    for family, column in (("sep", lambda m: m.sep), ("punct", lambda m: m.punct)):
        maps = [m for m, _ in traced[family]]
        assert _mean([_lift(m, column(m)) for m in maps]) > 5
        assert _mean([MEASURES[family](m, None) for m in maps]) > 0.5


def test_block_stays_in_its_segment(traced):
    maps = [m for m, _ in traced["block"]]
    own = _mean([_mass(m, _same_segment(m)) for m in maps])
    others = _mean([_mass(m, _same_segment(m)) for f in ("broad", "first") for m, _ in traced[f]])
    share = _mean([(_same_segment(m) & _visible(m)).sum() / _visible(m).sum() for m in maps])
    assert own > 0.6 and own > 2 * share and own > others + 0.3, (own, share, others)


def test_broad_is_near_uniform(traced):
    entropy = _by_family(traced, lambda m, t: _entropy(m))
    assert entropy["broad"] > 0.95
    assert entropy["broad"] > max(v for f, v in entropy.items() if f != "broad") + 0.2, entropy


def test_band_covers_a_local_window(traced):
    own = _mean([_mass(m, _band(m, t.width)) for m, t in traced["band"]])
    assert own > 0.6
    assert all(2 <= t.width <= 10 for _, t in traced["band"])
    # a window of width w: the band spreads past the diagonal, unlike self, and is local, unlike broad
    spread = _mean([_mass(m, _band(m, t.width)) - _offset(m, 0) for m, t in traced["band"]])
    assert spread > 0.3
    broad = _mean([_mass(m, _band(m, 5)) for m, _ in traced["broad"]])
    assert own > broad + 0.4


def test_hetero_rows_attend_to_their_own_few_keys(traced):
    maps = [m for m, _ in traced["hetero"]]
    assert _mean([_top3_mass(m) for m in maps]) > 0.6
    assert _mean([_top3_mass(m) for m, _ in traced["broad"]]) < 0.3
    for m in maps:  # not one sink column and not the diagonal: the rows' favourite keys differ
        assert len(np.unique(m.attn.argmax(axis=1))) > 0.2 * m.n
        assert _offset(m, 0) < 0.3


def test_unseen_families_find_repeated_tokens(traced):
    for family, target in (("duplicate", _duplicate), ("induction", _induction)):
        own = _mean([_mass(m, target(m, t)) for m, t in traced[family]])
        assert own > 0.55, (family, own)
        # every map of these families has targets: the repeated span guarantees them
        assert all(target(m, t).any() for m, t in traced[family])
        # the targets are not just what a uniform row gives them
        chance = _mean([_mass(m, target(m, t)) for f in ("broad",) for m, t in traced[f]])
        assert own > 3 * chance
    # duplicate and induction are different heads: each prefers its own target over the other's
    dup = traced["duplicate"]
    ind = traced["induction"]
    assert _mean([_mass(m, _duplicate(m, t)) for m, t in dup]) > _mean([_mass(m, _induction(m, t)) for m, t in dup])
    assert _mean([_mass(m, _induction(m, t)) for m, t in ind]) > _mean([_mass(m, _duplicate(m, t)) for m, t in ind])


def test_dominant_strength_varies_and_some_maps_are_hard(traced):
    masses = []
    for family, pairs in traced.items():
        if family == "broad":
            continue
        values = np.array([mech.target_mass(m, t) for m, t in pairs])
        assert 0.5 < np.nanmedian(values) < 0.98, (family, values)
        masses.extend(values)
    masses = np.array(masses)
    assert (masses < 0.5).mean() > 0.03  # hard maps exist
    assert masses.std() > 0.1


def test_trace_targets_agree_with_the_tests_measures(traced):
    for family in ("self", "prev", "next", "duplicate", "induction"):
        for m, t in traced[family]:
            assert mech.target_mass(m, t) == pytest.approx(MEASURES[family](m, t), abs=1e-6, nan_ok=True)
