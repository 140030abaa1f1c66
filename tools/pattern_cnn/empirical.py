"""A third, evaluation-only generator of attention maps: "empirical-style" maps, for testing whether the pattern
CNN generalises to maps drawn in a way it was never trained on.

It was written without reading the training generator (``rapids_attn/patterns``) or the two other evaluation
generators (``independent``: mixtures of row distributions; ``mechanistic``: softmax of designed scores). Here a
map is neither: it is built the way real heads are described in the interpretability literature, as a family's
*target* that each query row follows to a different degree, with heavy-tailed leakage, rows on which the head is
a no-op, an attention sink whose size varies from head to head, and a temperature. Nothing is a softmax of scores.

Token roles (a synthetic sequence, nothing tokenised)
  Position 0 is [CLS]/BOS. The text is laid out as sentences (log-normal lengths, median 10..24 tokens per map),
  each ended by a full stop (a punctuation token) unless cut off by the end of the sequence; inside a sentence,
  commas at a per-map rate and, now and then, a list clump of punctuation at every other position ("1 , 2 , 3").
  Punctuation lands on about 8 % of positions (median; 4-15 % in most maps). 1-3 separators sit right after
  sentence ends: in bidirectional maps the last position is [SEP] 85 % of the time; in causal maps at least one
  separator lies before the midpoint (a causal row cannot see later tokens). Position 0 is never sep nor punct;
  sep and punct are disjoint. Segments are closed by separators and sentence ends (the closing token belongs to
  the segment it closes); a segment longer than 60 % of n is split by a full stop in its middle. Every content
  token has a Zipf-distributed frequency rank, a proxy for token rarity.

Lengths
  Bimodal: half the maps are short sentences (n in 10..40), half long paragraphs (n in 100..500).

Families (``KNOWN`` are the CNN's ten, ``UNSEEN`` are not in its training)
  self          the query's own position
  prev          i - 1
  next          i + 1 (bidirectional only)
  first         position 0
  sep           the separators (a per-map preference over them)
  punct         the punctuation tokens, weighted by a per-token salience (sentence ends more) and a per-map
                proximity decay exp(-|i - j| / lambda), lambda log-uniform in 3..n
  block         the keys of the query's own segment (position 0 excluded)
  broad         every visible key, near-uniformly
  band          keys with |i - j| <= w, w in 2..min(10, n / 6) (2 at least), weights decaying mildly with distance
  hetero        each row its own 1-4 random keys
  periodic      keys at i - p, i - 2p, ... (geometric decay over the multiples), p in 3..7: the same position in
                earlier "lines" of a table or a poem; in bidirectional maps also i + p, i + 2p, ... at up to 0.6
                of the weight
  segment_start the first token of the query's own segment (position 1 for the first segment)
  rare          a fixed set of 2-5 content keys, the same for every row: the rarest tokens by the frequency
                proxy, spread over the sequence (not first, sep or punct); in causal maps one lies in the
                first third

How rows vary (per map, then per row)
  * Row variation of the target: for families with several target keys, a row's distribution is a Dirichlet
    draw centred on the target, ``Dir(c_i * |S_i| * T_i)``, with c_i = c_map * lognormal(0, 0.6) and c_map
    log-uniform in 0.3..5 (1.5..15 for band and block, 30..300 for broad): from spiky rows that pick one
    target key to rows close to the target.
  * Heavy-tailed leakage: a row keeps 1 - eps_i of its mass and leaks eps_i to a noise distribution, a per-map
    mixture of a local decay exp(-|i - j| / l), sparse Gamma(0.15) spikes over visible keys and the role tokens.
    eps_i ~ Beta with per-map mean 0.02..0.42 (0.4 * Beta(1.2, 4)) and per-map concentration 2..10, so a
    few rows leak most of their mass.
  * Switched-off rows: 5-40 % of rows per map (0.05 + 0.35 * Beta(1, 2)) do something else, as real heads are a
    no-op on many rows: attend to [CLS]/BOS, to the (visible) separators, or spread over the visible keys, by
    per-map preferences. Rows that see no target (row 0 of prev, causal rows before the first separator of sep,
    ...) are switched off too.
  * Attention sink: a share s_i = s_map * lognormal(0, 0.5) (capped at 0.9) moves to token 0, s_map =
    0.6 * Beta(0.7, 3), so 0-60 %; in bidirectional maps up to half of it goes to the separators.
  * Temperature: A <- A^(1/tau), rows renormalised, tau log-uniform in 0.6..1.6 per map.
  * A background floor of 0.01-1 % of the row's mass over the visible keys.

Causal maps (35 %, never for ``BIDIRECTIONAL_ONLY``) are exactly lower-triangular: every component is drawn over
the visible keys only. Every map is float32, n x n, non-negative, rows sum to 1.

The target should hold the majority of the mass on most rows that see it, but hard maps (large leakage, sink
and no-op share, flat temperature) fall below half. ``sample_with_targets`` also returns the boolean mask of the
family's target keys (the table below, and tests).

``python -m tools.pattern_cnn.empirical`` prints, for seed 0 and 20 maps per family, the mean n, the causal
share and the mean mass on the family's targets (rows that see one; for broad, the overlap with uniform).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SALT = 0x5E3A1C7  # this generator's own stream, apart from any other generator's seeds

KNOWN = ("self", "prev", "next", "first", "sep", "punct", "block", "broad", "band", "hetero")
UNSEEN = ("periodic", "segment_start", "rare")
FAMILIES = KNOWN + UNSEEN
BIDIRECTIONAL_ONLY = ("next",)

CAUSAL_SHARE = 0.35
SHORT = (10, 40)
LONG = (100, 500)
MAX_SEGMENT_SHARE = 0.6
# per-key Dirichlet concentration of a row around its target: low is spiky (a row picks one or two target keys),
# high follows the target; the families defined by spread (broad, band, block) keep their rows spread
_CONCENTRATION = {"broad": (30.0, 300.0), "band": (1.5, 15.0), "block": (1.5, 15.0)}
_MULTI_KEY = ("sep", "punct", "block", "broad", "band", "hetero", "periodic", "rare")


@dataclass
class EmpiricalMap:
    attn: np.ndarray  # [n, n] float32
    family: str
    sep: np.ndarray  # [n] bool
    punct: np.ndarray  # [n] bool
    causal: bool
    segment: np.ndarray  # [n] int

    @property
    def n(self) -> int:
        return int(self.attn.shape[0])


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _normalise(x: np.ndarray) -> np.ndarray:
    s = x.sum(axis=1, keepdims=True)
    return np.divide(x, s, out=np.zeros_like(x), where=s > 0)


def _roles(rng: np.random.Generator, n: int, causal: bool):
    """sep, punct, segment, sentence ends and a token-rarity rank for a synthetic sequence of n tokens."""
    sep = np.zeros(n, bool)
    punct = np.zeros(n, bool)
    end = np.zeros(n, bool)
    trailing = (not causal) and rng.random() < 0.85
    text_end = n - 1 if trailing else n  # text occupies [1, text_end)
    median = rng.uniform(10, 24)
    comma = rng.uniform(0.0, 0.04)
    p_list = rng.uniform(0.0, 0.2)
    pos = 1
    while pos < text_end:
        length = max(3, round(rng.lognormal(np.log(median), 0.45)))
        last = min(pos + length, text_end) - 1
        if pos + length <= text_end and last > pos:  # a sentence cut off by the end of the sequence has no stop
            punct[last] = end[last] = True
        inner = np.arange(pos, last)
        if inner.size:
            punct[inner[rng.random(inner.size) < comma]] = True
            if inner.size >= 6 and rng.random() < p_list:  # a list: "1 , 2 , 3"
                k = int(rng.integers(2, 5))
                start = int(rng.integers(pos, last - 1))
                clump = np.arange(start + 1, min(start + 1 + 2 * k, last), 2)
                punct[clump] = True
        pos = last + 1
    if trailing:
        sep[n - 1] = True
    # separators right after sentence ends
    cand = np.flatnonzero(end[:-1]) + 1
    cand = cand[(cand >= 2) & (cand < text_end) & ~punct[cand]]
    n_sep = int(rng.integers(1, 4)) - int(trailing)
    chosen: list[int] = []
    if causal:
        early = cand[cand < n // 2]
        chosen.append(int(rng.choice(early)) if early.size else int(rng.integers(2, max(3, n // 2))))
        n_sep -= 1
    rest = np.setdiff1d(cand, chosen)
    if n_sep > 0 and rest.size:
        chosen.extend(int(c) for c in rng.choice(rest, size=min(n_sep, rest.size), replace=False))
    if not trailing and not chosen:  # every map has a separator
        chosen.append(int(rng.integers(2, n)))
    for c in chosen:
        sep[c] = True
        punct[c] = False
        end[c] = False
    # segments: closed by separators and sentence ends; none over MAX_SEGMENT_SHARE of n
    while True:
        boundary = sep | end
        segment = np.concatenate([[0], np.cumsum(boundary)[:-1]]).astype(np.int64)
        sizes = np.bincount(segment)
        s = int(np.argmax(sizes))
        if sizes[s] <= MAX_SEGMENT_SHARE * n:
            break
        members = np.flatnonzero(segment == s)
        cut = int(members[len(members) // 2 - 1])  # an inner token: not the segment's closing token, never 0
        cut = max(cut, 1)
        punct[cut] = end[cut] = True
    if not punct.any():  # every map has a punctuation token (a comma, so the segments stay as they are)
        free = np.flatnonzero(~sep & (np.arange(n) > 0))
        if causal:
            free = free[free < max(2, n // 2)] if (free < max(2, n // 2)).any() else free
        punct[int(rng.choice(free))] = True
    rank = rng.zipf(1.3, size=n).astype(np.float64) + rng.random(n)  # higher = rarer
    return sep, punct, segment, end, rank


def _rare_keys(rng: np.random.Generator, n: int, causal: bool, sep, punct, rank) -> np.ndarray:
    content = np.flatnonzero(~sep & ~punct & (np.arange(n) > 0))
    k = int(min(rng.integers(2, 6), max(2, n // 8)))
    gap = max(1, n // (2 * k + 2))
    order = content[np.argsort(-rank[content], kind="stable")]
    keys: list[int] = []
    if causal:
        early = order[order < max(3, n // 3)]
        if early.size:
            keys.append(int(early[0]))
    for j in order:
        if len(keys) >= k:
            break
        if all(abs(int(j) - q) >= gap for q in keys):
            keys.append(int(j))
    return np.array(sorted(keys), dtype=np.int64)


def _targets(rng, family: str, n: int, causal: bool, sep, punct, segment, end, rank, vis, d) -> np.ndarray:
    """[n, n] target distribution of each row over its visible keys (a zero row where it sees no target)."""
    i = np.arange(n)
    t = np.zeros((n, n))
    if family == "self":
        t[i, i] = 1.0
    elif family == "prev":
        t[i[1:], i[1:] - 1] = 1.0
    elif family == "next":
        t[i[:-1], i[:-1] + 1] = 1.0
    elif family == "first":
        t[:, 0] = 1.0
    elif family == "sep":
        t = np.broadcast_to(rng.gamma(1.0, size=n) * sep, (n, n)).copy()
    elif family == "punct":
        salience = rng.gamma(2.0, size=n) * (1.0 + end * rng.uniform(0.0, 2.0))
        lam = _loguniform(rng, 3.0, float(n))
        t = (salience * punct)[None, :] * np.exp(-np.abs(d) / lam)
    elif family == "block":
        t = ((segment[:, None] == segment[None, :]) & (i[None, :] > 0)).astype(np.float64)
    elif family == "broad":
        t = np.ones((n, n))
    elif family == "band":
        w = int(rng.integers(2, max(2, min(10, n // 6)) + 1))  # a window that is local at this length
        ell = rng.uniform(w / 2, 3 * w)
        t = (np.abs(d) <= w) * np.exp(-np.abs(d) / ell)
    elif family == "hetero":
        scores = np.where(vis, rng.random((n, n)), -1.0)
        order = np.argsort(-scores, axis=1)
        k = rng.integers(1, 5, size=n)
        pick = np.zeros((n, n), bool)
        np.put_along_axis(pick, order, np.arange(n)[None, :] < k[:, None], axis=1)
        t = pick * rng.gamma(1.0, size=(n, n))
    elif family == "periodic":
        p = int(rng.integers(3, 8))
        r = rng.uniform(0.3, 0.85)
        fwd = 0.0 if causal else rng.uniform(0.0, 0.6)
        mult = (d != 0) & (d % p == 0)
        k = np.abs(d) // p
        t = mult * r ** np.maximum(k - 1, 0) * np.where(d > 0, 1.0, fwd)
    elif family == "segment_start":
        starts = np.array([np.flatnonzero(segment == s)[0] for s in range(int(segment.max()) + 1)])
        starts[0] = 1
        t[i, starts[segment]] = 1.0
    elif family == "rare":
        keys = _rare_keys(rng, n, causal, sep, punct, rank)
        w = np.zeros(n)
        w[keys] = rng.gamma(2.0, size=keys.size)
        t = np.broadcast_to(w, (n, n)).copy()
    else:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    return _normalise(t * vis)


def sample_with_targets(seed: int, index: int, family: str | None = None) -> tuple[EmpiricalMap, np.ndarray]:
    """The map ``sample`` returns and the [n, n] bool mask of its family's target keys."""
    rng = np.random.default_rng([SALT, seed, index])
    family = FAMILIES[index % len(FAMILIES)] if family is None else family
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    causal = family not in BIDIRECTIONAL_ONLY and bool(rng.random() < CAUSAL_SHARE)
    lo, hi = SHORT if rng.random() < 0.5 else LONG
    n = int(rng.integers(lo, hi + 1))
    sep, punct, segment, end, rank = _roles(rng, n, causal)
    i = np.arange(n)
    d = i[:, None] - i[None, :]  # > 0: the key is before the query
    vis = (d >= 0) if causal else np.ones((n, n), bool)
    visf = vis.astype(np.float64)
    target = _targets(rng, family, n, causal, sep, punct, segment, end, rank, vis, d)
    support = target > 0
    has = support.any(axis=1)

    # 1. each row's own draw around the target (Dirichlet centred on it)
    if family in _MULTI_KEY:
        c_map = _loguniform(rng, *_CONCENTRATION.get(family, (0.3, 5.0)))
        c = c_map * rng.lognormal(0.0, 0.6, size=n)
        shape = c[:, None] * support.sum(axis=1, keepdims=True) * target
        row = _normalise(np.where(support, rng.gamma(np.where(support, shape, 1.0) + 1e-6), 0.0))
        row = np.where(row.sum(axis=1, keepdims=True) > 0, row, target)
    else:
        row = target

    # 2. switched-off rows (and rows that see no target): [CLS]/BOS, the visible separators, or spread
    off = (rng.random(n) < 0.05 + 0.35 * rng.beta(1.0, 2.0)) | ~has
    mode = rng.choice(3, size=n, p=rng.dirichlet([3.0, 2.0, 1.5]))
    cls = np.zeros((n, n))
    cls[:, 0] = 1.0
    seps = _normalise(visf * sep[None, :])
    seps = np.where(seps.sum(axis=1, keepdims=True) > 0, seps, cls)
    spread = np.zeros((n, n))
    spreading = np.flatnonzero(off & (mode == 2))  # drawn only where used
    spread[spreading] = _normalise(visf[spreading] * rng.gamma(rng.uniform(1.0, 5.0), size=(spreading.size, n)))
    off_row = np.select([mode[:, None] == 0, mode[:, None] == 1], [cls, seps], spread)
    base = np.where(off[:, None], off_row, row)

    # 3. heavy-tailed leakage to a noise distribution
    local = _normalise(visf * np.exp(-np.abs(d) / rng.uniform(1.0, 8.0)))
    spikes = _normalise(visf * rng.gamma(0.15, size=(n, n)))
    roles = _normalise(visf * (sep | punct | (i == 0))[None, :])
    roles = np.where(roles.sum(axis=1, keepdims=True) > 0, roles, cls)
    mix = rng.dirichlet([2.0, 2.0, 1.0])
    noise = mix[0] * local + mix[1] * _normalise(np.where(spikes.sum(axis=1, keepdims=True) > 0, spikes, local))
    noise = noise + mix[2] * roles
    mean = 0.02 + 0.4 * rng.beta(1.2, 4.0)
    conc = rng.uniform(2.0, 10.0)
    eps = rng.beta(mean * conc, (1.0 - mean) * conc, size=n)[:, None]
    attn = (1.0 - eps) * base + eps * noise

    # 4. attention sink: token 0, and in bidirectional maps partly the separators
    s = np.minimum(0.6 * rng.beta(0.7, 3.0) * rng.lognormal(0.0, 0.5, size=n), 0.9)[:, None]
    sink = cls.copy()
    if not causal:
        u = rng.uniform(0.0, 0.5)
        sink = (1.0 - u) * cls + u * _normalise(np.broadcast_to(sep.astype(np.float64), (n, n)).copy())
    attn = (1.0 - s) * attn + s * sink

    # 5. temperature, then a faint background over the visible keys
    tau = _loguniform(rng, 0.6, 1.6)
    attn = _normalise(attn ** (1.0 / tau))
    beta = _loguniform(rng, 1e-4, 1e-2)
    attn = (1.0 - beta) * attn + beta * _normalise(visf)
    attn = _normalise(attn * vis).astype(np.float32)
    attn /= attn.sum(axis=1, keepdims=True)
    m = EmpiricalMap(attn=attn, family=family, sep=sep, punct=punct, causal=causal, segment=segment)
    return m, support


def sample(seed: int, index: int, family: str | None = None) -> EmpiricalMap:
    """Map ``index`` of ``seed``: family ``FAMILIES[index % len(FAMILIES)]`` unless given."""
    return sample_with_targets(seed, index, family)[0]


def generate(seed: int, per_family: int, families=FAMILIES) -> list[EmpiricalMap]:
    """``per_family`` maps of each family; map r of a family is ``sample(seed, r * len(FAMILIES) + k, family)``,
    k its place in ``FAMILIES``, so a family's maps do not depend on which other families are asked for."""
    return [sample(seed, r * len(FAMILIES) + FAMILIES.index(f), f) for f in families for r in range(per_family)]


def target_mass(m: EmpiricalMap, support: np.ndarray) -> float:
    """Mean mass on the family's target keys over the rows that see one (nan where none does). For ``broad``,
    whose targets are every visible key, the overlap sum_j min(A_ij, 1 / |visible_i|) with the uniform row."""
    has = support.any(axis=1)
    if not has.any():
        return float("nan")
    if m.family == "broad":
        uniform = support / support.sum(axis=1, keepdims=True).clip(min=1)
        return float(np.minimum(m.attn, uniform).sum(axis=1)[has].mean())
    return float((m.attn * support).sum(axis=1)[has].mean())


def _table(seed: int = 0, per_family: int = 20) -> str:
    lines = [f"{'family':<14} {'mean n':>7} {'causal':>7} {'target mass':>12}"]
    for f in FAMILIES:
        pairs = [sample_with_targets(seed, r * len(FAMILIES) + FAMILIES.index(f), f) for r in range(per_family)]
        ns = np.mean([m.n for m, _ in pairs])
        causal = np.mean([m.causal for m, _ in pairs])
        mass = np.nanmean([target_mass(m, t) for m, t in pairs])
        lines.append(f"{f:<14} {ns:>7.1f} {causal:>7.2f} {mass:>12.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(_table())
