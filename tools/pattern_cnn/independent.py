"""An attention-map generator for evaluation only, written apart from the training generator.

``rapids_attn/patterns/generator.py`` (the training data) builds each map as a *mixture of
row-stochastic components* with log-normal row jitter and a noise floor. This module shares none of
its code or its choices; it builds maps the way attention is computed, as a **softmax of scores**:

    A[i, :] = softmax over the keys row i can see of ( target scores + sink + key salience + noise )

- **Targets.** Each family names, per query row, a set of ``k`` target keys and gives them a score
  ``beta = log(n / k) + delta`` (``delta`` uniform in [1, 3.5]), so the targets take roughly
  e^delta / (e^delta + 1) of the row (0.73-0.97) whatever the length, before the noise.
- **Noise model.** i.i.d. Gaussian noise on every score (sigma uniform in [0.2, 1.2]), a per-key
  salience N(0, tau) shared by all rows (tau uniform in [0, 0.6]), and in half the maps an attention
  sink on position 0 with a bias up to ``log(n) - 1.5`` (at most ~18% of a flat row).
- **Lengths.** ``n = 10 + Gamma(shape 2, scale 45)``, clipped to [10, 448] (mean about 100, a
  long tail), not log-uniform in [8, 512].
- **Token roles.** Position 0 is [CLS]/BOS. Punctuation comes from a renewal process: sentence ends
  every 6-30 tokens (geometric gaps, mean 14) and commas (mean gap 9). Separators close 1-3
  segments at random cut points; in bidirectional maps the last token is a separator 70% of the
  time (never for ``last``). Causal maps have 1-2 separators, the first in the first half (rows
  before it see none and spread their mass over what they see, instead of falling back to the
  first token).
- **Causal share** 40% for the families a causal mask allows (not ``next``, not ``last``).

Families: the ten training types (``KNOWN``) and four the training never made (``UNSEEN``):

==============  ===================================================================================
family          target keys of row i
==============  ===================================================================================
self/prev/next  i / i-1 / i+1 (rows without one: themselves); neighbours of the target get a lower score
first           0
sep, punct      the separator / punctuation positions, each with its own popularity
block           the query's segment (segments: separators and sentence ends, none over 60% of n)
broad           none: only the salience field (stronger here), the noise and the sink
band            \\|i - j\\| <= w, w in 2..10 (at most n/4), the score falling off quadratically
hetero          1-6 random keys of its own
columns         2-4 fixed random keys (not roles), the same for every row  (unseen)
two_back        i - 2  (unseen)
left_window     i-w .. i-1, w in 3..8: a window to the left only, without the diagonal  (unseen)
last            the last token, which is no separator  (unseen; bidirectional only)
==============  ===================================================================================

Map ``index`` of stream ``seed`` comes from ``numpy.random.default_rng([SALT, seed, index])``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KNOWN = ("self", "prev", "next", "first", "sep", "punct", "block", "broad", "band", "hetero")
UNSEEN = ("columns", "two_back", "left_window", "last")
FAMILIES = KNOWN + UNSEEN
BIDIRECTIONAL_ONLY = ("next", "last")
SALT = 0x1D3  # keeps these streams apart from anything seeded with [seed, index]
N_LO, N_HI = 10, 448
CAUSAL_SHARE = 0.4


@dataclass
class IndependentMap:
    attn: np.ndarray  # [n, n] float32, row-stochastic (lower-triangular when causal)
    family: str
    sep: np.ndarray  # [n] bool
    punct: np.ndarray  # [n] bool
    causal: bool
    segment: np.ndarray  # [n] int: segment id of each token (what ``block`` attends within)

    @property
    def n(self) -> int:
        return self.attn.shape[0]


def _length(rng: np.random.Generator) -> int:
    return int(np.clip(N_LO + rng.gamma(2.0, 45.0), N_LO, N_HI))


def _renewal(rng, n: int, mean_gap: float, min_gap: int = 2) -> np.ndarray:
    """Positions 1..n-1 hit by a renewal process with geometric gaps."""
    out, pos = [], 0
    while True:
        pos += min_gap + rng.geometric(1.0 / max(mean_gap - min_gap, 1.0))
        if pos >= n:
            return np.asarray(out, dtype=np.int64)
        out.append(pos)


def _roles(rng, n: int, causal: bool, family: str):
    """sep, punct masks and segment ids (separators and sentence ends close segments)."""
    sep = np.zeros(n, bool)
    punct = np.zeros(n, bool)
    n_seg = int(rng.choice([1, 2, 3], p=[0.3, 0.5, 0.2]))
    if causal or family == "sep":  # a causal map has no final separator: keep at least one cut
        n_seg = max(n_seg, 2)
    cuts = np.sort(rng.choice(np.arange(2, n - 1), size=min(n_seg - 1, n - 3), replace=False))
    if causal:  # at least half the rows see a separator
        cuts[0] = int(rng.integers(2, max(3, n // 2)))
        cuts = np.unique(cuts)
    sep[cuts] = True
    if not causal and family != "last" and rng.random() < 0.7:
        sep[n - 1] = True
    ends = _renewal(rng, n, rng.uniform(6, 30))
    commas = _renewal(rng, n, 9.0, 3)
    punct[ends] = True
    punct[commas] = True
    punct[sep] = False
    punct[0] = sep[0] = False
    if family == "last":
        punct[n - 1] = False
    boundary = sep | np.isin(np.arange(n), ends)
    seg = np.concatenate([[0], np.cumsum(boundary[:-1])])  # a boundary token closes its segment
    while np.bincount(seg).max() > 0.6 * n:  # split segments over 60% of the length
        big = int(np.bincount(seg).argmax())
        idx = np.flatnonzero(seg == big)
        cut = int(rng.integers(idx[0] + 1, idx[-1] + 1))
        seg[cut:] += 1
    return sep, punct, seg


def _targets(rng, family: str, n: int, causal: bool, sep, punct, seg) -> np.ndarray:
    """[n, n] float scores in [0, 1] marking each row's target keys (1 = full target score),
    and the number of targets per row enters through the caller's beta."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    t = np.zeros((n, n))

    def offset(d: int):
        tgt = i[:, 0] + d
        tgt = np.where((tgt < 0) | (tgt >= n), i[:, 0], tgt)
        fall = rng.uniform(0.35, 0.7)  # neighbours of the target keep this share of the score
        dist = np.abs(j - tgt[:, None])
        return np.where(dist == 0, 1.0, np.where(dist == 1, fall * rng.uniform(0.3, 1.0), 0.0))

    if family in ("self", "prev", "next", "two_back"):
        t = offset({"self": 0, "prev": -1, "next": 1, "two_back": -2}[family])
    elif family == "first":
        t[:, 0] = 1.0
    elif family in ("sep", "punct"):
        cols = np.flatnonzero(sep if family == "sep" else punct)
        t[:, cols] = rng.uniform(0.6, 1.0, size=len(cols))
    elif family == "block":
        t = (seg[:, None] == seg[None, :]).astype(float)
    elif family == "band":
        w = int(rng.integers(2, max(2, min(10, n // 4)) + 1))
        d = np.abs(i - j)
        t = np.where(d <= w, 1.0 - rng.uniform(0.0, 0.5) * (d / w) ** 2, 0.0)
    elif family == "hetero":
        for r in range(n):
            hi = r + 1 if causal else n
            m = min(int(rng.integers(1, 7)), hi)
            t[r, rng.choice(hi, size=m, replace=False)] = rng.uniform(0.5, 1.0, size=m)
    elif family == "columns":
        free = np.flatnonzero(~sep & ~punct)
        free = free[(free > 0) & (free < (max(3, int(0.4 * n)) if causal else n))]
        m = min(int(rng.integers(2, 5)), len(free))
        t[:, rng.choice(free, size=m, replace=False)] = rng.uniform(0.7, 1.0, size=m)
    elif family == "left_window":
        w = int(rng.integers(3, 9))
        d = i - j
        t = ((d >= 1) & (d <= w)).astype(float) * rng.uniform(0.8, 1.0, size=(n, 1))
        t[0, 0] = 1.0
    elif family == "last":
        t[:, n - 1] = 1.0
    elif family != "broad":
        raise ValueError(f"unknown family {family!r}")
    return t


def sample(seed: int, index: int, family: str | None = None) -> IndependentMap:
    """Map ``index`` of stream ``seed``; its family is ``FAMILIES[index % 14]`` unless given."""
    rng = np.random.default_rng([SALT, seed, index])
    family = FAMILIES[index % len(FAMILIES)] if family is None else family
    n = _length(rng)
    causal = family not in BIDIRECTIONAL_ONLY and rng.random() < CAUSAL_SHARE
    sep, punct, seg = _roles(rng, n, causal, family)
    visible = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    t = _targets(rng, family, n, causal, sep, punct, seg) * visible
    k = np.maximum((t > 0).sum(1, keepdims=True), 1)  # targets per row
    beta = np.log(np.maximum(visible.sum(1, keepdims=True), 2) / k) + rng.uniform(1.0, 3.5)
    scores = beta * t
    salience = rng.normal(0.0, rng.uniform(0.0, 0.6), size=n)
    if family == "broad":  # a smooth preference over keys instead of targets
        walk = np.cumsum(rng.normal(size=n))
        salience = salience + rng.uniform(0.3, 1.0) * (walk - walk.mean()) / max(walk.std(), 1e-9)
    scores = scores + salience[None, :] + rng.normal(0.0, rng.uniform(0.2, 1.2), size=(n, n))
    if rng.random() < 0.5:
        scores[:, 0] += rng.uniform(0.0, max(np.log(n) - 1.5, 0.0))
    scores = np.where(visible, scores, -np.inf)
    scores -= scores.max(1, keepdims=True)
    a = np.exp(scores)
    a /= a.sum(1, keepdims=True)
    return IndependentMap(a.astype(np.float32), family, sep, punct, bool(causal), seg)


def generate(seed: int, per_family: int, families=FAMILIES) -> list[IndependentMap]:
    """``per_family`` maps of each family in ``families`` from stream ``seed``."""
    out = []
    for f_idx, family in enumerate(families):
        base = FAMILIES.index(family) if family in FAMILIES else f_idx
        out += [sample(seed, base + len(FAMILIES) * r, family) for r in range(per_family)]
    return out
