"""Heads of two models matched to each other from what their runs stored (issue 50's cross-model head matching),
with no re-extraction.

A head's **profile** is the dataset mean of what the capture keeps for each of its maps: the scalar statistics,
the head detectors and the offset profile (:mod:`rapids_attn.extract.signature`), one vector per head. Two runs
over the same data give two sets of profiles; the features are put on one scale (each standardised over the heads
of both models together) and heads are matched by an optimal assignment on the Euclidean distances between
profiles (:func:`scipy.optimize.linear_sum_assignment`):

- :func:`match_within_layers`: two models of the same depth, each layer's heads assigned to the other model's
  heads of the same layer (a permutation per layer). A copy of a model whose heads were permuted within each layer
  (query, key, value and output weights together, the function unchanged) is matched back to that permutation.
- :func:`match_heads`: any two models, every head of the smaller set assigned to one of the other's, with a cost
  for the difference in relative depth (layer / (layers - 1)) added to the profile distance.

:func:`layer_similarity` compares whole layers instead: representational similarity analysis over the examples
both runs share (Spearman's correlation of the two layers' example-by-example dissimilarity matrices, each
example described by its layer's head statistics). It does not depend on the order of the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rapids_attn.store import schema as S


@dataclass
class HeadProfiles:
    """One run's head profiles: ``features`` [layer, head, feature] (dataset means) and their names."""

    layers: list[int]
    heads: list[int]
    names: list[str]
    features: np.ndarray


def head_profiles(g) -> HeadProfiles:
    """A store's head profiles: the mean over examples of every statistic, detector and profile offset of each head
    (a NaN map, a detector without a target in that example, left out of its mean), read a chunk at a time."""
    import warnings

    parts = [
        (S.STATS, [str(x) for x in g[S.STAT][:]]),
        (S.DETECTORS, [str(x) for x in g[S.DETECTOR][:]]),
        (S.PROFILE, [f"offset {int(x)}" for x in g[S.OFFSET][:]]),
    ]
    feats, names = [], []
    for spec, cols in parts:
        arr = g[spec]
        e = arr.shape[0]
        total = np.zeros(arr.shape[1:], np.float64)
        count = np.zeros(arr.shape[1:], np.float64)
        step = max(1, arr.chunks[0])
        for a in range(0, e, step):
            v = np.asarray(arr[a : a + step], np.float64)
            ok = np.isfinite(v)
            total += np.where(ok, v, 0.0).sum(0)
            count += ok.sum(0)
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            feats.append(np.where(count > 0, total / np.maximum(count, 1), np.nan))
        names += [f"{spec}:{c}" for c in cols]
    return HeadProfiles(
        layers=[int(x) for x in g[S.LAYER][:]],
        heads=[int(x) for x in g[S.HEAD][:]],
        names=names,
        features=np.concatenate(feats, axis=-1),
    )


def standardise(*profiles: np.ndarray) -> list[np.ndarray]:
    """Each feature z-scored over the heads of every model together (the same scale for all); a feature undefined
    for a head (NaN) is set to the feature's mean, 0, so it adds nothing to a distance; a constant feature is 0."""
    flat = np.concatenate([p.reshape(-1, p.shape[-1]) for p in profiles])
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(np.where(np.isfinite(flat), flat, np.nan), 0) if len(flat) else 0
        sd = np.nanstd(np.where(np.isfinite(flat), flat, np.nan), 0) if len(flat) else 1
    mean = np.nan_to_num(mean)
    sd = np.where(np.isfinite(sd) & (sd > 1e-12), sd, 1.0)
    return [np.nan_to_num((p - mean) / sd, nan=0.0) for p in profiles]


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[n, m] Euclidean distances between the rows of ``a`` [n, f] and ``b`` [m, f]."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(d2, 0.0))


@dataclass
class LayerMatch:
    """Per layer, the head of the other model each head is matched to (``match[layer][h]``), the matched
    distances, and the margin: how much farther each head's second-nearest head of the other model is than its
    match (small: the match is a close call)."""

    match: np.ndarray  # [layer, head] index into the other model's heads of that layer
    distance: np.ndarray  # [layer, head]
    margin: np.ndarray  # [layer, head]


def match_within_layers(a: HeadProfiles, b: HeadProfiles) -> LayerMatch:
    """Two runs of models of the same depth and width: each layer's heads assigned one to one."""
    from scipy.optimize import linear_sum_assignment

    fa, fb = a.features, b.features
    if fa.shape[:2] != fb.shape[:2]:
        raise ValueError(f"match_within_layers: shapes {fa.shape[:2]} and {fb.shape[:2]} differ; use match_heads")
    if a.names != b.names:
        raise ValueError("match_within_layers: the runs stored different features")
    za, zb = standardise(fa, fb)
    nl, nh = fa.shape[:2]
    match = np.zeros((nl, nh), np.int64)
    dist = np.zeros((nl, nh))
    margin = np.zeros((nl, nh))
    for i in range(nl):
        d = _distances(za[i], zb[i])
        rows, cols = linear_sum_assignment(d)
        match[i, rows] = cols
        dist[i, rows] = d[rows, cols]
        if nh > 1:
            margin[i] = np.sort(d, axis=1)[:, 1] - d[np.arange(nh), match[i]]
    return LayerMatch(match, dist, margin)


@dataclass
class HeadMatch:
    """Pairs ``(layer_a, head_a) -> (layer_b, head_b)`` for every head of the smaller model, with their costs."""

    pairs: list[tuple[tuple[int, int], tuple[int, int], float]]


def match_heads(a: HeadProfiles, b: HeadProfiles, depth_weight: float = 1.0) -> HeadMatch:
    """Any two models: every head of the model with fewer heads assigned to a distinct head of the other, by profile
    distance plus ``depth_weight`` x the difference of relative depths (times the mean profile distance, so the
    weight reads on the profiles' scale)."""
    from scipy.optimize import linear_sum_assignment

    if a.names != b.names:
        raise ValueError("match_heads: the runs stored different features")
    za, zb = standardise(a.features, b.features)
    la, ha = a.features.shape[:2]
    lb, hb = b.features.shape[:2]
    d = _distances(za.reshape(la * ha, -1), zb.reshape(lb * hb, -1))
    depth_a = np.repeat(np.arange(la) / max(1, la - 1), ha)
    depth_b = np.repeat(np.arange(lb) / max(1, lb - 1), hb)
    cost = d + depth_weight * float(d.mean() if d.size else 0.0) * np.abs(depth_a[:, None] - depth_b[None, :])
    rows, cols = linear_sum_assignment(cost)
    pairs = [
        ((a.layers[r // ha], a.heads[r % ha]), (b.layers[c // hb], b.heads[c % hb]), float(cost[r, c]))
        for r, c in zip(rows, cols, strict=True)
    ]
    return HeadMatch(pairs)


def _layer_vectors(g, rows: np.ndarray, stat_cols: list[int]) -> np.ndarray:
    """[layer, example, head x stat] for the store's ``rows`` (NaN -> 0)."""
    stats = np.asarray(g[S.STATS].get_orthogonal_selection((rows, slice(None), slice(None), stat_cols)), np.float64)
    x = np.nan_to_num(stats)  # [example, layer, head, stat]
    return x.transpose(1, 0, 2, 3).reshape(x.shape[1], x.shape[0], -1)


def _rdm(x: np.ndarray) -> np.ndarray:
    """The upper triangle of the examples' Euclidean dissimilarity matrix, each feature z-scored first."""
    sd = x.std(0)
    z = (x - x.mean(0)) / np.where(sd > 1e-12, sd, 1.0)
    d = _distances(z, z)
    return d[np.triu_indices(len(x), 1)]


def layer_similarity(ga, gb, sample: int = 256, seed: int = 0) -> np.ndarray:
    """[layers of a, layers of b]: Spearman's correlation between the two layers' dissimilarity matrices over up to
    ``sample`` examples both stores hold (matched by ``example_id``); each example is described by its layer's
    heads' statistics (those defined at every length, :data:`rapids_attn.extract.signature.ALWAYS_DEFINED`)."""
    from scipy.stats import spearmanr

    from rapids_attn.extract.signature import ALWAYS_DEFINED

    ids_a = [str(x) for x in ga[S.EXAMPLE_ID][:]]
    ids_b = {str(x): i for i, x in enumerate(gb[S.EXAMPLE_ID][:])}
    common = [(i, ids_b[x]) for i, x in enumerate(ids_a) if x in ids_b]
    if len(common) < 3:
        raise ValueError(f"layer_similarity: the runs share {len(common)} examples; at least 3 are needed")
    rng = np.random.default_rng(seed)
    pick = sorted(rng.choice(len(common), size=min(sample, len(common)), replace=False).tolist())
    rows_a = np.array([common[k][0] for k in pick])
    rows_b = np.array([common[k][1] for k in pick])
    cols = lambda g: [[str(x) for x in g[S.STAT][:]].index(n) for n in ALWAYS_DEFINED]
    va = _layer_vectors(ga, rows_a, cols(ga))
    vb = _layer_vectors(gb, rows_b, cols(gb))
    ra = [_rdm(v) for v in va]
    rb = [_rdm(v) for v in vb]
    out = np.zeros((len(ra), len(rb)))
    for i, x in enumerate(ra):
        for j, y in enumerate(rb):
            out[i, j] = spearmanr(x, y).statistic
    return out
