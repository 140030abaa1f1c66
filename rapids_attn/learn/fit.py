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
from rapids_attn.store.zarr_store import mark_learn, read_strings

log = logging.getLogger(__name__)


def _blocks(n_examples: int, rows: int):
    for start in range(0, n_examples, rows):
        yield start, min(start + rows, n_examples)


def _sample_maps(n_maps: int, size: int, seed: int, groups: np.ndarray | None = None,
                 maps_per_example: int = 1) -> np.ndarray:
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
    return {"k": ks, "inertia": inertia, "silhouette": sil, "best_silhouette_k": best, "n": int(len(idx))}


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

    def __init__(self, cfg, backend: LearnBackend, dim: int):
        self.cfg = cfg
        self.backend = backend
        self.seed = cfg.runtime.seed
        self.pca = backend.pca(min(cfg.reduce.pca_components, dim), self.seed)
        u = cfg.reduce.umap
        self.umap = backend.umap(u.n_components, u.n_neighbors, u.min_dist, u.metric, self.seed) if u.enabled else None
        self.method = cfg.cluster.method
        self.fit_z = None
        self.fit_labels = None
        self.nn = None
        self.sweep = None

    def fit(self, x):
        c = self.cfg.cluster
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
    dims = ("example", "layer", "head")
    kw = dict(overwrite=True, fill_value=0)
    reduced = g.create_array("reduced", shape=(e, nl, nh, k), chunks=(rows, nl, nh, k), dtype="float16",
                             dimension_names=(*dims, "component"), **kw)
    coords = g.create_array("coords", shape=(e, nl, nh, 2), chunks=(rows, nl, nh, 2), dtype="float32",
                            dimension_names=(*dims, "xy"), **kw)
    labels = g.create_array("cluster", shape=(e, nl, nh), chunks=(rows, nl, nh), dtype="int32",
                            dimension_names=dims, overwrite=True, fill_value=-1)
    return reduced, coords, labels


def run_learn(g: zarr.Group, cfg, backend: LearnBackend, client=None) -> dict:
    """Reduce and cluster every map of the store; write the results; return a summary dict."""
    mark_learn(g, False)
    feats = g["features"]
    e, nl, nh, d = feats.shape
    rows = feats.chunks[0]
    n_maps = e * nl * nh
    seed = cfg.runtime.seed
    timings = {}

    t0 = time.perf_counter()
    groups = None
    if cfg.reduce.sample_by == "group":
        _, groups = np.unique(read_strings(g["example_group"]), return_inverse=True)
    idx = _sample_maps(n_maps, cfg.reduce.fit_sample, seed, groups, nl * nh)
    x_fit = _read_sample(backend, feats, idx, rows)
    timings["read_sample"] = time.perf_counter() - t0

    n_gpu_workers = _gpu_workers(client) if backend.gpu else 0
    t1 = time.perf_counter()
    model = _Model(cfg, backend, d)
    if n_gpu_workers > 1 and cfg.cluster.method == "kmeans" and not cfg.reduce.umap.enabled:
        model = _MultiGPUModel(cfg, client, d)
    model.fit(x_fit)
    timings["fit"] = time.perf_counter() - t1
    timings.update(getattr(model, "seconds", {}))

    k = int(getattr(model.pca, "n_components_", None) or min(cfg.reduce.pca_components, d))
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
    sil = backend.silhouette(model.fit_z, model.fit_labels, cfg.cluster.silhouette_sample, seed)
    timings["silhouette"] = time.perf_counter() - t3
    evr = getattr(model.pca, "explained_variance_ratio_", None)
    info = {
        "backend": backend.name,
        "backend_reason": backend.reason,
        "multi_gpu": isinstance(model, _MultiGPUModel),
        "method": cfg.cluster.method,
        "n_maps": n_maps,
        "n_fit": int(len(idx)),
        "pca_components": k,
        "pca_explained_variance": float(backend.to_numpy(evr).sum()) if evr is not None else None,
        "umap": cfg.reduce.umap.enabled,
        "n_clusters": len([c for c in counts if c >= 0]),
        "cluster_sizes": {str(c): n for c, n in sorted(counts.items())},
        "noise_share": counts.get(-1, 0) / n_maps if n_maps else 0.0,
        "silhouette": sil,
        "silhouette_sample": min(cfg.cluster.silhouette_sample, int(len(idx))),
        "k_sweep": model.sweep,
        "sample_by": cfg.reduce.sample_by,
        "seconds": timings,
    }
    mark_learn(g, True, info)
    return info


# ------------------------------------------------------------------------------------------------
# multi-GPU (cuml.dask). Thin on cuML's documented API; see docs/architecture.md for what was run.


def _gpu_workers(client) -> int:
    if client is None:
        return 0
    try:
        counts = client.run(lambda: __import__("torch").cuda.device_count())
    except Exception:
        return 0
    return sum(1 for c in counts.values() if c > 0)


class _MultiGPUModel(_Model):
    """PCA and KMeans fitted with cuml.dask across every GPU worker of the Dask cluster."""

    def __init__(self, cfg, client, dim: int):
        from cuml.dask.cluster import KMeans
        from cuml.dask.decomposition import PCA

        from rapids_attn.backends import resolve_learn_backend

        super().__init__(cfg, resolve_learn_backend("gpu"), dim)
        self.client = client
        self.pca = PCA(client=client, n_components=min(cfg.reduce.pca_components, dim))
        self.clusterer = KMeans(client=client, n_clusters=cfg.cluster.n_clusters, random_state=self.seed)

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
        return self.backend.xp.asarray(self.clusterer.predict(self._distributed(z)).compute()).astype(self.backend.xp.int32)
