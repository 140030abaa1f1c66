"""The learn stage's store I/O: the chunks of examples it walks, the seeded sample of maps it fits on, and the
rows it writes (``reduced``, ``coords``, ``cluster``), shared by the fit in one process (:mod:`rapids_attn.learn.fit`)
and the fit spread over GPU workers (:mod:`rapids_attn.learn.spread`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import zarr

from rapids_attn.backends import LearnBackend
from rapids_attn.store import schema as S

if TYPE_CHECKING:
    from rapids_attn.learn.estimator import MapClusterer


def blocks(n_examples: int, rows: int):
    for start in range(0, n_examples, rows):
        yield start, min(start + rows, n_examples)


def sample_maps(
    n_maps: int, size: int, seed: int, groups: np.ndarray | None = None, maps_per_example: int = 1
) -> np.ndarray:
    """Sorted flat map indices of a seeded sample of at most ``size`` maps.

    With ``groups`` (one code per example), each group contributes an equal share (or all it has,
    the rest being spread over the larger groups), so a group with many examples cannot dominate.
    """
    if n_maps <= size:
        return np.arange(n_maps)
    rng = np.random.default_rng(seed)
    if groups is None:
        return np.sort(rng.choice(n_maps, size, replace=False))
    map_groups = np.repeat(groups, maps_per_example)
    members = [np.flatnonzero(map_groups == g) for g in np.unique(groups)]
    quota, left = {}, size
    for i in sorted(range(len(members)), key=lambda i: len(members[i])):  # smallest groups first
        share = left // (len(members) - len(quota))
        quota[i] = min(len(members[i]), share)
        left -= quota[i]
    return np.sort(np.concatenate([rng.choice(members[i], quota[i], replace=False) for i in quota]))


def read_sample(backend: LearnBackend, feats, idx: np.ndarray, rows: int):
    """Features of the sampled maps (flat map indices, sorted), read chunk by chunk."""
    e, nl, nh, d = feats.shape
    per_ex = nl * nh
    parts = []
    for start, stop in blocks(e, rows):
        lo, hi = np.searchsorted(idx, [start * per_ex, stop * per_ex])
        if hi > lo:
            block = backend.read(feats, slice(start, stop)).reshape(-1, d)
            parts.append(block[backend.xp.asarray(idx[lo:hi] - start * per_ex)])
    return backend.xp.concatenate(parts)


#: the most bytes the k sweep's silhouette distances may take (float32: a sample of about 8,000 maps)


def write_block(model: MapClusterer, outputs, x, start: int, stop: int) -> dict[int, int]:
    """Transform and assign the maps of examples [start, stop) (features ``x``, one row per map),
    write their rows of ``reduced``, ``coords`` and ``cluster``; return the label counts."""
    reduced_a, coords_a, labels_a = outputs
    _, nl, nh = labels_a.shape
    backend = model.backend_
    p, z = model.project(x)
    lab = model.predict_embedding(z)
    coords = z[:, :2] if model.umap_ is not None else p[:, :2]
    m = stop - start
    reduced_a[start:stop] = backend.to_numpy(p).reshape(m, nl, nh, -1).astype(np.float16)
    coords_a[start:stop] = backend.to_numpy(coords).reshape(m, nl, nh, 2).astype(np.float32)
    lab_np = backend.to_numpy(lab).reshape(m, nl, nh).astype(np.int32)
    labels_a[start:stop] = lab_np
    return {int(c): int(n) for c, n in zip(*np.unique(lab_np, return_counts=True))}


def add_counts(total: dict[int, int], part: dict[int, int]) -> None:
    for c, n in part.items():
        total[c] = total.get(c, 0) + n


def output_arrays(g: zarr.Group, e: int, nl: int, nh: int, rows: int, k: int):
    level = int(dict(g.attrs.get(S.Attr.LAYOUT, {})).get("compression_level", 3))  # as the extract stage's arrays
    reduced = S.create_array(g, S.REDUCED, (e, nl, nh, k), chunks=(rows, nl, nh, k), compression_level=level)
    coords = S.create_array(g, S.COORDS, (e, nl, nh, 2), chunks=(rows, nl, nh, 2), compression_level=level)
    labels = S.create_array(g, S.CLUSTER, (e, nl, nh), chunks=(rows, nl, nh), compression_level=level)
    return reduced, coords, labels


#: a density clusterer leaving more than this share of the maps as noise gets a warning


def learn_key(attrs) -> str:
    """Identifies a clustering (the learn stage's result in the store's attributes ``attrs``): what a stage that
    used it (the heads stage's cluster sets) records, so the report can tell when the store has been clustered
    again since."""
    import hashlib
    import json

    learn = attrs.get(S.Attr.LEARN) or {}
    return hashlib.sha256(json.dumps(learn, sort_keys=True, default=str).encode()).hexdigest()[:16]
