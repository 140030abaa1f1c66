"""Seeded generator of labelled attention maps, and their featurisation by the pipeline's own code.

Every map is a row-stochastic n x n matrix (n log-uniform in [8, 512]) built as a mixture of
*components*, one per pattern type, each itself row-stochastic over the keys a query can see:

    A = (1 - lam) * sum_c W[:, c] * C_c  +  lam * N

- the **dominant** component carries the map's label and a weight in [0.5, 1]; 0 to 3 secondary
  components (drawn with a preference for ``first`` and ``sep``, as in real BERT maps, which put a
  lot of mass on [CLS] and [SEP]) share the rest. The dominant weight exceeds every other weight by
  at least ``MARGIN``, counting the noise floor ``lam * N`` as ``broad`` mass;
- the weights jitter from row to row (log-normal), so rows are not copies of each other;
- ``N`` is a random noise floor over the visible keys (log-normal weights), ``lam`` in [0, 0.25]
  (0 for a fifth of the maps);
- one map-wide temperature ``T`` (log-uniform in [0.4, 2.5]) sets every component's sharpness: how
  far self / previous / next spread to neighbours, how peaked a band, the punctuation stripes, the
  heterogeneous rows and the broad rows are.

Causal maps (30%, never for ``next``, which a causal mask forbids) are lower-triangular: every
component spreads its mass only over keys ``0..i``. Rows that can see none of a component's keys
(a separator that comes later, say) fall back to the first token, as causal models' attention
sinks do.

Token roles: position 0 is [CLS]/BOS. "sep" positions (1 to 3) are placed like SQuAD's
``[CLS] question [SEP] context [SEP]``: the last token, usually one after a question of 5-40% of
the length, sometimes a doubled one (RoBERTa's ``</s></s>``). In causal maps the first separator is
always in the first 35% of the tokens (a causal row cannot see a separator after it). "punct"
positions are 8-15% of the others. Segments (for ``block``) are the question and the context,
split further at a few punctuation positions ("sentences").

Version 2 (``GENERATOR_VERSION``) adds variations that attention computed as a softmax of scores
shows and version 1 did not, each drawn from a stream of its own (``[seed, index, 1]``), so every
other draw is as before:

- causal rows that see none of a component's keys spread over the keys they see, instead of falling
  back to the first token, in half the maps (``SPREAD_SHARE``);
- ``block`` maps cut into sentence-sized blocks at many punctuation positions (``SENTENCE_BLOCK_SHARE``);
- a per-key salience exp(N(0, tau)), tau up to 0.6, shared by all rows (half the maps);
- the map taken back to scores, ``log(A + c / visible keys)``, given Gaussian noise (sigma up to
  0.8) and put through the softmax again (half the maps): multiplicative noise everywhere, and a
  background of up to c / (1 + c) = 23% of each row, kept only where the dominant component still
  wins by ``MARGIN`` counting it as broad mass.

``pure`` maps get the first two (they are token-role and component choices), not the last two.

Version 3 makes ``CIRCUIT_SHARE`` (40%) of the maps another way: as the softmax of summed score
circuits, one per type (rotary-like positional terms, role keys, segments, a bilinear content term;
``rapids_attn/patterns/circuits.py``), when the dominant circuit's targets win the row's mass by
``MARGIN`` (else the map is a mixture as above). Their ``variations["circuits"]`` is True and
their ``mixture`` holds each circuit's mass on its targets.

Each sample is generated from ``numpy.random.default_rng([seed, index])``: the same (seed, index)
gives the same map, so ``generate(seed, 1000)`` is the first 1000 maps of ``generate(seed, 5000)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from rapids_attn.extract.maps import area_resize, map_stats, offset_profile
from rapids_attn.extract.signature import PROFILE_OFFSETS, STAT_NAMES

#: The pattern types, in label order.
PATTERN_TYPES = (
    "self",  # the query's own token (diagonal)
    "prev",  # the previous token (sub-diagonal)
    "next",  # the next token (super-diagonal); bidirectional maps only
    "first",  # vertical stripe on the first token ([CLS] / BOS)
    "sep",  # vertical stripes on separator / end tokens
    "punct",  # vertical stripes on punctuation tokens
    "block",  # attention within the query's segment (question / context / sentence blocks)
    "broad",  # near-uniform over the visible keys
    "band",  # a local window around the diagonal, half-width 2-8
    "hetero",  # heterogeneous: each row its own few random keys
)
TYPE_INDEX = {t: i for i, t in enumerate(PATTERN_TYPES)}

N_MIN, N_MAX = 8, 512
CAUSAL_SHARE = 0.3
MARGIN = 0.15  # dominant weight minus the largest other weight (noise counts as broad), at least
NOISE_MAX = 0.25
#: version 2 adds the variations below (docs/pattern-cnn.md, "Generator version 2")
GENERATOR_VERSION = 3
CIRCUIT_SHARE = 0.4  # version 3: maps made as a softmax of score circuits (rapids_attn/patterns/circuits.py)
SPREAD_SHARE = 0.5  # causal rows that see no target spread over their keys (else fall back to token 0)
SENTENCE_BLOCK_SHARE = 0.3  # block maps cut into sentence-sized blocks
SALIENCE_SHARE = 0.5  # a per-key salience shared by all rows
SALIENCE_MAX = 0.6  # its log-scale sigma, at most
SCORE_NOISE_SHARE = 0.5  # the map as a softmax of noisy scores
SCORE_NOISE_MAX = 0.8  # Gaussian noise on the scores, sigma at most
BACKGROUND_MAX = 0.3  # score-space background c (a share c / (1 + c) of the row)
#: how likely each type is to be drawn as a *secondary* component: [CLS]/[SEP] mass is everywhere
SECONDARY_PRIOR = {
    "self": 1.5,
    "prev": 1.0,
    "next": 1.0,
    "first": 3.0,
    "sep": 3.0,
    "punct": 1.0,
    "block": 1.0,
    "broad": 2.0,
    "band": 1.0,
    "hetero": 1.0,
}


@dataclass
class MapSample:
    """One generated map: ``attn`` [n, n] float32 row-stochastic; ``label`` an index into
    PATTERN_TYPES; ``sep`` / ``punct`` [n] bool token masks; ``causal``; and how it was mixed."""

    attn: np.ndarray
    label: int
    sep: np.ndarray
    punct: np.ndarray
    causal: bool
    mixture: dict  # component name -> mean weight (the noise floor under "noise")
    temperature: float
    variations: dict | None = None  # version 2's draws: spread, sentences, salience, score_noise

    @property
    def n(self) -> int:
        return self.attn.shape[0]

    @property
    def type(self) -> str:
        return PATTERN_TYPES[self.label]


# ------------------------------------------------------------------------------------------------
# token roles


@dataclass
class _Tokens:
    n: int
    causal: bool
    sep_pos: np.ndarray  # sorted positions > 0
    punct_pos: np.ndarray  # sorted positions, disjoint from 0 and sep
    segments: np.ndarray  # [n] segment id of each position (question / context)
    spread: bool = False  # causal rows that see no target: spread over what they see, not on token 0
    sentences: bool = False  # block: segments also end at many punctuation positions (sentence blocks)


def _tokens(rng: np.random.Generator, n: int, causal: bool) -> _Tokens:
    seps = set()
    if causal:
        q = int(rng.integers(1, max(2, int(0.35 * n)) + 1))
        seps.add(min(q, n - 1))
        if rng.random() < 0.5:
            seps.add(n - 1)
    else:
        seps.add(n - 1)
        if rng.random() < 0.75 and n >= 5:
            q = int(rng.integers(max(1, int(0.05 * n)), max(2, int(0.4 * n)) + 1))
            seps.add(min(q, n - 2))
            if rng.random() < 0.2 and q + 1 < n - 1:
                seps.add(q + 1)  # a doubled separator, RoBERTa's </s></s>
    sep_pos = np.array(sorted(seps), dtype=np.int64)
    free = np.setdiff1d(np.arange(1, n), sep_pos)
    k = max(1, round(rng.uniform(0.08, 0.15) * n))
    punct_pos = np.sort(rng.choice(free, size=min(k, len(free)), replace=False))
    early = free[free <= max(1, n // 4)]
    if causal and punct_pos[0] > max(1, n // 4) and len(early):
        # a causal row sees no punctuation after it: keep one in the first quarter, or a causal
        # punct map would be mostly its fallback (the first token)
        punct_pos[0] = rng.choice(early)
        punct_pos = np.sort(punct_pos)
    # segments: everything up to and including a separator belongs to the segment it closes
    seg = np.zeros(n, dtype=np.int64)
    for s in sep_pos:
        seg[s + 1 :] += 1
    return _Tokens(n, causal, sep_pos, punct_pos, seg)


# ------------------------------------------------------------------------------------------------
# components: each returns an [n, n] row-stochastic matrix over the visible keys


def _visible(n: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((n, n))) if causal else np.ones((n, n))


def _normalise(w: np.ndarray, fallback_col: int = 0, spread: bool = False) -> np.ndarray:
    """Rows divided by their sums; an all-zero row puts its mass on ``fallback_col``, or with
    ``spread`` evenly over the keys it can see (0..i; a row with no target then has no pattern)."""
    s = w.sum(1, keepdims=True)
    empty = s[:, 0] <= 0
    if empty.any():
        w = w.copy()
        if spread:
            rows = np.flatnonzero(empty)
            w[rows] = np.arange(w.shape[1])[None, :] <= rows[:, None]
        else:
            w[empty, fallback_col] = 1.0
        s = w.sum(1, keepdims=True)
    return w / s


def _jitter(rng, shape, sigma: float) -> np.ndarray:
    """Log-normal multiplicative noise exp(sigma * z), float32 (the maps are float32 in the end)."""
    if sigma <= 0:
        return np.ones(shape, dtype=np.float32)
    z = rng.standard_normal(shape, dtype=np.float32)
    z *= np.float32(sigma)
    return np.exp(z, out=z)


def _positional(rng, tk: _Tokens, offset: int, temp: float) -> np.ndarray:
    """Mass on key i + offset, spread to its neighbours by exp(-|d| / s), s grows with temperature."""
    n = tk.n
    s = 0.12 * temp * rng.uniform(0.5, 1.5)
    target = np.clip(np.arange(n) + offset, 0, n - 1)[:, None]  # row 0 of prev / last row of next: self
    d = np.abs(np.arange(n)[None, :] - target)
    w = np.where(d <= 3, np.exp(-d / s), 0.0) * _jitter(rng, (n, n), 0.2)
    w *= _visible(n, tk.causal)
    return _normalise(w, 0)


def _first(rng, tk: _Tokens, temp: float) -> np.ndarray:
    w = np.zeros((tk.n, tk.n))
    w[:, 0] = 1.0
    return w


def _stripes(rng, tk: _Tokens, cols: np.ndarray, temp: float, local: bool) -> np.ndarray:
    """Vertical stripes on ``cols``: column popularity exp(sigma g / T), optionally nearer keys first."""
    n = tk.n
    w = np.zeros((n, n))
    pop = np.exp(rng.uniform(0.3, 1.5) * rng.standard_normal(len(cols)) / temp)
    w[:, cols] = pop[None, :] * _jitter(rng, (n, len(cols)), 0.3)
    if local:
        ell = rng.uniform(0.1, 1.0) * n
        w[:, cols] *= np.exp(-np.abs(np.arange(n)[:, None] - cols[None, :]) / ell)
    w *= _visible(n, tk.causal)
    return _normalise(w, 0, tk.spread)


def _sep(rng, tk: _Tokens, temp: float) -> np.ndarray:
    n = tk.n
    if len(tk.sep_pos) > 1 and rng.random() < 0.5:
        # each query mostly on "its own" separator: the one closing its segment (bidirectional),
        # the latest one it can see (causal); the other separators get a little
        w = np.zeros((n, n))
        rows = np.arange(n)
        if tk.causal:
            own = np.searchsorted(tk.sep_pos, rows, side="right") - 1
        else:
            own = np.minimum(np.searchsorted(tk.sep_pos, rows), len(tk.sep_pos) - 1)
        w[:, tk.sep_pos] = rng.uniform(0.05, 0.4, size=len(tk.sep_pos))[None, :]
        ok = own >= 0
        w[rows[ok], tk.sep_pos[own[ok]]] += 1.0 / temp
        w *= _jitter(rng, (n, n), 0.2)
        w *= _visible(n, tk.causal)
        return _normalise(w, 0, tk.spread)
    return _stripes(rng, tk, tk.sep_pos, temp, local=False)


def _punct(rng, tk: _Tokens, temp: float) -> np.ndarray:
    return _stripes(rng, tk, tk.punct_pos, temp, local=rng.random() < 0.5)


def _block(rng, tk: _Tokens, temp: float) -> np.ndarray:
    n = tk.n
    seg = tk.segments.copy()
    # split further at a few punctuation positions ("sentences") so that no block covers nearly all
    n_extra = int(rng.integers(1, 4)) if (seg == np.bincount(seg).argmax()).mean() > 0.6 else int(rng.integers(0, 2))
    if tk.sentences and len(tk.punct_pos):  # sentence-sized blocks along the diagonal
        n_extra = int(rng.integers(max(1, len(tk.punct_pos) // 4), len(tk.punct_pos) + 1))
    cuts = rng.choice(tk.punct_pos, size=min(n_extra, len(tk.punct_pos)), replace=False) if len(tk.punct_pos) else []
    for c in cuts:
        seg[c + 1 :] += 1
        seg = np.unique(seg, return_inverse=True)[1]
    same = seg[:, None] == seg[None, :]
    w = same * _jitter(rng, (n, n), rng.uniform(0.0, 0.8) / math.sqrt(temp))
    w *= _visible(n, tk.causal)
    return _normalise(w, 0, tk.spread)


def _broad(rng, tk: _Tokens, temp: float) -> np.ndarray:
    n = tk.n
    col = np.exp(rng.uniform(0.0, 0.6) * _smooth_noise(rng, n))
    w = col[None, :] * _jitter(rng, (n, n), rng.uniform(0.0, 0.8) / math.sqrt(temp))
    w *= _visible(n, tk.causal)
    return _normalise(w, 0)


def _smooth_noise(rng, n: int) -> np.ndarray:
    """A slowly varying standard-normal-ish curve over positions."""
    k = max(2, n // 16)
    knots = rng.standard_normal(k + 1)
    return np.interp(np.linspace(0, k, n), np.arange(k + 1), knots)


def _band(rng, tk: _Tokens, temp: float) -> np.ndarray:
    n = tk.n
    half = min(int(rng.integers(2, 9)), max(2, n // 4))
    # decay across the window, at most e^-1.5 at its edge: a band stays a window (a band of half-width
    # 2 with a steep decay would be a self head)
    beta = min(rng.uniform(0.0, 1.2) / temp, 1.5)
    d = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])
    w = np.where(d <= half, np.exp(-beta * d / half), 0.0) * _jitter(rng, (n, n), 0.25)
    w *= _visible(n, tk.causal)
    return _normalise(w, 0)


def _hetero(rng, tk: _Tokens, temp: float) -> np.ndarray:
    n = tk.n
    vis = _visible(n, tk.causal)
    k_max = min(int(rng.integers(2, 9)), max(2, n // 3))  # a few keys: at n = 8, eight keys would be broad
    alpha = 0.6 * temp
    # random keys per row: the top-k of random scores over the visible keys
    scores = rng.random((n, n)) * vis - (1 - vis)
    k = rng.integers(1, k_max + 1, size=n)
    order = np.argsort(-scores, axis=1)
    w = np.zeros((n, n))
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(n)[None, :].repeat(n, 0), axis=1)
    chosen = (ranks < k[:, None]) & (vis > 0)
    w[chosen] = rng.gamma(alpha, 1.0, size=int(chosen.sum())) + 1e-9
    if rng.random() < 0.3:  # some rows read a random contiguous span instead
        rows = rng.random(n) < 0.3
        for i in np.flatnonzero(rows):
            hi = i + 1 if tk.causal else n
            a = int(rng.integers(0, hi))
            b = int(rng.integers(a + 1, min(hi, a + max(2, n // 4)) + 1))
            w[i] = 0.0
            w[i, a:b] = 1.0
    return _normalise(w, 0)


_BUILDERS = {
    "self": lambda rng, tk, t: _positional(rng, tk, 0, t),
    "prev": lambda rng, tk, t: _positional(rng, tk, -1, t),
    "next": lambda rng, tk, t: _positional(rng, tk, 1, t),
    "first": _first,
    "sep": _sep,
    "punct": _punct,
    "block": _block,
    "broad": _broad,
    "band": _band,
    "hetero": _hetero,
}


# ------------------------------------------------------------------------------------------------
# mixtures


def _mixture(rng, dominant: str, causal: bool) -> tuple[dict, float]:
    """{type: weight} (summing to 1) and the noise level; dominant beats all others by MARGIN."""
    allowed = [t for t in PATTERN_TYPES if t != dominant and not (causal and t == "next")]
    prior = np.array([SECONDARY_PRIOR[t] for t in allowed])
    lam = rng.uniform(0, NOISE_MAX) if rng.random() < 0.8 else 0.0
    n_sec = int(rng.choice(4, p=[0.25, 0.4, 0.25, 0.1]))
    for _ in range(100):
        if n_sec == 0:
            weights = {dominant: 1.0}
        else:
            sec = rng.choice(allowed, size=n_sec, replace=False, p=prior / prior.sum())
            w_dom = rng.uniform(0.5, 1.0)
            ws = (1 - w_dom) * rng.dirichlet(np.ones(n_sec))
            weights = {dominant: w_dom, **{str(t): float(w) for t, w in zip(sec, ws)}}
        eff = {t: w * (1 - lam) for t, w in weights.items()}
        eff["broad"] = eff.get("broad", 0.0) + lam
        others = [w for t, w in eff.items() if t != dominant]
        if dominant == "broad" or not others or eff[dominant] - max(others) >= MARGIN:
            return weights, lam
    return {dominant: 1.0}, lam  # pragma: no cover - practically unreachable


def sample_map(
    seed: int,
    index: int,
    dominant: str | None = None,
    causal: bool | None = None,
    n: int | None = None,
    pure: bool = False,
) -> MapSample:
    """The ``index``-th map of stream ``seed``; ``dominant`` / ``causal`` / ``n`` pin those draws.

    ``pure``: the dominant component alone (no secondary components, no noise floor), with the same
    token roles and component randomness as the mixed map of the same (seed, index).
    """
    rng = np.random.default_rng([seed, index])
    label = int(rng.integers(len(PATTERN_TYPES)))
    is_causal = rng.random() < CAUSAL_SHARE
    n_draw = round(math.exp(rng.uniform(math.log(N_MIN), math.log(N_MAX))))
    temp = float(math.exp(rng.uniform(math.log(0.4), math.log(2.5))))
    if dominant is not None:
        label = TYPE_INDEX[dominant]
    if causal is not None:
        is_causal = causal
    if PATTERN_TYPES[label] == "next":
        is_causal = False
    n = n_draw if n is None else int(n)
    tk = _tokens(rng, n, is_causal)
    # variations drawn from a stream of their own, so that they leave every other draw as it was
    aug = np.random.default_rng([seed, index, 1])
    tk.spread = bool(aug.random() < SPREAD_SHARE)
    tk.sentences = bool(aug.random() < SENTENCE_BLOCK_SHARE)
    weights, lam = _mixture(rng, PATTERN_TYPES[label], is_causal)
    if pure:
        weights, lam = {PATTERN_TYPES[label]: 1.0}, 0.0
    elif aug.random() < CIRCUIT_SHARE:
        from rapids_attn.patterns.circuits import circuit_map

        made = circuit_map(aug, tk, PATTERN_TYPES[label])
        if made is not None:
            return _sample(made[0], label, tk, made[1], temp, tk.spread, tk.sentences, circuits=True)
    names = list(weights)
    w = np.array([weights[t] for t in names])
    row_w = w[None, :] * _jitter(rng, (n, len(names)), 0.25)  # per-row weights around the mixture
    row_w /= row_w.sum(1, keepdims=True)
    a = np.zeros((n, n))
    for c, t in enumerate(names):
        a += row_w[:, c : c + 1] * _BUILDERS[t](rng, tk, temp)
    if lam > 0:
        vis = _visible(n, is_causal)
        noise = _normalise(vis * _jitter(rng, (n, n), rng.uniform(0.3, 2.0)), 0)
        a = (1 - lam) * a + lam * noise
    a /= a.sum(1, keepdims=True)
    variations = {"spread": tk.spread, "sentences": tk.sentences, "salience": False, "score_noise": False}
    if not pure:
        a, bg, drawn = _score_space(aug, a, _visible(n, is_causal), PATTERN_TYPES[label], weights, lam)
        variations.update(drawn)
        lam = 1 - (1 - lam) * (1 - bg)  # the background counts as noise floor in ``mixture``
    mix = {t: float(row_w[:, c].mean()) * (1 - lam) for c, t in enumerate(names)}
    mix["noise"] = float(lam)
    return _sample(a, label, tk, mix, temp, **variations)


def _sample(a, label, tk, mix, temp, spread, sentences, salience=False, score_noise=False, circuits=False):
    sep = np.zeros(tk.n, dtype=bool)
    sep[tk.sep_pos] = True
    punct = np.zeros(tk.n, dtype=bool)
    punct[tk.punct_pos] = True
    variations = {
        "spread": spread,
        "sentences": sentences,
        "salience": salience,
        "score_noise": score_noise,
        "circuits": circuits,
    }
    return MapSample(a.astype(np.float32), label, sep, punct, bool(tk.causal), mix, temp, variations)


def _score_space(aug, a: np.ndarray, vis: np.ndarray, dominant: str, weights: dict, lam: float):
    """Attention is a softmax of scores: with ``SCORE_NOISE_SHARE`` the map goes back to scores,
    ``log(A + c / visible)``, gets Gaussian noise (sigma up to ``SCORE_NOISE_MAX``) and goes through
    the softmax again; the background ``c`` (a share c / (1 + c) of each row, up to
    ``BACKGROUND_MAX`` / (1 + ``BACKGROUND_MAX``)) is kept only where the dominant component still beats
    every other by ``MARGIN`` counting it as broad mass. Independently, with ``SALIENCE_SHARE``, every
    key gets a salience exp(N(0, tau)) shared by all rows. Returns the map and the background share."""
    bg = 0.0
    salience = aug.random() < SALIENCE_SHARE
    if salience:
        a = a * np.exp(aug.normal(0.0, aug.uniform(0.0, SALIENCE_MAX), size=a.shape[1]))[None, :]
        a /= a.sum(1, keepdims=True)
    noisy = aug.random() < SCORE_NOISE_SHARE
    if noisy:
        c = aug.uniform(0.0, BACKGROUND_MAX)
        bg = c / (1 + c)
        eff = {t: w * (1 - lam) * (1 - bg) for t, w in weights.items()}
        eff["broad"] = eff.get("broad", 0.0) + (lam * (1 - bg)) + bg
        others = [w for t, w in eff.items() if t != dominant]
        if dominant != "broad" and others and eff[dominant] - max(others) < MARGIN:
            c, bg = 0.0, 0.0
        scores = np.log(a + c / vis.sum(1, keepdims=True) + 1e-12)
        scores += aug.normal(0.0, aug.uniform(0.0, SCORE_NOISE_MAX), size=a.shape)
        scores = np.where(vis > 0, scores, -np.inf)
        scores -= scores.max(1, keepdims=True)
        a = np.exp(scores)
        a /= a.sum(1, keepdims=True)
    return a, bg, {"salience": bool(salience), "score_noise": bool(noisy)}


def generate(seed: int, count: int, start: int = 0, **pin) -> list[MapSample]:
    """Maps ``start .. start + count - 1`` of stream ``seed`` (labels uniform over PATTERN_TYPES)."""
    return [sample_map(seed, i, **pin) for i in range(start, start + count)]


# ------------------------------------------------------------------------------------------------
# featurisation: exactly the pipeline's functions (rapids_attn.extract.maps)


def featurize_one(s: MapSample, image_size: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    crop = torch.from_numpy(s.attn)[None]  # [head = 1, n, n]
    sep = torch.from_numpy(s.sep)
    punct = torch.from_numpy(s.punct)
    stats = map_stats(crop, sep, punct, s.causal)[0]
    profile = offset_profile(crop)[0]
    image = area_resize(crop, image_size)[0]
    return image, profile, stats


def featurize(samples: list[MapSample], image_size: int = 32):
    """-> images [N, S, S], profile [N, 9], stats [N, 10] (float32 tensors), labels [N] int64."""
    n = len(samples)
    images = torch.zeros(n, image_size, image_size)
    profile = torch.zeros(n, len(PROFILE_OFFSETS))
    stats = torch.zeros(n, len(STAT_NAMES))
    for k, s in enumerate(samples):
        images[k], profile[k], stats[k] = featurize_one(s, image_size)
    labels = torch.tensor([s.label for s in samples], dtype=torch.long)
    return images, profile, stats, labels


def generate_features(
    seed: int, count: int, image_size: int = 32, start: int = 0, chunk: int = 1000, with_info: bool = False
):
    """``featurize(generate(seed, count, start))`` without holding every full map in memory.

    With ``with_info``, two more tensors: each map's length n and causal flag.
    """
    parts = []
    for a in range(start, start + count, chunk):
        samples = generate(seed, min(chunk, start + count - a), start=a)
        f = featurize(samples, image_size)
        if with_info:
            f = (*f, torch.tensor([s.n for s in samples]), torch.tensor([s.causal for s in samples]))
        parts.append(f)
        del samples
    return tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))
