"""Evaluation-only attention maps computed the way a transformer head computes them.

This generator exists to check whether the pattern CNN, trained on the project's own generator, generalises to maps
made by a different process. It was written without reading that generator. Nothing here is used for training.

Every map is ``softmax(Q K^T + bias)`` over the tokens of a synthetic sequence, where ``Q = [q_1 | q_2 | ...]`` and
``K = [k_1 | k_2 | ...]`` concatenate the query/key vectors of the head's *circuits* (a block-diagonal ``W_q W_k^T``),
and the ``1/sqrt(d_head)`` factor and each circuit's score scale are folded into its ``q``. The only term outside
``Q K^T`` is a T5-style relative-position bias used by the ``duplicate`` and ``induction`` circuits.

Sequence
    Length ``n`` is log-normal (median 80, sigma 0.65) truncated to 12..400 by redrawing (mean about 95).
    Position 0 is [CLS]/BOS. The other tokens are drawn from a Zipf-like vocabulary of 2000 ids
    (``p(rank) ~ 1/(rank + 2.7)``), so frequent tokens recur. Sentences of 3 + Geometric(1/9) tokens end with '.'
    (85%) or '?'; a ',' replaces a token inside a sentence with probability 0.06. Each map has 1-3 [SEP] tokens:
    usually the last position, the others replace sentence ends ("A [SEP] B [SEP]"). Segments are closed by '.', '?'
    and [SEP] (the closing token belongs to the segment it closes); any segment longer than 60% of ``n`` is split by
    a '.' in its middle. With probability 0.5 (always for ``duplicate`` and ``induction``) a span of n/10..n/3
    tokens is copied to a later place, so the sequence holds a repeated span. ``sep`` and ``punct`` are the role
    masks ([SEP]; '.', ',', '?'), disjoint, and false at position 0.

Embedding (fresh random weights per map: every map is a head of a different model)
    token-identity vector ``u`` (64 dims, unit norm, one per distinct id), role features (cls, sep, punct kind),
    segment vector ``v`` (32 dims, unit norm, one per segment), and rotary position (RoPE) applied to the positional
    circuits' q/k: 64 rotation frequencies log-spaced from 0.9*pi down to 2*pi/2048 radians per token.

Circuits (each returns q, k; ``q_i . k_j`` is its logit contribution; ``s`` is its random score scale)
    self / prev / next   RoPE: ``q_i = s * a * R(i + delta)``, ``k_j = R(j)``, so ``q_i . k_j`` peaks at
                         ``j = i + delta`` (delta 0, -1, +1). ``a`` weights the frequencies (high ones dominate);
                         the profile is normalised so that the peak exceeds every other offset by ``s``.
    first                the key of position 0 carries a sink direction that a constant query reads: ``s`` on j = 0.
    sep / punct          the same with the [SEP] / punctuation role direction (per punctuation kind weights 0.5-1).
    block                ``q_i = s * v_seg(i)``, ``k_j = v_seg(j)``: ``s`` inside the own segment, ~N(0, s^2/32) out.
    broad                low-frequency RoPE (wavelengths > 25 tokens, random phases) whose logits vary by at most
                         ``s`` (0.2-1.2) along a row: a nearly uniform row with a smooth positional preference.
    band                 RoPE with Gaussian frequency weights: a Gaussian bump (sigma = w/1.5, so about s/3 at
                         ``|i-j| = w``) around the diagonal, w 2..10; targets ``|i-j| <= w``.
    hetero               ``q = U W_q``, ``k = U W_k`` with random rank-8 ``W`` on token identity: content-based,
                         each row peaks on its own few keys (targets: the circuit's top 3 visible keys per row).
    duplicate            identity match ``q_i = s * u(tok_i)``, ``k_j = u(tok_j)`` plus a relative-position bias of
                         ``-B`` (B 6..10) on ``j >= i``: earlier occurrences of the query's token.
    induction            ``q_i = s * u(tok_i)``, ``k_j = u(tok_{j-1})`` (the key carries its previous token, as
                         written by an earlier previous-token head) plus ``-B`` on ``j > i``: the key right after an
                         earlier occurrence of the query's token.

Head
    The family's circuit is dominant (scale 2..10 logits, family-dependent: ``_DOMINANT_SCALE``). 0-2 weaker circuits
    are added, drawn from a BOS sink (most likely), a [SEP] sink, and the other positional / role / segment circuits,
    each at 15-70% of the dominant scale (0.3-1.5 logits for ``broad``, so that it stays broad). Content noise is a
    random rank-16 projection of the whole embedding (identity, role and segment features) on both sides, scaled to a
    logit standard deviation of 0.2-1.5 (0.1-0.5 for ``broad``). So most rows put 0.5-0.95 of their mass on the
    family's targets, and some maps (strong sinks, heavy noise, short segments) are hard: some maps put
    less than half (13% at seed 0). ``broad``'s targets are all visible keys; measure it by row entropy instead.

Causal maps
    38% of the maps of every family except those in ``BIDIRECTIONAL_ONLY`` (about 35% of all maps) are causal: keys
    ``j > i`` are masked before the softmax, so the map is lower triangular. Rows that see none of the family's
    targets (row 0 of a ``prev`` map, rows before the first [SEP] of a causal ``sep`` map, tokens without an earlier
    occurrence for ``duplicate``) are not special-cased: they get whatever the other circuits and the noise give.
    ``duplicate`` and ``induction`` look only backwards in bidirectional maps too (their relative-position bias), so
    their bidirectional maps are close to lower triangular, as the heads are found in decoder models.

Output: float32, row-stochastic ``[n, n]`` maps with the role masks and segment ids (``MechanisticMap``);
``sample_traced`` also returns the token ids, the dominant circuit's target mask and the circuits used (``Trace``),
which the tests and the summary (``python -m tools.pattern_cnn.mechanistic``) use to measure the target mass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

SALT = 0x6D656368  # "mech": separates this generator's random streams from every other seeded stream

KNOWN = ("self", "prev", "next", "first", "sep", "punct", "block", "broad", "band", "hetero")
UNSEEN = ("duplicate", "induction")
FAMILIES = KNOWN + UNSEEN
BIDIRECTIONAL_ONLY = ("next",)

CAUSAL_SHARE = 0.38  # of the maps of each family that may be causal: about 35% of all maps
N_MEDIAN, N_SIGMA, N_MIN, N_MAX = 80.0, 0.65, 12, 400
MAX_SEGMENT_SHARE = 0.6

VOCAB = 2000
CLS, SEP, PERIOD, COMMA, QUESTION = 0, 1, 2, 3, 4
FIRST_CONTENT = 5
_RANKS = np.arange(VOCAB - FIRST_CONTENT)
_ZIPF_CDF = np.cumsum(1.0 / (_RANKS + 2.7))
_ZIPF_CDF /= _ZIPF_CDF[-1]

D_ID, D_SEG, D_HETERO, D_NOISE = 64, 32, 8, 16
THETA = np.geomspace(0.9 * np.pi, 2 * np.pi / 2048, 64)  # RoPE frequencies, radians per token

# dominant score scale (logits) per family
_DOMINANT_SCALE = {
    "self": (2.0, 6.0),
    "prev": (2.0, 6.0),
    "next": (2.0, 6.0),
    "first": (4.5, 10.0),
    "sep": (4.0, 9.0),
    "punct": (3.0, 7.0),
    "block": (2.5, 6.0),
    "broad": (0.2, 1.2),
    "band": (2.5, 6.0),
    "hetero": (3.0, 8.0),
    "duplicate": (4.0, 9.0),
    "induction": (4.0, 9.0),
}
# weaker circuits and how likely each is drawn
_SECONDARY = {"first": 3.0, "sep": 2.0, "self": 1.0, "prev": 1.0, "next": 1.0, "punct": 1.0, "band": 1.0, "block": 1.0}


@dataclass
class MechanisticMap:
    attn: np.ndarray  # [n, n] float32, row-stochastic
    family: str
    sep: np.ndarray  # [n] bool
    punct: np.ndarray  # [n] bool
    causal: bool
    segment: np.ndarray  # [n] int

    @property
    def n(self) -> int:
        return int(self.attn.shape[0])


@dataclass
class Trace:
    """What produced a map, for measuring it: not part of what the CNN sees."""

    tokens: np.ndarray  # [n] int token ids
    target: np.ndarray  # [n, n] bool: the dominant circuit's targets among the visible keys
    circuits: tuple[tuple[str, float], ...]  # (name, scale), the dominant one first
    noise: float  # logit standard deviation of the content noise
    width: int | None  # band half-width (band maps only)


@dataclass
class _Sequence:
    tokens: np.ndarray
    sep: np.ndarray
    punct: np.ndarray
    segment: np.ndarray


# ----------------------------------------------------------------------------------------------------------- sequence


def _length(rng: np.random.Generator) -> int:
    while True:
        n = int(np.rint(rng.lognormal(np.log(N_MEDIAN), N_SIGMA)))
        if N_MIN <= n <= N_MAX:
            return n


def _segments(tokens: np.ndarray) -> np.ndarray:
    closes = np.isin(tokens, (PERIOD, QUESTION, SEP))
    return np.concatenate([[0], np.cumsum(closes)[:-1]]).astype(np.int64)


def _sequence(rng: np.random.Generator, n: int, repeat: bool) -> _Sequence:
    tokens = FIRST_CONTENT + np.searchsorted(_ZIPF_CDF, rng.random(n), side="right")
    tokens = np.minimum(tokens, VOCAB - 1)
    tokens[0] = CLS
    ends = []
    pos = 1
    while True:
        end = pos + 2 + int(rng.geometric(1 / 9))
        if end >= n - 1:
            break
        ends.append(end)
        pos = end + 1
    ends = np.asarray(ends, dtype=np.int64)
    if len(ends):
        tokens[ends] = np.where(rng.random(len(ends)) < 0.15, QUESTION, PERIOD)
    inner = np.arange(2, n - 1)
    inner = inner[(tokens[inner] >= FIRST_CONTENT) & (tokens[inner - 1] >= FIRST_CONTENT)]
    tokens[inner[rng.random(len(inner)) < 0.06]] = COMMA

    span = (0, 0)
    if repeat:
        lo, hi = max(3, n // 10), max(3, min(n // 3, (n - 2) // 2))
        length = int(rng.integers(lo, hi + 1))
        src = int(rng.integers(1, n - 1 - 2 * length + 1))
        dst = int(rng.integers(src + length, n - 1 - length + 1))
        tokens[dst : dst + length] = tokens[src : src + length]
        span = (dst, dst + length)

    n_sep = int(rng.choice([1, 2, 3], p=[0.45, 0.35, 0.2]))
    seps = []
    if rng.random() < 0.8:
        seps.append(n - 1)
    free = np.flatnonzero(np.isin(tokens, (PERIOD, QUESTION)))
    if len(free) == 0:
        free = np.arange(2, n - 1)
    free = free[((free < span[0]) | (free >= span[1])) & ~np.isin(free, seps)]
    k = min(n_sep - len(seps), len(free))
    seps.extend(rng.choice(free, size=k, replace=False).tolist())
    if not seps:
        seps.append(n - 1)
    tokens[np.asarray(seps)] = SEP

    limit = MAX_SEGMENT_SHARE * n
    while True:
        segment = _segments(tokens)
        sizes = np.bincount(segment)
        longest = int(sizes.argmax())
        if sizes[longest] <= limit:
            break
        where = np.flatnonzero(segment == longest)
        tokens[where[len(where) // 2]] = PERIOD
    sep = tokens == SEP
    punct = np.isin(tokens, (PERIOD, COMMA, QUESTION))
    return _Sequence(tokens.astype(np.int64), sep, punct, segment)


# ----------------------------------------------------------------------------------------------------------- circuits


class _Head:
    """Embeddings of one synthetic sequence, and the circuits a head can read from it."""

    def __init__(self, rng: np.random.Generator, seq: _Sequence) -> None:
        self.rng = rng
        self.seq = seq
        n = len(seq.tokens)
        self.n = n
        ids, inverse = np.unique(seq.tokens, return_inverse=True)
        u = rng.standard_normal((len(ids), D_ID))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        self.u = u[inverse]  # [n, D_ID] token identity
        v = rng.standard_normal((int(seq.segment.max()) + 1, D_SEG))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        self.v = v[seq.segment]  # [n, D_SEG] segment
        t = seq.tokens
        self.roles = np.stack([t == CLS, t == SEP, t == PERIOD, t == COMMA, t == QUESTION], axis=1).astype(float)
        pos = np.arange(n)[:, None] * THETA[None, :]
        self.cos, self.sin = np.cos(pos), np.sin(pos)  # [n, P]

    def _rope(self, a: np.ndarray, delta: int, phase: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """q_i = a * R(i + delta) e, k_j = R(j) e per frequency pair: q_i . k_j = sum_p a_p cos(theta_p (i+delta-j))."""
        ang = (np.arange(self.n)[:, None] + delta) * THETA[None, :]
        if phase is not None:
            ang = ang + phase[None, :]
        q = np.concatenate([a * np.cos(ang), a * np.sin(ang)], axis=1)
        k = np.concatenate([self.cos, self.sin], axis=1)
        return q, k

    def offset(self, s: float, delta: int) -> tuple[np.ndarray, np.ndarray]:
        a = THETA * self.rng.lognormal(0.0, 0.3, len(THETA))
        d = np.arange(-(self.n - 1), self.n)
        g = (a[:, None] * np.cos(THETA[:, None] * d[None, :])).sum(0)
        peak = g[self.n - 1]
        gap = peak - np.delete(g, self.n - 1).max() if self.n > 1 else peak
        q, k = self._rope(a * s / gap, delta)
        return q, k

    def band(self, s: float, width: int) -> tuple[np.ndarray, np.ndarray]:
        sigma = width / 1.5
        a = THETA * np.exp(-((THETA * sigma) ** 2) / 2) * self.rng.lognormal(0.0, 0.15, len(THETA))
        return self._rope(a * s / a.sum(), 0)

    def broad(self, s: float) -> tuple[np.ndarray, np.ndarray]:
        low = THETA < 2 * np.pi / 25
        a = np.where(low, self.rng.random(len(THETA)), 0.0)
        phase = self.rng.uniform(-np.pi, np.pi, len(THETA))
        d = np.arange(-(self.n - 1), self.n)
        g = (a[:, None] * np.cos(THETA[:, None] * d[None, :] + phase[:, None])).sum(0)
        span = float(g.max() - g.min()) or 1.0
        return self._rope(a * s / span, 0, phase=phase)  # the logits of a row vary by at most s

    def role(self, s: float, column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.full((self.n, 1), s), column[:, None].astype(float)

    def punct(self, s: float) -> tuple[np.ndarray, np.ndarray]:
        w = self.rng.uniform(0.5, 1.0, 3)
        w /= w.max()
        return np.tile(s * w, (self.n, 1)), self.roles[:, 2:5]

    def block(self, s: float) -> tuple[np.ndarray, np.ndarray]:
        return s * self.v, self.v

    def hetero(self, s: float) -> tuple[np.ndarray, np.ndarray]:
        wq = self.rng.standard_normal((D_ID, D_HETERO))
        wk = self.rng.standard_normal((D_ID, D_HETERO))
        q, k = self.u @ wq, self.u @ wk
        std = float((q @ k.T).std()) or 1.0
        return q * (s / std), k

    def duplicate(self, s: float) -> tuple[np.ndarray, np.ndarray]:
        return s * self.u, self.u

    def induction(self, s: float) -> tuple[np.ndarray, np.ndarray]:
        previous = np.vstack([np.zeros((1, D_ID)), self.u[:-1]])
        return s * self.u, previous

    def noise(self, sd: float) -> tuple[np.ndarray, np.ndarray]:
        x = np.concatenate([self.u, self.v, self.roles], axis=1)
        q = x @ self.rng.standard_normal((x.shape[1], D_NOISE))
        k = x @ self.rng.standard_normal((x.shape[1], D_NOISE))
        std = float((q @ k.T).std()) or 1.0
        return q * (sd / std), k

    def circuit(self, name: str, s: float, width: int) -> tuple[np.ndarray, np.ndarray]:
        if name in ("self", "prev", "next"):
            return self.offset(s, {"self": 0, "prev": -1, "next": 1}[name])
        if name == "first":
            return self.role(s, self.roles[:, 0])
        if name == "sep":
            return self.role(s, self.roles[:, 1])
        if name == "punct":
            return self.punct(s)
        if name == "band":
            return self.band(s, width)
        return getattr(self, name)(s)


# ------------------------------------------------------------------------------------------------------------- sample


def _targets(name: str, head: _Head, logits: np.ndarray, visible: np.ndarray, width: int) -> np.ndarray:
    n = head.n
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    seq = head.seq
    tok = seq.tokens
    if name == "self":
        t = i == j
    elif name == "prev":
        t = j == i - 1
    elif name == "next":
        t = j == i + 1
    elif name == "first":
        t = np.broadcast_to(j == 0, (n, n))
    elif name == "sep":
        t = np.broadcast_to(seq.sep[None, :], (n, n))
    elif name == "punct":
        t = np.broadcast_to(seq.punct[None, :], (n, n))
    elif name == "block":
        t = seq.segment[:, None] == seq.segment[None, :]
    elif name == "broad":
        t = np.ones((n, n), dtype=bool)
    elif name == "band":
        t = np.abs(i - j) <= width
    elif name == "hetero":
        masked = np.where(visible, logits, -np.inf)
        top = np.argsort(-masked, axis=1, kind="stable")[:, :3]
        t = np.zeros((n, n), dtype=bool)
        np.put_along_axis(t, top, True, axis=1)
    elif name == "duplicate":
        t = (tok[:, None] == tok[None, :]) & (j < i)
    elif name == "induction":
        before = np.concatenate([[-1], tok[:-1]])
        t = (before[None, :] == tok[:, None]) & (j >= 1) & (j <= i)
    else:
        raise ValueError(f"unknown family {name!r}")
    return np.asarray(t, dtype=bool) & visible


def sample_traced(seed: int, index: int, family: str | None = None) -> tuple[MechanisticMap, Trace]:
    """One map and what produced it (``sample`` with the trace). BLAS runs on one thread: the products are small
    (n <= 400) and more threads made generation several times slower on 2 shared cores."""
    with threadpool_limits(1):
        return _sample_traced(seed, index, family)


def _sample_traced(seed: int, index: int, family: str | None) -> tuple[MechanisticMap, Trace]:
    rng = np.random.default_rng([SALT, seed, index])
    family = FAMILIES[index % len(FAMILIES)] if family is None else family
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    n = _length(rng)
    seq = _sequence(rng, n, repeat=family in UNSEEN or rng.random() < 0.5)
    causal = family not in BIDIRECTIONAL_ONLY and rng.random() < CAUSAL_SHARE
    head = _Head(rng, seq)
    width = int(rng.integers(2, 11))

    s_dom = float(rng.uniform(*_DOMINANT_SCALE[family]))
    circuits = [(family, s_dom)]
    pool = [c for c in _SECONDARY if c != family and not (causal and c in BIDIRECTIONAL_ONLY)]
    weights = np.array([_SECONDARY[c] for c in pool])
    k = int(rng.choice([0, 1, 2], p=[0.25, 0.45, 0.3]))
    for name in rng.choice(pool, size=k, replace=False, p=weights / weights.sum()):
        s = rng.uniform(0.3, 1.5) if family == "broad" else s_dom * rng.uniform(0.15, 0.7)
        circuits.append((str(name), float(s)))
    noise = float(rng.uniform(0.1, 0.5) if family == "broad" else rng.uniform(0.2, 1.5))

    parts = [head.circuit(name, s, width) for name, s in circuits]
    dominant = parts[0][0] @ parts[0][1].T
    parts.append(head.noise(noise))
    q = np.concatenate([p[0] for p in parts], axis=1)
    k_ = np.concatenate([p[1] for p in parts], axis=1)
    logits = q @ k_.T
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    if family in UNSEEN:  # T5-style relative-position bias: earlier keys only (j == i allowed for induction)
        bias = rng.uniform(6.0, 10.0)
        later = j >= i if family == "duplicate" else j > i
        logits = logits - bias * later
    visible = j <= i if causal else np.ones((n, n), dtype=bool)
    logits = np.where(visible, logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    attn = np.exp(logits)
    attn /= attn.sum(axis=1, keepdims=True)
    attn = attn.astype(np.float32)
    attn /= attn.sum(axis=1, keepdims=True)

    target = _targets(family, head, dominant, visible, width)
    m = MechanisticMap(attn, family, seq.sep.copy(), seq.punct.copy(), bool(causal), seq.segment.copy())
    trace = Trace(seq.tokens.copy(), target, tuple(circuits), noise, width if family == "band" else None)
    return m, trace


def sample(seed: int, index: int, family: str | None = None) -> MechanisticMap:
    """Map ``index`` of stream ``seed``; its family is ``FAMILIES[index % len(FAMILIES)]`` unless given."""
    return sample_traced(seed, index, family)[0]


def _indices(per_family: int, families: Sequence[str]) -> list[tuple[int, str]]:
    out = []
    for family in families:
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
        f = FAMILIES.index(family)
        out.extend((r * len(FAMILIES) + f, family) for r in range(per_family))
    return out


def generate(seed: int, per_family: int, families: Sequence[str] = FAMILIES) -> list[MechanisticMap]:
    """``per_family`` maps of each family, grouped by family in the order given.

    Map r of a family is ``sample(seed, r * len(FAMILIES) + FAMILIES.index(family))``, so a map does not depend on
    which other families or how many maps were asked for. 150 maps of each family take about 3 s on one core.
    """
    with threadpool_limits(1):
        return [_sample_traced(seed, index, family)[0] for index, family in _indices(per_family, families)]


def generate_traced(
    seed: int, per_family: int, families: Sequence[str] = FAMILIES
) -> list[tuple[MechanisticMap, Trace]]:
    """``generate`` with each map's ``Trace``."""
    with threadpool_limits(1):
        return [_sample_traced(seed, index, family) for index, family in _indices(per_family, families)]


# ------------------------------------------------------------------------------------------------------------ measure


def target_mass(m: MechanisticMap, trace: Trace) -> float:
    """Mean over the rows that see at least one target of the attention mass on the targets (nan if none do)."""
    rows = trace.target.any(axis=1)
    if not rows.any():
        return float("nan")
    return float((m.attn * trace.target).sum(axis=1)[rows].mean())


def row_entropy(m: MechanisticMap) -> float:
    """Mean row entropy divided by log(visible keys), over rows with more than one visible key."""
    a = m.attn.astype(np.float64)
    h = -(a * np.log(np.where(a > 0, a, 1.0))).sum(axis=1)
    visible = np.arange(1, m.n + 1) if m.causal else np.full(m.n, m.n)
    rows = visible > 1
    return float((h[rows] / np.log(visible[rows])).mean()) if rows.any() else float("nan")


def summary(seed: int = 0, per_family: int = 20) -> str:
    lines = [f"{'family':10s} {'mean n':>7s} {'causal':>7s} {'target mass':>12s} {'entropy':>8s}"]
    for family in FAMILIES:
        pairs = generate_traced(seed, per_family, (family,))
        ns = np.mean([m.n for m, _ in pairs])
        causal = np.mean([m.causal for m, _ in pairs])
        mass = np.nanmean([target_mass(m, t) for m, t in pairs])
        ent = np.mean([row_entropy(m) for m, _ in pairs])
        lines.append(f"{family:10s} {ns:7.1f} {causal:7.2f} {mass:12.3f} {ent:8.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())
