"""The evaluation-only generator (tools/pattern_cnn/independent.py): valid maps, seeded, and each
family shows the property that defines it."""

import numpy as np
import pytest
import torch

from rapids_attn.extract.maps import map_stats, offset_profile
from rapids_attn.extract.signature import STAT_NAMES
from tools.pattern_cnn.independent import BIDIRECTIONAL_ONLY, FAMILIES, generate, sample

S = {n: i for i, n in enumerate(STAT_NAMES)}


@pytest.fixture(scope="module")
def maps():
    return generate(seed=5, per_family=8)


def _stats(m):
    crop = torch.from_numpy(m.attn)[None]
    return map_stats(crop, torch.from_numpy(m.sep), torch.from_numpy(m.punct), m.causal)[0].numpy()


def _profile(m):
    return offset_profile(torch.from_numpy(m.attn)[None])[0].numpy()  # offsets -4..4


def test_maps_are_row_stochastic_and_causal_ones_lower_triangular(maps):
    assert {m.family for m in maps} == set(FAMILIES)
    assert any(m.causal for m in maps) and not all(m.causal for m in maps)
    for m in maps:
        assert m.attn.dtype == np.float32 and m.attn.shape == (m.n, m.n) and 10 <= m.n <= 448
        assert np.all(m.attn >= 0)
        np.testing.assert_allclose(m.attn.sum(1), 1.0, atol=1e-5)
        if m.causal:
            assert m.family not in BIDIRECTIONAL_ONLY
            assert np.all(np.triu(m.attn, 1) == 0)
        assert not m.sep[0] and not m.punct[0] and not np.any(m.sep & m.punct)


def test_seeded():
    a, b, c = sample(3, 17), sample(3, 17), sample(4, 17)
    assert a.family == b.family == FAMILIES[17 % len(FAMILIES)]
    np.testing.assert_array_equal(a.attn, b.attn)
    np.testing.assert_array_equal(a.sep, b.sep)
    assert a.attn.shape != c.attn.shape or not np.array_equal(a.attn, c.attn)
    # generate is the union of per-index samples
    np.testing.assert_array_equal(generate(3, 2)[1].attn, sample(3, len(FAMILIES)).attn)


def _near(m, w: int) -> float:
    """Mean row mass within |i - j| <= w."""
    i, j = np.indices(m.attn.shape)
    return float((m.attn * (np.abs(i - j) <= w)).sum(1).mean())


@pytest.mark.parametrize(
    ("family", "check"),
    [
        ("self", lambda m: _profile(m).argmax() == 4),
        ("prev", lambda m: _profile(m).argmax() == 3),
        ("next", lambda m: _profile(m).argmax() == 5),
        ("two_back", lambda m: _profile(m).argmax() == 2),
        ("first", lambda m: _stats(m)[S["first"]] > 0.5),
        ("sep", lambda m: _stats(m)[S["sep"]] > 0.3),
        ("punct", lambda m: _stats(m)[S["punct"]] > 0.5),
        ("broad", lambda m: _stats(m)[S["entropy_norm"]] > 0.7),
        ("band", lambda m: _near(m, 10) > 0.5 and _profile(m).max() < 0.5 * _profile(m).sum()),
        ("left_window", lambda m: _profile(m)[:4].sum() > 2 * _profile(m)[4:].sum()),
        ("last", lambda m: m.attn[:, -1].mean() > 0.5 and not m.sep[-1] and not m.punct[-1]),
    ],
)
def test_each_family_has_its_defining_property(maps, family, check):
    hits = [bool(check(m)) for m in maps if m.family == family]
    assert sum(hits) >= 0.75 * len(hits), (family, hits)


def test_block_hetero_and_columns(maps):
    for m in (m for m in maps if m.family == "block"):  # most mass inside the query's segment, spread
        inside = (m.attn * (m.segment[:, None] == m.segment[None, :])).sum(1)
        assert inside.mean() > 0.5 and np.median(m.attn.max(1)) < 0.5
        assert np.bincount(m.segment).max() <= 0.6 * m.n + 1
    for m in (m for m in maps if m.family == "hetero"):  # rows differ: their top keys are not one column
        assert len(set(m.attn.argmax(1).tolist())) > m.n / 4
    for m in (m for m in maps if m.family == "columns"):  # a few shared columns hold most of the mass
        col = m.attn.mean(0)
        top = np.sort(col)[-4:].sum()
        assert top > 0.4, top
        assert not np.any(m.sep[np.argsort(col)[-1:]])
