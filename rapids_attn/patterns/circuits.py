"""Generator version 3's second construction: a map as the softmax of summed score *circuits*.

Attention is softmax(q_i . k_j) over the keys a query sees, and the q . k of a head is a sum of
terms: a positional term (rotary embeddings make it a function of the offset j - i), a term on the
key's role ([CLS]/BOS, separators, punctuation), a term on the query's and key's segment, a term on
token content. Here each pattern type is such a term, a score *kernel* K_t [n, n], and a map is

    A = softmax over visible keys ( sum_c beta_c K_c + content noise + Gaussian noise )

- **Kernels.** ``self``/``prev``/``next``: the mean of cos(theta_f (j - i - o)) over 8-32
  frequencies log-uniform in [0.3, pi] (a rotary-like positional term peaking at offset o, with side
  lobes); ``band``: the same with frequencies in [0.02, pi / w] (a smooth bump of width about w,
  w in 2..8); ``first``: key 0; ``sep``/``punct``: the role's keys, each with its own popularity;
  ``block``: same segment; ``broad``: a smooth standardised field over the keys; ``hetero``: a
  random rank-2..8 bilinear form of random token vectors (each row its own keys).
- **Strengths.** beta is set so that, on a flat row, the kernel's targets would take a share f of
  it: f in [0.55, 0.95] for the dominant type, [0.05, 0.35] for 0-2 secondary ones (the first token,
  an attention sink, is the most frequent). ``broad`` gets a weak field instead (beta 0.3-1.5).
- **Noise.** A random rank-8 bilinear "content" term with scale 0.2-1.0, and i.i.d. Gaussian noise
  with sigma 0.1-0.6.
- **Label check.** The dominant type's targets (key i + o; the window; key 0; the role keys; the
  segment; each row's 3 best hetero keys) must take at least 0.40 of the mass of the rows that have
  targets and beat every secondary type's targets by ``MARGIN``; a ``broad`` map must have a mean
  normalised entropy of at least 0.70 and no secondary over 0.35. A map that fails returns None,
  and the caller makes a mixture map instead.

Causal maps mask the future before the softmax; a row that sees none of the dominant type's
targets gets whatever the other terms give.
"""

from __future__ import annotations

import numpy as np

MARGIN = 0.15
#: the secondary circuits' draw weights (the first token, an attention sink, most often)
SECONDARY = {"first": 4.0, "sep": 2.0, "self": 1.0, "prev": 1.0, "punct": 1.0, "band": 1.0, "block": 1.0}
OFFSETS = {"self": 0, "prev": -1, "next": 1}


def _softmax(scores: np.ndarray, vis: np.ndarray) -> np.ndarray:
    s = np.where(vis, scores, -np.inf)
    s = s - s.max(1, keepdims=True)
    a = np.exp(s)
    return a / a.sum(1, keepdims=True)


def _rotary(rng, d: np.ndarray, offset: int, low: float, top: float) -> np.ndarray:
    """mean_f cos(theta_f (d - offset)), theta log-uniform in [low, top], evaluated once per offset."""
    theta = np.exp(rng.uniform(np.log(low), np.log(top), size=int(rng.integers(8, 33))))
    n = d.shape[0]
    rel = np.arange(-(n - 1), n) - offset
    per_offset = np.cos(rel[:, None] * theta).mean(-1)
    return per_offset[d + n - 1]


def _beta(share: float, targets_per_row: float, visible_per_row: float) -> float:
    """Score that gives ``targets_per_row`` keys a ``share`` of a row of ``visible_per_row`` flat keys."""
    others = max(visible_per_row - targets_per_row, 1.0)
    return float(np.log(share / (1 - share) * others / max(targets_per_row, 1.0)))


def _kernel(rng, t: str, tk, d: np.ndarray, vis: np.ndarray):
    """(kernel [n, n] with targets at 1, target mask [n, n] bool, targets per row) of type ``t``."""
    n = tk.n
    if t in OFFSETS:
        k = _rotary(rng, d, OFFSETS[t], 0.3, np.pi)
        return k, (d == OFFSETS[t]) & vis, 1.0
    if t == "band":
        w = min(int(rng.integers(2, 9)), max(2, n // 4))
        k = _rotary(rng, d, 0, 0.02, np.pi / w)
        return k, (np.abs(d) <= w) & vis, 2 * w + 1.0
    if t == "first":
        k = np.zeros((n, n))
        k[:, 0] = 1.0
        return k, (k > 0) & vis, 1.0
    if t in ("sep", "punct"):
        cols = tk.sep_pos if t == "sep" else tk.punct_pos
        k = np.zeros((n, n))
        k[:, cols] = rng.uniform(0.6, 1.0, size=len(cols))
        return k, (k > 0) & vis, float(max(len(cols), 1))
    if t == "block":
        seg = tk.segments.copy()
        punct = tk.punct_pos
        if len(punct) and (tk.sentences or np.bincount(seg).max() > 0.6 * n):  # no block over 60%
            lo = max(1, len(punct) // 4) if tk.sentences else 1
            cuts = rng.choice(punct, size=min(int(rng.integers(lo, max(lo, 3) + 1)), len(punct)), replace=False)
            for c in cuts:
                seg[c + 1 :] += 1
        k = (seg[:, None] == seg[None, :]).astype(float)
        return k, (k > 0) & vis, float(np.bincount(seg).mean())
    if t == "hetero":
        r = int(rng.integers(2, 9))
        u, v = rng.standard_normal((n, r)), rng.standard_normal((n, r))
        k = u @ v.T / np.sqrt(r)
        k = np.where(vis, k, -np.inf)
        top = np.argsort(-k, axis=1)[:, :3]
        mask = np.zeros((n, n), bool)
        np.put_along_axis(mask, top, True, axis=1)
        k = np.where(vis, k, 0.0) / 2.0  # about +1 on a row's best keys
        return k, mask & vis, 3.0
    raise ValueError(t)


def circuit_map(rng: np.random.Generator, tk, dominant: str) -> tuple[np.ndarray, dict] | None:
    """A map of type ``dominant`` on the token roles ``tk`` (generator._Tokens), or None when the
    drawn circuits do not make ``dominant`` the clear winner. Returns (map [n, n], masses)."""
    n = tk.n
    vis = np.tril(np.ones((n, n), bool)) if tk.causal else np.ones((n, n), bool)
    n_vis = float(vis.sum(1).mean())
    d = np.arange(n)[None, :] - np.arange(n)[:, None]  # key - query
    allowed = [t for t in SECONDARY if t != dominant]
    p = np.array([SECONDARY[t] for t in allowed])
    n_sec = int(rng.choice(3, p=[0.3, 0.5, 0.2]))
    secondary = list(rng.choice(allowed, size=n_sec, replace=False, p=p / p.sum())) if n_sec else []
    scores = np.zeros((n, n))
    masks = {}
    if dominant == "broad":
        walk = np.cumsum(rng.standard_normal(n))
        field = (walk - walk.mean()) / max(walk.std(), 1e-9)
        scores += rng.uniform(0.3, 1.5) * field[None, :]
    else:
        k, masks[dominant], per_row = _kernel(rng, dominant, tk, d, vis)
        scores += _beta(rng.uniform(0.55, 0.95), per_row, n_vis) * k
    for t in secondary:
        k, masks[t], per_row = _kernel(rng, str(t), tk, d, vis)
        scores += _beta(rng.uniform(0.05, 0.35), per_row, n_vis) * k
    r = 8
    content = rng.standard_normal((n, r)) @ rng.standard_normal((n, r)).T / np.sqrt(r)
    scores += rng.uniform(0.2, 1.0) * content + rng.normal(0.0, rng.uniform(0.1, 0.6), size=(n, n))
    a = _softmax(scores, vis)

    def mass(mask: np.ndarray) -> float:
        rows = mask.any(1)
        return float((a * mask).sum(1)[rows].mean()) if rows.any() else 0.0

    dom_mask = masks.get(dominant)
    sec = {t: mass(masks[t] & ~dom_mask) if dom_mask is not None else mass(masks[t]) for t in secondary}
    if dominant == "broad":
        ent = -(a * np.log(np.where(a > 0, a, 1.0))).sum(1) / np.log(np.maximum(vis.sum(1), 2))
        if float(ent[1:].mean()) < 0.70 or max(sec.values(), default=0.0) > 0.35:
            return None
        masses = {"broad": 1.0 - sum(sec.values())}
    else:
        dom = mass(dom_mask)
        if dom < 0.40 or dom - max(sec.values(), default=0.0) < MARGIN:
            return None
        masses = {dominant: dom}
    masses.update({str(t): m for t, m in sec.items()})
    return a, masses
