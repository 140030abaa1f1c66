"""Fit on a seeded sample, then transform and assign every map, one store chunk at a time.

Memory stays bounded by the fit sample plus one chunk of rows, whatever the dataset's size:

1. draw a seeded sample of at most ``reduce.fit_sample`` maps and read their features;
2. fit PCA (then UMAP, if enabled) on the sample; fit the clusterer on the reduced sample;
3. pass over the store chunk by chunk: transform, assign a cluster, write ``reduced``, ``coords``
   and ``cluster`` rows.

KMeans assigns new maps with ``predict``. DBSCAN and HDBSCAN have no ``predict``: when the sample
is not the whole dataset, each other map takes the label of its nearest fitted neighbour in the
reduced space (noise stays noise). On a GPU the same code runs on cuML with CuPy blocks; with several
GPU workers PCA and KMeans use cuml.dask (multi-GPU) on the whole feature array.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zarr

from rapids_attn.backends import LearnBackend
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import mark_complete, read_strings

log = logging.getLogger(__name__)


def _blocks(n_examples: int, rows: int):
    for start in range(0, n_examples, rows):
        yield start, min(start + rows, n_examples)


def _sample_maps(
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


def sweep_k(backend: LearnBackend, z, k_range: list[int], sample: int, sil_sample: int, seed: int) -> dict:
    """KMeans inertia and silhouette for each k in [first, last] on a seeded sample of ``z``."""
    n = z.shape[0]
    idx = _sample_maps(n, sample, seed)
    zs = z[backend.xp.asarray(idx)] if backend.gpu else z[idx]
    ks = [k for k in range(k_range[0], k_range[1] + 1) if k < len(idx)]
    inertia, sil = [], []
    for k in ks:
        km = backend.kmeans(k, seed)
        labels = km.fit_predict(zs)
        inertia.append(float(km.inertia_))
        sil.append(backend.silhouette(zs, labels, sil_sample, seed))
    scored = [(s, k) for k, s in zip(ks, sil) if s is not None]
    best = max(scored)[1] if scored else None
    return {"k": ks, "inertia": inertia, "silhouette": sil, "best_silhouette_k": best, "n": len(idx)}


def _read_sample(backend: LearnBackend, feats, idx: np.ndarray, rows: int):
    """Features of the sampled maps (flat map indices, sorted), read chunk by chunk."""
    e, nl, nh, d = feats.shape
    per_ex = nl * nh
    parts = []
    for start, stop in _blocks(e, rows):
        lo, hi = np.searchsorted(idx, [start * per_ex, stop * per_ex])
        if hi > lo:
            block = backend.read(feats, slice(start, stop)).reshape(-1, d)
            parts.append(block[backend.xp.asarray(idx[lo:hi] - start * per_ex)])
    return backend.xp.concatenate(parts)


class _Model:
    """The fitted reduce-and-cluster chain, applied block by block."""

    def __init__(self, reduce, cluster, seed: int, backend: LearnBackend, dim: int):
        self.reduce_cfg, self.cluster_cfg = reduce, cluster
        self.backend = backend
        self.seed = seed
        self.pca = backend.pca(min(reduce.pca_components, dim), self.seed)
        u = reduce.umap
        self.umap = backend.umap(u.n_components, u.n_neighbors, u.min_dist, u.metric, self.seed) if u.enabled else None
        self.method = cluster.method
        self.fit_z = None
        self.fit_labels = None
        self.nn = None
        self.sweep = None

    def fit(self, x):
        c = self.cluster_cfg
        t0 = time.perf_counter()
        self.pca.fit(x)
        z = self.pca.transform(x)
        if self.umap is not None:
            z = self.umap.fit_transform(z)
        t1 = time.perf_counter()
        self.seconds = {"reduce_fit": t1 - t0, "k_sweep": 0.0}
        if self.method == "kmeans":
            if c.k_sweep is not None:
                self.sweep = sweep_k(self.backend, z, c.k_sweep, c.sweep_sample, c.silhouette_sample, self.seed)
                self.seconds["k_sweep"] = time.perf_counter() - t1
            k = c.n_clusters
            if k == "auto":
                k = self.sweep["best_silhouette_k"] or c.k_sweep[0]
            if self.sweep is not None:
                self.sweep["chosen"] = int(k)
            self.clusterer = self.backend.kmeans(int(k), self.seed)
            labels = self.clusterer.fit_predict(z)
        elif self.method == "dbscan":
            labels = self.backend.dbscan(c.eps, c.min_samples).fit_predict(z)
        else:
            labels = self.backend.hdbscan(c.min_cluster_size, c.min_samples).fit_predict(z)
        self.fit_z, self.fit_labels = z, self.backend.asarray(labels).astype(self.backend.xp.int32)
        self.seconds["cluster_fit"] = time.perf_counter() - t1 - self.seconds["k_sweep"]
        return z, self.fit_labels

    def transform(self, x):
        p = self.pca.transform(x)
        z = self.umap.transform(p) if self.umap is not None else p
        return p, z

    def assign(self, z):
        xp = self.backend.xp
        if self.method == "kmeans":
            return xp.asarray(self.clusterer.predict(z)).astype(xp.int32)
        if self.nn is None:
            self.nn = self.backend.nearest_neighbors().fit(self.fit_z)
        _, ind = self.nn.kneighbors(z)
        return self.fit_labels[xp.asarray(ind)[:, 0]]


def _output_arrays(g: zarr.Group, e: int, nl: int, nh: int, rows: int, k: int):
    level = int(dict(g.attrs.get(S.Attr.LAYOUT, {})).get("compression_level", 3))  # as the extract stage's arrays
    reduced = S.create_array(g, S.REDUCED, (e, nl, nh, k), chunks=(rows, nl, nh, k), compression_level=level)
    coords = S.create_array(g, S.COORDS, (e, nl, nh, 2), chunks=(rows, nl, nh, 2), compression_level=level)
    labels = S.create_array(g, S.CLUSTER, (e, nl, nh), chunks=(rows, nl, nh), compression_level=level)
    return reduced, coords, labels


def supports_multi_gpu(reduce, cluster) -> bool:
    """Whether this fit can run on cuml.dask across GPU workers: KMeans with a fixed k on the PCA
    output. UMAP, DBSCAN, HDBSCAN and the k sweep (``n_clusters: auto``) fit in the job process."""
    return cluster.method == "kmeans" and isinstance(cluster.n_clusters, int) and not reduce.umap.enabled


def fit_store(
    g: zarr.Group, reduce, cluster, backend: LearnBackend, seed: int = 0, client=None, multi_gpu: bool = False
) -> dict:
    """Reduce and cluster every map of the store ``g`` (its ``features``); write ``reduced``,
    ``coords`` and ``cluster``; return what was done (also kept as the store's ``learn`` attribute).

    ``reduce`` and ``cluster`` are the job's ReduceConfig and ClusterConfig; any store with a
    ``features`` array works, with no job file. ``multi_gpu`` (from the device plan) fits PCA and
    KMeans with cuml.dask over the GPU workers of ``client`` when there are at least two."""
    mark_complete(g, "learn", False)
    feats = g[S.FEATURES]
    e, nl, nh, d = feats.shape
    rows = feats.chunks[0]
    n_maps = e * nl * nh
    timings = {}

    t0 = time.perf_counter()
    groups = None
    if reduce.sample_by == "group":
        _, groups = np.unique(read_strings(g[S.EXAMPLE_GROUP]), return_inverse=True)
    idx = _sample_maps(n_maps, reduce.fit_sample, seed, groups, nl * nh)
    x_fit = _read_sample(backend, feats, idx, rows)
    timings["read_sample"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    model = _Model(reduce, cluster, seed, backend, d)
    if multi_gpu and backend.gpu and supports_multi_gpu(reduce, cluster):
        from rapids_attn.devices import count_gpu_workers

        if count_gpu_workers(client) > 1:
            model = _MultiGPUModel(reduce, cluster, seed, backend, client, d)
    model.fit(x_fit)
    timings["fit"] = time.perf_counter() - t1
    timings.update(getattr(model, "seconds", {}))

    k = int(getattr(model.pca, "n_components_", None) or min(reduce.pca_components, d))
    reduced_a, coords_a, labels_a = _output_arrays(g, e, nl, nh, rows, k)
    t2 = time.perf_counter()
    counts: dict[int, int] = {}
    for start, stop in _blocks(e, rows):
        x = backend.read(feats, slice(start, stop)).reshape(-1, d)
        p, z = model.transform(x)
        lab = model.assign(z)
        coords = z[:, :2] if model.umap is not None else p[:, :2]
        m = stop - start
        reduced_a[start:stop] = backend.to_numpy(p).reshape(m, nl, nh, -1).astype(np.float16)
        coords_a[start:stop] = backend.to_numpy(coords).reshape(m, nl, nh, 2).astype(np.float32)
        lab_np = backend.to_numpy(lab).reshape(m, nl, nh).astype(np.int32)
        labels_a[start:stop] = lab_np
        for c, n in zip(*np.unique(lab_np, return_counts=True)):
            counts[int(c)] = counts.get(int(c), 0) + int(n)
    timings["assign"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    sil = backend.silhouette(model.fit_z, model.fit_labels, cluster.silhouette_sample, seed)
    timings["silhouette"] = time.perf_counter() - t3
    evr = getattr(model.pca, "explained_variance_ratio_", None)
    info = {
        "backend": backend.name,
        "backend_reason": backend.reason,
        "multi_gpu": isinstance(model, _MultiGPUModel),
        "method": cluster.method,
        "n_maps": n_maps,
        "n_fit": len(idx),
        "pca_components": k,
        "pca_explained_variance": float(backend.to_numpy(evr).sum()) if evr is not None else None,
        "umap": reduce.umap.enabled,
        "n_clusters": len([c for c in counts if c >= 0]),
        "cluster_sizes": {str(c): n for c, n in sorted(counts.items())},
        "noise_share": counts.get(-1, 0) / n_maps if n_maps else 0.0,
        "silhouette": sil,
        "silhouette_sample": min(cluster.silhouette_sample, len(idx)),
        "k_sweep": model.sweep,
        "sample_by": reduce.sample_by,
        "seconds": timings,
    }
    mark_complete(g, "learn", True, info)
    return info


# ------------------------------------------------------------------------------------------------
# multi-GPU (cuml.dask). Thin on cuML's documented API; see docs/architecture.md for what was run.


class _MultiGPUModel(_Model):
    """PCA and KMeans fitted with cuml.dask across every GPU worker of the Dask cluster."""

    def __init__(self, reduce, cluster, seed: int, backend: LearnBackend, client, dim: int):
        from cuml.dask.cluster import KMeans
        from cuml.dask.decomposition import PCA

        super().__init__(reduce, cluster, seed, backend, dim)
        self.client = client
        self.pca = PCA(client=client, n_components=min(reduce.pca_components, dim))
        self.clusterer = KMeans(client=client, n_clusters=cluster.n_clusters, random_state=self.seed)

    def _distributed(self, x):
        import dask.array as da

        n_parts = max(1, len(self.client.scheduler_info()["workers"]))
        return da.from_array(x, chunks=(max(1, -(-x.shape[0] // n_parts)), x.shape[1]), asarray=False)

    def fit(self, x):
        dx = self._distributed(x)
        self.pca.fit(dx)
        z = self.pca.transform(dx)
        self.clusterer.fit(z)
        labels = self.clusterer.predict(z).compute()
        self.fit_z = z.compute()
        self.fit_labels = self.backend.asarray(labels).astype(self.backend.xp.int32)
        return self.fit_z, self.fit_labels

    def transform(self, x):
        p = self.pca.transform(self._distributed(x)).compute()
        return p, p

    def assign(self, z):
        return self.backend.xp.asarray(self.clusterer.predict(self._distributed(z)).compute()).astype(
            self.backend.xp.int32
        )
