"""Generator version 3's circuit maps (rapids_attn/patterns/circuits.py): valid maps whose dominant
circuit shows the property that defines its type."""

import numpy as np
import pytest
import torch

from rapids_attn.extract.maps import map_stats, offset_profile
from rapids_attn.extract.signature import STAT_NAMES
from rapids_attn.patterns.circuits import MARGIN, circuit_map
from rapids_attn.patterns.generator import PATTERN_TYPES, _tokens

S = {n: i for i, n in enumerate(STAT_NAMES)}


def _maps(t: str, causal: bool, count: int = 12, n: int = 96):
    out = []
    for i in range(200):
        rng = np.random.default_rng([7, i])
        tk = _tokens(rng, n, causal)
        made = circuit_map(rng, tk, t)
        if made is not None:
            out.append((made, tk))
        if len(out) == count:
            return out
    raise AssertionError(f"{t}: only {len(out)} of 200 circuit draws passed the label check")


def _stats(a: np.ndarray, tk) -> np.ndarray:
    sep = torch.zeros(tk.n, dtype=torch.bool)
    sep[tk.sep_pos] = True
    punct = torch.zeros(tk.n, dtype=torch.bool)
    punct[tk.punct_pos] = True
    return map_stats(torch.from_numpy(a)[None].float(), sep, punct, tk.causal)[0].numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", PATTERN_TYPES)
def test_circuit_maps_are_valid_and_show_their_type(t, causal):
    if t == "next" and causal:
        pytest.skip("a causal map has no next type")
    maps = _maps(t, causal)
    for (a, masses), tk in maps:
        assert a.shape == (tk.n, tk.n) and np.all(a >= 0)
        np.testing.assert_allclose(a.sum(1), 1.0, atol=1e-9)
        if causal:
            assert np.all(np.triu(a, 1) == 0)
        others = [m for k, m in masses.items() if k != t]
        if t != "broad":
            assert masses[t] >= 0.40 and masses[t] - max(others, default=0.0) >= MARGIN
    stats = np.stack([_stats(a, tk) for (a, _), tk in maps])
    profile = np.stack([offset_profile(torch.from_numpy(a)[None].float())[0].numpy() for (a, _), tk in maps])
    mean = {k: float(stats[:, i].mean()) for k, i in S.items()}
    if t in ("self", "prev", "next"):
        assert mean[t] >= 0.35 and mean[t] == max(mean["self"], mean["prev"], mean["next"])
    elif t in ("first", "sep", "punct"):
        assert mean[t] >= 0.35
    elif t == "band":
        # the window's mass: spread over the near offsets, none of them holding most of it
        near = profile.sum(1)
        assert near.mean() >= 0.3 and (profile.max(1) / near).mean() < 0.6
    elif t == "broad":
        assert mean["entropy_norm"] >= 0.7
    elif t == "hetero":
        assert mean["max"] >= 0.2 and mean["entropy_norm"] < 0.7
    elif t == "block":
        assert mean["entropy_norm"] < 0.95 and mean["first"] < 0.35
