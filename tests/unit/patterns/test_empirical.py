"""tools/pattern_cnn/empirical.py: the empirical-style evaluation generator.

Every map is a row-stochastic float32 square, causal maps are lower-triangular, the roles are valid, the
generator is seeded and ``generate`` is ``sample`` per index, and each family's defining property, measured from
the map and its roles alone (not from the generator's target mask), is stronger in that family than in any other.
"""

from __future__ import annotations

import numpy as np
import pytest

from tools.pattern_cnn import empirical as E

PER_FAMILY = 12


@pytest.fixture(scope="module")
def maps():
    return E.generate(0, PER_FAMILY)


def _by_family(maps):
    out: dict[str, list] = {f: [] for f in E.FAMILIES}
    for m in maps:
        out[m.family].append(m)
    return out


def test_constants():
    assert E.KNOWN == ("self", "prev", "next", "first", "sep", "punct", "block", "broad", "band", "hetero")
    assert E.FAMILIES == E.KNOWN + E.UNSEEN
    assert not set(E.UNSEEN) & set(E.KNOWN) and len(set(E.UNSEEN)) == len(E.UNSEEN) >= 2
    assert set(E.BIDIRECTIONAL_ONLY) <= set(E.FAMILIES) and "next" in E.BIDIRECTIONAL_ONLY


def test_row_stochastic(maps):
    assert len(maps) == PER_FAMILY * len(E.FAMILIES)
    for m in maps:
        a = m.attn
        assert a.dtype == np.float32 and a.shape == (m.n, m.n)
        assert np.isfinite(a).all() and (a >= 0).all()
        np.testing.assert_allclose(a.sum(axis=1), 1.0, atol=1e-5)


def test_causal(maps):
    causal = [m for m in maps if m.causal]
    assert all(np.all(np.triu(m.attn, 1) == 0) for m in causal)
    assert not any(m.causal for m in maps if m.family in E.BIDIRECTIONAL_ONLY)
    eligible = [m for m in maps if m.family not in E.BIDIRECTIONAL_ONLY]
    assert 0.2 < np.mean([m.causal for m in eligible]) < 0.5
    # bidirectional maps do look ahead
    assert np.mean([np.triu(m.attn, 1).sum() / m.n for m in maps if not m.causal]) > 0.1


def test_lengths_bimodal(maps):
    ns = np.array([m.n for m in maps])
    assert (((ns >= 10) & (ns <= 40)) | ((ns >= 100) & (ns <= 500))).all()
    assert 0.3 < np.mean(ns <= 40) < 0.7


def test_roles(maps):
    shares = []
    for m in maps:
        n = m.n
        assert m.sep.shape == m.punct.shape == m.segment.shape == (n,)
        assert m.sep.dtype == m.punct.dtype == bool and np.issubdtype(m.segment.dtype, np.integer)
        assert not m.sep[0] and not m.punct[0] and not (m.sep & m.punct).any()
        assert 1 <= m.sep.sum() <= 3 and m.punct.any()
        if m.causal:
            assert np.flatnonzero(m.sep)[0] < n / 2
        seg = m.segment
        step = np.diff(seg)
        assert seg[0] == 0 and set(np.unique(step)) <= {0, 1}
        # a segment is closed only by a separator or a punctuation token, and every separator closes one
        closes = np.flatnonzero(step == 1)
        assert (m.sep[closes] | m.punct[closes]).all()
        assert (step[np.flatnonzero(m.sep[:-1])] == 1).all()
        assert np.bincount(seg).max() <= E.MAX_SEGMENT_SHARE * n
        shares.append(m.punct.mean())
    assert 0.05 < np.median(shares) < 0.12


def test_seeded():
    a, b = E.sample(3, 17), E.sample(3, 17)
    assert a.family == b.family == E.FAMILIES[17 % len(E.FAMILIES)]
    np.testing.assert_array_equal(a.attn, b.attn)
    np.testing.assert_array_equal(a.segment, b.segment)
    c, d = E.sample(4, 17), E.sample(3, 17 + len(E.FAMILIES))
    assert c.n != a.n or not np.array_equal(c.attn, a.attn)
    assert d.n != a.n or not np.array_equal(d.attn, a.attn)
    assert E.sample(3, 17, "band").family == "band"
    with pytest.raises(ValueError):
        E.sample(0, 0, "nope")


def test_generate_is_sample_per_index():
    fams = ("prev", "rare")
    got = E.generate(5, 2, fams)
    want = [E.sample(5, r * len(E.FAMILIES) + E.FAMILIES.index(f), f) for f in fams for r in range(2)]
    assert [m.family for m in got] == ["prev", "prev", "rare", "rare"]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.attn, w.attn)
        np.testing.assert_array_equal(g.sep, w.sep)
        assert g.causal == w.causal
    # a family's maps do not depend on which others are asked for
    np.testing.assert_array_equal(E.generate(5, 2, ("rare",))[1].attn, got[3].attn)


def test_target_strength_and_hard_maps():
    pairs = [E.sample_with_targets(1, k) for k in range(6 * len(E.FAMILIES))]
    per_map = np.array([E.target_mass(m, t) for m, t in pairs])
    rows = np.concatenate([(m.attn * t).sum(axis=1)[t.any(axis=1)] for m, t in pairs if m.family != "broad"])
    assert np.mean(rows > 0.5) > 0.6  # the target holds the majority on most rows
    assert 0.0 < np.mean(per_map < 0.5) < 0.35  # but some maps are hard
    # rows vary strongly within a map: some near the target, some switched off
    spread = [np.std((m.attn * t).sum(axis=1)[t.any(axis=1)]) for m, t in pairs if m.n > 40 and m.family != "broad"]
    assert np.median(spread) > 0.1


# --- each family's defining property, from the map and its roles only ------------------------------------------


def _offsets(a: np.ndarray) -> np.ndarray:
    """Mean mass per row at each offset d = i - j, indexed d + n - 1."""
    n = a.shape[0]
    i = np.arange(n)
    d = (i[:, None] - i[None, :]) + n - 1
    return np.bincount(d.ravel(), weights=a.ravel().astype(np.float64), minlength=2 * n - 1) / n


def _vis(m) -> np.ndarray:
    return np.tril(np.ones((m.n, m.n), bool)) if m.causal else np.ones((m.n, m.n), bool)


def _overlap(a: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per row, sum_j min(a_ij, u_ij) with u uniform over the row's keys (0 for a row with none)."""
    u = keys / np.maximum(keys.sum(axis=1, keepdims=True), 1)
    return np.minimum(a, u).sum(axis=1)


def _segment_start(m) -> np.ndarray:
    seg = m.segment
    starts = np.array([np.flatnonzero(seg == s)[0] for s in range(seg.max() + 1)])
    starts[0] = 1
    return starts[seg]


def _role(m) -> np.ndarray:
    return m.sep | m.punct | (np.arange(m.n) == 0)


def score_self(m):
    return float(np.trace(m.attn) / m.n)


def score_prev(m):
    return float(np.diagonal(m.attn, -1).mean())


def score_next(m):
    return float(np.diagonal(m.attn, 1).mean())


def score_first(m):
    return float(m.attn[1:, 0].mean())


def score_sep(m):
    return float(m.attn[1:, m.sep].sum(axis=1).mean())


def score_punct(m):
    return float(m.attn[1:, m.punct].sum(axis=1).mean())


def score_block(m):
    n = m.n
    keys = (m.segment[:, None] == m.segment[None, :]) & _vis(m) & (np.arange(n)[None, :] > 0)
    return float(_overlap(m.attn, keys)[1:].mean())


def score_broad(m):
    return float(_overlap(m.attn, _vis(m))[1:].mean())


def score_band(m):
    """Spread over a window centred on the query, beyond what spreading over all keys or over the query's own
    segment gives (a band crosses segment ends, a block does not); best window 2..10."""
    n = m.n
    i = np.arange(n)
    dist = np.abs(i[:, None] - i[None, :])
    vis = _vis(m)
    own = (m.segment[:, None] == m.segment[None, :]) & vis & (i[None, :] > 0)
    alt = np.maximum(_overlap(m.attn, vis), 0.5 * _overlap(m.attn, own))
    return max(float((_overlap(m.attn, (dist <= w) & vis) - alt)[1:].mean()) for w in range(2, 11))


def score_hetero(m):
    """Few far, non-role keys per row, that neither a common offset nor a common column explains."""
    a = m.attn.astype(np.float64)
    n = m.n
    i = np.arange(n)
    d = i[:, None] - i[None, :]
    far = (np.abs(d) >= 2) & ~_role(m)[None, :]
    top3 = np.sort(np.where(far, a, 0.0), axis=1)[:, -3:].sum(axis=1).mean()
    off = _offsets(a)
    offset = max(off[n - 1 + k] for k in range(-(n - 1), n) if abs(k) >= 2)
    col = np.where(far, a, 0.0).sum(axis=0) / np.maximum(far.sum(axis=0), 1)
    return float(top3 - offset - np.sort(col)[-3:].sum())


def score_periodic(m):
    """Mass at offsets +-p, +-2p, ... against their neighbours +-(kp -+ 1), for the best p in 3..7: the peak at p
    and the peaks at its further multiples must both stand out (the smaller of the two contrasts)."""
    n = m.n
    off = _offsets(m.attn)

    def at(k):
        return off[n - 1 + k] if abs(k) < n else 0.0

    def contrast(mult):
        on = sum(at(k) + at(-k) for k in mult)
        near = sum(at(k - 1) + at(k + 1) + at(-k + 1) + at(-k - 1) for k in mult) / 2
        return on - near

    return float(max(min(contrast([p]), contrast(range(2 * p, n, p))) for p in range(3, 8)))


def score_segment_start(m):
    n = m.n
    start = _segment_start(m)
    rows = np.flatnonzero((np.arange(n) != start) & (np.arange(n) > 0) & (start <= np.arange(n) if m.causal else True))
    return float(m.attn[rows, start[rows]].mean()) if rows.size else 0.0


def score_rare(m):
    """A few non-role columns attended from other segments, beyond what the typical column gets."""
    a = m.attn.astype(np.float64)
    other = (m.segment[:, None] != m.segment[None, :]) & _vis(m)
    keys = ~_role(m) & (other.sum(axis=0) > 0)
    col = np.where(other, a, 0.0).sum(axis=0) / np.maximum(other.sum(axis=0), 1)
    col = col[keys]
    return float(np.sort(col)[-3:].sum() - 3 * np.median(col)) if col.size >= 3 else 0.0


SCORES = {f: globals()[f"score_{f}"] for f in E.FAMILIES}


def test_each_family_shows_its_property_most(maps):
    fams = _by_family(maps)
    table = {prop: {f: float(np.mean([SCORES[prop](m) for m in ms])) for f, ms in fams.items()} for prop in E.FAMILIES}
    for prop, row in table.items():
        others = {f: v for f, v in row.items() if f != prop}
        rival = max(others, key=others.get)
        assert row[prop] > others[rival] + 0.05, (prop, row[prop], rival, others[rival])
