"""Fit on a seeded sample, then transform and assign every map, one store chunk at a time.

Memory stays bounded by the fit sample plus one chunk of rows, whatever the dataset's size:

1. draw a seeded sample of at most ``reduce.fit_sample`` maps and read their features;
2. fit PCA (then UMAP, if enabled) on the sample; fit the clusterer on the reduced sample;
3. pass over the store chunk by chunk: transform, assign a cluster, write ``reduced``, ``coords``
   and ``cluster`` rows.

KMeans assigns new maps with ``predict``. DBSCAN and HDBSCAN have no ``predict``: when the sample
is not the whole dataset, each other map takes the label of its nearest fitted neighbour in the
reduced space (noise stays noise). A density fit that leaves every map, or more than half of them,
as noise still succeeds, with a one-line warning in the result's ``warnings`` (:func:`noise_warnings`),
which the learn stage prints and the report shows. On a GPU the same code runs on cuML with CuPy blocks.

With two or more GPU workers and a fit that cuml.dask can run (PCA then KMeans), the fit is spread
over the GPUs instead (:class:`_SpreadFit`): each worker reads its share of the sample's store chunks
itself, onto its own GPU (the job process reads no features), the parts stay there (persisted,
assigned round-robin), cuml.dask fits PCA and KMeans on them, and every store chunk is then
transformed, assigned and written by a worker. The figures of the single-process fit are kept: the
k sweep runs on one GPU worker over its seeded sample of the reduced maps (gathered from the parts),
and the stability refits are cuml.dask KMeans fits of the whole spread sample with the next seeds.
``summary.json`` records how many parts, workers and distinct GPUs (by UUID) held the fit's data.

A single-GPU fit (cuML) of a run whose workers are up (a local-cuda cluster, or an external one with GPU
workers) runs on one GPU worker (:func:`fit_worker`), not in the job process: the workers hold RMM pools
of most of their GPU's memory (80% by default), so the job process would get what is left of GPU 0.
The worker fits from its own pool and writes the store itself; ``fit_worker`` in the summary names it.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import zarr

from rapids_attn.backends import LearnBackend
from rapids_attn.devices import gpu_ids
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


#: the adjusted Rand index between seeds at which a k counts as stable (the auto pick prefers those)
STABLE_ARI = 0.9


def seed_agreement(
    backend: LearnBackend, z, labels, k: int, seeds: list[int], fits: KMeansFits | None = None, name: str = "fit"
) -> list[float]:
    """The adjusted Rand index of ``labels`` (a KMeans fit of ``z``) against a KMeans refit of ``z`` with
    each of ``seeds``: 1 means the clusters do not depend on the seed. The refits are ``fits``'s (started
    on the workers beforehand, under ``name``), or run here."""
    from sklearn.metrics import adjusted_rand_score

    fits = fits or KMeansFits(backend)
    mine = backend.to_numpy(labels)
    return [round(float(adjusted_rand_score(mine, fits.result(name, z, k, s)[0])), 4) for s in seeds]


def import_estimators() -> None:
    """Import the CPU fit's estimators (scikit-learn: about 1 s), ahead of the fit (LearnStage.warm)."""
    import sklearn.cluster
    import sklearn.decomposition
    import sklearn.metrics  # noqa: F401


def _kmeans_fit(backend: LearnBackend, z, k: int, seed: int) -> tuple[np.ndarray, float]:
    """One KMeans fit of ``z``: its labels (int32, on the host) and inertia. A worker's task, or run here.

    On one thread wherever it runs: scikit-learn's KMeans rounds differently on one and on several threads (the
    labels of a few thousand maps differed in 4 of 50 fits), and a worker runs one thread, so the k sweep and the
    stability figures are the same whether the workers or this process fit them."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        km = backend.kmeans(k, seed)
        labels = km.fit_predict(z)
    return backend.to_numpy(labels).astype(np.int32), float(km.inertia_)


class KMeansFits:
    """The learn stage's extra KMeans fits (the k sweep's, each with a refit for its stability, and the
    stability refits of the fit sample), each named by its data, k and seed.

    With the client of a CPU cluster, :meth:`start` sends them to its workers (the data scattered to each
    once), where they run at once, one per one-thread worker, while this process fits the clusters the
    store gets and scores the silhouettes; :meth:`result` waits for one. Without a client (or on the GPU,
    where one fit takes milliseconds), :meth:`start` does nothing and each fit runs here when its result is
    asked for, one after another, as before. The figures are the same either way, up to the float rounding
    of the threads a fit runs on."""

    def __init__(self, backend: LearnBackend, client=None):
        self.backend = backend
        self.client = client if client is not None and not backend.gpu else None
        self._data: dict = {}
        self._futures: dict = {}
        self._warm = []
        if (
            self.client is not None
        ):  # each worker imports scikit-learn (about 1 s) while this process reads and fits PCA
            self._warm = [
                self.client.submit(import_estimators, workers=[w], pure=False) for w in self.client.nthreads()
            ]

    @property
    def n_workers(self) -> int:
        """The workers the fits were sent to (0: they run in this process)."""
        return len(self.client.nthreads()) if self.client is not None else 0

    def start(self, name: str, z, fits: list[tuple[int, int]]) -> None:
        """Send the fits ``(k, seed)`` of ``z`` to the workers, in this order (no-op without a client)."""
        if self.client is None or not fits:
            return
        if name not in self._data:
            self._data[name] = self.client.scatter(self.backend.to_numpy(z), broadcast=True, hash=False)
        for k, seed in fits:
            if (name, k, seed) not in self._futures:
                fut = self.client.submit(_kmeans_fit, self.backend, self._data[name], k, seed, pure=False)
                self._futures[(name, k, seed)] = fut

    def result(self, name: str, z, k: int, seed: int) -> tuple[np.ndarray, float]:
        """The fit ``(k, seed)`` of ``z``: the workers' (waited for), or run here."""
        fut = self._futures.pop((name, k, seed), None)
        if fut is None:
            return _kmeans_fit(self.backend, z, k, seed)
        return fut.result()

    def release(self) -> None:
        """Cancel what was not asked for and drop the scattered data from the workers."""
        if self.client is None:
            return
        self.client.cancel(list(self._futures.values()) + list(self._data.values()) + self._warm)
        self._warm = []
        self._futures.clear()
        self._data.clear()


def sweep_k(
    backend: LearnBackend,
    z,
    k_range: list[int],
    sample: int,
    sil_sample: int,
    seed: int,
    stability: bool = True,
    fits: KMeansFits | None = None,
) -> dict:
    """KMeans inertia, silhouette and, with ``stability``, the ARI against a refit with the next seed, for
    each k in [first, last] on a seeded sample of ``z``. ``best_silhouette_k`` is the best silhouette
    among the stable k (ARI >= :data:`STABLE_ARI`), or among all when none is stable.

    Every k's silhouette is scored on the same seeded ``sil_sample`` of the sweep's maps (those
    ``backend.silhouette`` draws), so their pairwise distances are computed once for the whole sweep, not
    once per k, while they fit in :data:`SWEEP_DISTANCE_BYTES`. The fits are ``fits``'s: all started on the
    workers at once when it has a client, while this process scores them in order of k."""
    fits = fits or KMeansFits(backend)
    n = z.shape[0]
    idx = _sample_maps(n, sample, seed)
    zs = z[backend.xp.asarray(idx)] if backend.gpu else z[idx]
    ks = [k for k in range(k_range[0], k_range[1] + 1) if k < len(idx)]
    fits.start("sweep", zs, [(k, s) for k in ks for s in ([seed, seed + 1] if stability else [seed])])
    scorer = _SweepSilhouette(backend, zs, sil_sample, seed)
    inertia, sil, agree = [], [], []
    for k in ks:
        labels, km_inertia = fits.result("sweep", zs, k, seed)
        inertia.append(km_inertia)
        sil.append(scorer(labels))
        agree.append(seed_agreement(backend, zs, labels, k, [seed + 1], fits, "sweep")[0] if stability else None)
    scored = [(s, k, a) for k, s, a in zip(ks, sil, agree) if s is not None]
    stable = [(s, k) for s, k, a in scored if a is None or a >= STABLE_ARI]
    best = max(stable or [(s, k) for s, k, _ in scored])[1] if scored else None
    return {
        "k": ks,
        "inertia": inertia,
        "silhouette": sil,
        "stability": agree,
        "best_silhouette_k": best,
        "n": len(idx),
    }


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


#: the most bytes the k sweep's silhouette distances may take (float32: a sample of about 8,000 maps)
SWEEP_DISTANCE_BYTES = 256 << 20


class _SweepSilhouette:
    """The silhouette of each k's labels on one seeded sample of the sweep's maps: the rows
    :meth:`LearnBackend.silhouette` would draw (KMeans labels every map, so they are the same for every k),
    their distances computed once. Beyond :data:`SWEEP_DISTANCE_BYTES`, scored per k as before."""

    def __init__(self, backend: LearnBackend, z, sample: int, seed: int):
        from sklearn.metrics import pairwise_distances

        self.backend, self.z, self.sample, self.seed = backend, z, sample, seed
        n = z.shape[0]
        self.rows = self.dist = None
        if 0 < sample and min(n, sample) ** 2 * 4 <= SWEEP_DISTANCE_BYTES and n >= 3:
            self.rows = np.random.default_rng(seed).choice(n, sample, replace=False) if n > sample else np.arange(n)
            x = backend.to_numpy(z)[self.rows].astype(np.float32)
            self.dist = pairwise_distances(x)

    def __call__(self, labels) -> float | None:
        if self.dist is None:
            return self.backend.silhouette(self.z, labels, self.sample, self.seed)
        lab = self.backend.to_numpy(labels)[self.rows]
        if len(np.unique(lab)) < 2:
            return None
        return silhouette_precomputed(self.dist, lab)


def silhouette_precomputed(dist: np.ndarray, labels: np.ndarray) -> float:
    """scikit-learn's ``silhouette_score(dist, labels, metric="precomputed")``, with each map's summed
    distance to every cluster taken in one matrix product (distances x one-hot labels) instead of a
    ``bincount`` per map: 15-20 times faster on the sweep's 5,000 maps, where scikit-learn took 75 ms per k.
    The same definition: a = mean distance to the other maps of its cluster, b = the least mean distance to
    another cluster's maps, (b - a) / max(a, b), 0 for a map alone in its cluster, averaged over the maps."""
    from sklearn.metrics import silhouette_score

    uniq, lab = np.unique(labels, return_inverse=True)
    n = len(lab)
    if not 2 <= len(uniq) <= n - 1:  # scikit-learn's own error
        return float(silhouette_score(dist, labels, metric="precomputed"))
    onehot = np.zeros((n, len(uniq)), dtype=dist.dtype)
    onehot[np.arange(n), lab] = 1
    sums = (dist @ onehot).astype(np.float64)  # [map, cluster]: summed distances
    freq = np.bincount(lab).astype(np.float64)
    rows = np.arange(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = sums[rows, lab] / (freq[lab] - 1)
        means = sums / freq
        means[rows, lab] = np.inf
        inter = means.min(axis=1)
        sil = (inter - intra) / np.maximum(intra, inter)
    return float(np.mean(np.nan_to_num(sil)))


class _Model:
    """The fitted reduce-and-cluster chain, applied block by block."""

    def __init__(self, reduce, cluster, seed: int, backend: LearnBackend, dim: int, fits: KMeansFits | None = None):
        self.reduce_cfg, self.cluster_cfg = reduce, cluster
        self.fits = fits or KMeansFits(backend)
        self.backend = backend
        self.seed = seed
        self.pca = backend.pca(min(reduce.pca_components, dim), self.seed)
        u = reduce.umap
        self.umap = backend.umap(u.n_components, u.n_neighbors, u.min_dist, u.metric, self.seed) if u.enabled else None
        self.method = cluster.method
        self.clusterer = None
        self.fit_z = None
        self.fit_labels = None
        self.nn = None
        self.sweep = None
        self.seconds: dict = {}

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
            if c.n_clusters != "auto":  # the stability refits' k is known: on the workers first (the largest fits)
                self.fits.start("fit", z, [(int(c.n_clusters), s) for s in self.stability_seeds()])
            if c.k_sweep is not None:
                self.sweep = sweep_k(
                    self.backend,
                    z,
                    c.k_sweep,
                    c.sweep_sample,
                    c.silhouette_sample,
                    self.seed,
                    c.stability_seeds > 0,
                    self.fits,
                )
                self.seconds["k_sweep"] = time.perf_counter() - t1
            k = c.n_clusters
            if k == "auto":
                k = self.sweep["best_silhouette_k"] or c.k_sweep[0]
            if self.sweep is not None:
                self.sweep["chosen"] = int(k)
            self.fits.start("fit", z, [(int(k), s) for s in self.stability_seeds()])  # beside the fit below
            self.clusterer = self.make_clusterer(int(k))
        else:
            self.clusterer = self.make_clusterer()
        labels = self.clusterer.fit_predict(z)
        self.fit_z, self.fit_labels = z, self.backend.asarray(labels).astype(self.backend.xp.int32)
        self.seconds["cluster_fit"] = time.perf_counter() - t1 - self.seconds["k_sweep"]
        return z, self.fit_labels

    def stability_seeds(self) -> list[int]:
        """The seeds of the stability refits: the next ``cluster.stability_seeds`` after the fit's."""
        return [self.seed + i for i in range(1, self.cluster_cfg.stability_seeds + 1)]

    def stability(self) -> dict | None:
        """KMeans's dependence on its seed: the fit's labels of the fit sample against refits with the
        next ``cluster.stability_seeds`` seeds (None for a deterministic method, or when skipped)."""
        if self.method != "kmeans" or not self.cluster_cfg.stability_seeds:
            return None
        t = time.perf_counter()
        seeds = self.stability_seeds()
        k = int(self.clusterer.n_clusters)
        ari = seed_agreement(self.backend, self.fit_z, self.fit_labels, k, seeds, self.fits, "fit")
        self.seconds["stability"] = time.perf_counter() - t
        return {"seeds": seeds, "ari": ari, "min_ari": min(ari), "n_fit": int(self.fit_z.shape[0])}

    def make_clusterer(self, k: int | None = None):
        """The clusterer this fit uses (KMeans needs its k: ``n_clusters``, or the sweep's pick)."""
        c = self.cluster_cfg
        if self.method == "kmeans":
            return self.backend.kmeans(c.n_clusters if k is None else k, self.seed)
        if self.method == "dbscan":
            return self.backend.dbscan(c.eps, c.min_samples)
        return self.backend.hdbscan(c.min_cluster_size, c.min_samples)

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


def _write_block(model: _Model, outputs, x, start: int, stop: int) -> dict[int, int]:
    """Transform and assign the maps of examples [start, stop) (features ``x``, one row per map),
    write their rows of ``reduced``, ``coords`` and ``cluster``; return the label counts."""
    reduced_a, coords_a, labels_a = outputs
    _, nl, nh = labels_a.shape
    backend = model.backend
    p, z = model.transform(x)
    lab = model.assign(z)
    coords = z[:, :2] if model.umap is not None else p[:, :2]
    m = stop - start
    reduced_a[start:stop] = backend.to_numpy(p).reshape(m, nl, nh, -1).astype(np.float16)
    coords_a[start:stop] = backend.to_numpy(coords).reshape(m, nl, nh, 2).astype(np.float32)
    lab_np = backend.to_numpy(lab).reshape(m, nl, nh).astype(np.int32)
    labels_a[start:stop] = lab_np
    return {int(c): int(n) for c, n in zip(*np.unique(lab_np, return_counts=True))}


def _add_counts(total: dict[int, int], part: dict[int, int]) -> None:
    for c, n in part.items():
        total[c] = total.get(c, 0) + n


def _output_arrays(g: zarr.Group, e: int, nl: int, nh: int, rows: int, k: int):
    level = int(dict(g.attrs.get(S.Attr.LAYOUT, {})).get("compression_level", 3))  # as the extract stage's arrays
    reduced = S.create_array(g, S.REDUCED, (e, nl, nh, k), chunks=(rows, nl, nh, k), compression_level=level)
    coords = S.create_array(g, S.COORDS, (e, nl, nh, 2), chunks=(rows, nl, nh, 2), compression_level=level)
    labels = S.create_array(g, S.CLUSTER, (e, nl, nh), chunks=(rows, nl, nh), compression_level=level)
    return reduced, coords, labels


#: a density clusterer leaving more than this share of the maps as noise gets a warning
NOISE_WARN_SHARE = 0.5


def noise_warnings(cluster, counts: dict[int, int], n_maps: int) -> list[str]:
    """One-line warnings when DBSCAN or HDBSCAN left every map (no clusters), or most of them, as
    noise: the run still succeeds, but its clusters describe few maps or none, and the line says
    which setting to change."""
    noise = counts.get(-1, 0)
    if cluster.method == "kmeans" or not n_maps or noise / n_maps <= NOISE_WARN_SHARE:
        return []
    if cluster.method == "hdbscan":
        fix = (
            f"lower cluster.min_cluster_size (now {cluster.min_cluster_size}) or cluster.min_samples "
            f"(now {cluster.min_samples})"
        )
    else:
        fix = f"raise cluster.eps (now {cluster.eps}) or lower cluster.min_samples (now {cluster.min_samples})"
    if noise == n_maps:
        return [f"cluster.{cluster.method} marked all {n_maps:,} maps as noise (no clusters); {fix}, or use kmeans"]
    share = f"{noise:,} of {n_maps:,} maps ({noise / n_maps:.0%})"
    return [f"cluster.{cluster.method} marked {share} as noise; the clusters describe only the rest: {fix}"]


def supports_multi_gpu(reduce, cluster) -> bool:
    """Whether this fit can run on cuml.dask across GPU workers: KMeans on the PCA output (its k fixed, or
    picked by the k sweep, which runs on one GPU worker over the sweep's sample). UMAP, DBSCAN and HDBSCAN
    have no cuml.dask form here: they fit on one GPU, on a worker (:func:`fit_worker`)."""
    return cluster.method == "kmeans" and not reduce.umap.enabled


def fit_worker(backend: LearnBackend, client, ids: dict[str, str | None] | None = None) -> str | None:
    """The worker a single-GPU fit runs on: the first with a GPU, when the fit is cuML's and the job has
    workers (None: the fit runs in this process). The workers' RMM pools hold most of each GPU (80% by
    default): a fit in the job process would get what is left of GPU 0, so it goes to a worker, which fits
    from its pool. With no GPU among the workers (an external cluster of CPU workers) the fit stays here,
    on this process's GPU, which no worker holds."""
    if not backend.gpu or client is None:
        return None
    workers = one_worker_per_gpu(gpu_ids(client) if ids is None else ids)
    return workers[0] if workers else None


def _fit_store_on_worker(store, reduce, cluster, backend: LearnBackend, seed: int) -> dict:
    """On a GPU worker: :func:`fit_store` of the store at ``store`` (it writes the store itself)."""
    return fit_store(zarr.open_group(store, mode="r+"), reduce, cluster, backend, seed)


def _worker_address() -> str | None:
    """The address of the Dask worker running this code (None: the job process)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def fit_store(
    g: zarr.Group, reduce, cluster, backend: LearnBackend, seed: int = 0, client=None, multi_gpu: bool = False
) -> dict:
    """Reduce and cluster every map of the store ``g`` (its ``features``); write ``reduced``,
    ``coords`` and ``cluster``; return what was done (also kept as the store's ``learn`` attribute).

    ``reduce`` and ``cluster`` are the job's ReduceConfig and ClusterConfig; any store with a
    ``features`` array works, with no job file. ``multi_gpu`` (from the device plan) spreads the
    fit over the GPU workers of ``client`` with cuml.dask when at least two distinct GPUs joined
    and the fit has a cuml.dask form; otherwise a cuML fit runs on one GPU worker of ``client``
    (:func:`fit_worker`), and any other fit in this process."""
    ids = gpu_ids(client) if client is not None and (multi_gpu or backend.gpu) else {}
    gpu_workers = one_worker_per_gpu(ids)
    n_gpus = len(gpu_workers)
    spread = multi_gpu and supports_multi_gpu(reduce, cluster) and n_gpus > 1
    worker = None if spread else fit_worker(backend, client, ids)
    if worker is not None:  # the whole fit on that worker, from its RMM pool
        info = client.submit(
            _fit_store_on_worker, g.store, reduce, cluster, backend, seed, workers=[worker], pure=False
        ).result()
        if multi_gpu:
            info["multi_gpu_skipped"] = _spread_skipped(reduce, cluster, n_gpus)
        return info
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
    counts: dict[int, int] = {}
    placement = None
    kmeans_workers = 0
    if spread:
        fit = _SpreadFit(client, backend, feats.store, gpu_workers, seed)
        try:  # the parts are held on the workers' GPUs until released, whatever happens
            fit.fit(feats, idx, reduce, cluster, timings)
            model, placement = fit.model, fit.placement
            t = time.perf_counter()
            stability = fit.stability(cluster.stability_seeds)
            if stability is not None:
                timings["stability"] = time.perf_counter() - t
            k = int(model.pca.n_components)
            _output_arrays(g, e, nl, nh, rows, k)
            t2 = time.perf_counter()
            counts = fit.assign_all(e, rows)
            timings["assign"] = time.perf_counter() - t2
            t3 = time.perf_counter()
            sil = fit.silhouette(cluster.silhouette_sample)
            timings["silhouette"] = time.perf_counter() - t3
        finally:
            fit.release()
    else:
        fits = KMeansFits(backend, client)  # the extra KMeans fits run on the workers of a CPU cluster, if any
        try:
            x_fit = _read_sample(backend, feats, idx, rows)
            timings["read_sample"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            model = _Model(reduce, cluster, seed, backend, d, fits)
            model.fit(x_fit)
            stability = model.stability()
        finally:
            fits.release()
        timings["fit"] = time.perf_counter() - t1
        kmeans_workers = fits.n_workers
        timings.update(model.seconds)
        k = int(getattr(model.pca, "n_components_", None) or min(reduce.pca_components, d))
        outputs = _output_arrays(g, e, nl, nh, rows, k)
        t2 = time.perf_counter()
        for start, stop in _blocks(e, rows):
            x = backend.read(feats, slice(start, stop)).reshape(-1, d)
            _add_counts(counts, _write_block(model, outputs, x, start, stop))
        timings["assign"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        sil = backend.silhouette(model.fit_z, model.fit_labels, cluster.silhouette_sample, seed)
        timings["silhouette"] = time.perf_counter() - t3
    evr = getattr(model.pca, "explained_variance_ratio_", None)
    info = {
        "backend": backend.name,
        "backend_reason": backend.reason,
        "multi_gpu": spread,
        "method": cluster.method,
        "n_maps": n_maps,
        "n_fit": len(idx),
        "pca_components": k,
        "pca_explained_variance": float(backend.to_numpy(evr).sum()) if evr is not None else None,
        "umap": reduce.umap.enabled,
        "n_clusters": len([c for c in counts if c >= 0]),
        "cluster_sizes": {str(c): n for c, n in sorted(counts.items())},
        "noise_share": counts.get(-1, 0) / n_maps if n_maps else 0.0,
        "warnings": noise_warnings(cluster, counts, n_maps),
        "silhouette": sil,
        "silhouette_sample": min(cluster.silhouette_sample, len(idx)),
        "stability": stability,
        "k_sweep": model.sweep,
        "kmeans_workers": kmeans_workers,
        "fit_worker": _worker_address(),  # None: this fit ran in the job process (fit_worker says when not)
        "sample_by": reduce.sample_by,
        "seconds": timings,
    }
    if multi_gpu and not spread:
        info["multi_gpu_skipped"] = _spread_skipped(reduce, cluster, n_gpus)
    if placement is not None:
        info["fit_placement"] = placement
    mark_complete(g, "learn", True, info)
    return info


def _spread_skipped(reduce, cluster, n_gpus: int) -> str:
    """Why a fit the device plan meant to spread over the GPUs was not."""
    return f"{n_gpus} distinct GPU(s) among the workers" if supports_multi_gpu(reduce, cluster) else "no cuml.dask form"


# ------------------------------------------------------------------------------------------------
# the fit spread over the GPU workers (cuml.dask). Thin on cuML's documented API: the estimators
# come from LearnBackend.dask_pca / dask_kmeans; docs/deployment.md says what has run where.


def _read_part(backend: LearnBackend, store, path: str, start: int, stop: int, local: np.ndarray | None):
    """On a worker: the features of examples [start, stop) (one row per map), or of the maps
    ``local`` among them, read from the store onto this worker's device."""
    arr = zarr.open_array(store, path=path, mode="r")
    x = backend.read(arr, slice(start, stop))
    x = x.reshape(-1, x.shape[-1])
    return x if local is None else x[backend.xp.asarray(local)]


def _take(x, rows: np.ndarray):
    """On a worker: the rows ``rows`` of a part (a few, for the silhouette score)."""
    return x[rows]


def _assign_rows(model: _Model, store, start: int, stop: int) -> dict[int, int]:
    """On a worker: read examples [start, stop) of ``features``, transform, assign, write them."""
    feats = zarr.open_array(store, path=S.FEATURES, mode="r")
    outputs = tuple(zarr.open_array(store, path=spec, mode="r+") for spec in (S.REDUCED, S.COORDS, S.CLUSTER))
    x = model.backend.read(feats, slice(start, stop)).reshape(-1, feats.shape[-1])
    return _write_block(model, outputs, x, start, stop)


def one_worker_per_gpu(ids: dict[str, str | None]) -> list[str]:
    """The workers the spread fit uses: one per distinct GPU (by UUID), none without a GPU. cuml.dask
    starts one NCCL rank per worker holding parts, and NCCL refuses two ranks on one device."""
    first: dict[str, str] = {}
    for addr in sorted(ids):
        if ids[addr] is not None:
            first.setdefault(ids[addr], addr)
    return sorted(first.values())


class _SpreadFit:
    """A fit whose data lives on the workers (one per GPU): the sample's parts (futures), the fitted
    single-GPU models (cuml.dask's combined models), and where the parts were."""

    def __init__(self, client, backend: LearnBackend, store, workers: list[str], seed: int):
        self.client, self.backend, self.store = client, backend, store
        self.workers = workers
        self.seed = seed
        self.parts = []  # [(future, n_rows)]
        self.z = None  # the reduced sample (a dask array persisted on the workers)
        self.kmeans = None  # cuml.dask's fitted KMeans
        self.model: _Model | None = None
        self.placement: dict = {}

    def fit(self, feats, idx: np.ndarray, reduce, cluster, timings: dict) -> None:
        """PCA and KMeans fitted with cuml.dask on the sample, read by the workers onto their GPUs."""
        import dask.array as da
        from distributed import wait

        client, backend = self.client, self.backend
        d = feats.shape[-1]
        t0 = time.perf_counter()
        self.parts = _spread_parts(client, backend, feats, idx, feats.chunks[0], self.workers)
        wait([f for f, _ in self.parts])
        timings["read_sample"] = time.perf_counter() - t0
        self.placement = _placement(client, self.parts)
        meta = backend.xp.empty((0, d), dtype=np.float32)
        x = da.concatenate([da.from_delayed(f, shape=(m, d), dtype=np.float32, meta=meta) for f, m in self.parts])

        t1 = time.perf_counter()
        pca = backend.dask_pca(client, min(reduce.pca_components, d))
        pca.fit(x)
        self.z = client.persist(pca.transform(x))  # the reduced sample, on the workers' GPUs
        wait(self.z)
        if any(math.isnan(c) for c in self.z.chunks[0]):  # rows per part, for the sweep's row selection
            self.z.compute_chunk_sizes()
        t2 = time.perf_counter()
        model = _Model(reduce, cluster, self.seed, backend, d)  # the single-GPU chain the workers apply
        if cluster.k_sweep is not None:
            model.sweep = self.sweep(cluster)
        t3 = time.perf_counter()
        k = (
            cluster.n_clusters
            if cluster.n_clusters != "auto"
            else model.sweep["best_silhouette_k"] or cluster.k_sweep[0]
        )
        if model.sweep is not None:
            model.sweep["chosen"] = int(k)
        kmeans = backend.dask_kmeans(client, int(k), self.seed)
        kmeans.fit(self.z)
        t4 = time.perf_counter()
        timings.update({"fit": t4 - t1, "reduce_fit": t2 - t1, "k_sweep": t3 - t2, "cluster_fit": t4 - t3})
        model.pca = pca.get_combined_model()
        model.clusterer = kmeans.get_combined_model()
        self.kmeans = kmeans
        self.model = model

    def _gather(self, x, rows: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (all: None) of a spread dask array, gathered here as one NumPy array. Each block is
        made a NumPy array on its worker first, and the rows picked there: only they travel."""
        x = x.map_blocks(self.backend.to_numpy, dtype=x.dtype, meta=np.empty((0,) * x.ndim, dtype=x.dtype))
        return np.asarray((x if rows is None else x[rows]).compute())

    def sweep(self, cluster) -> dict:
        """The k sweep of the single-process fit, on one GPU worker: the sweep's seeded sample of the reduced
        maps (at most ``cluster.sweep_sample``, the rows :func:`sweep_k` would draw) gathered from the parts and
        swept there, with each k's stability refit."""
        rows = _sample_maps(int(self.z.shape[0]), cluster.sweep_sample, self.seed)
        zs = self._gather(self.z, rows)
        args = (zs, cluster.k_sweep, cluster.sweep_sample, cluster.silhouette_sample, self.seed)
        fut = self.client.submit(
            _sweep_on_worker, self.backend, *args, cluster.stability_seeds > 0, workers=self.workers[:1], pure=False
        )
        return fut.result()

    def stability(self, n_seeds: int) -> dict | None:
        """The single-process fit's stability figure: the fit's labels of the whole spread sample against
        cuml.dask KMeans refits of it with the next ``n_seeds`` seeds (adjusted Rand index)."""
        if not n_seeds:
            return None
        from sklearn.metrics import adjusted_rand_score

        k = int(self.model.clusterer.n_clusters)
        mine = self._gather(self.kmeans.predict(self.z))
        seeds = [self.seed + i for i in range(1, n_seeds + 1)]
        ari = []
        for s in seeds:
            refit = self.backend.dask_kmeans(self.client, k, s)
            refit.fit(self.z)
            ari.append(round(float(adjusted_rand_score(mine, self._gather(refit.predict(self.z)))), 4))
        return {"seeds": seeds, "ari": ari, "min_ari": min(ari), "n_fit": int(mine.shape[0])}

    def assign_all(self, e: int, rows: int) -> dict[int, int]:
        """Every store chunk transformed, assigned and written by one of the GPU workers (the
        scheduler balances them)."""
        from distributed import as_completed

        client, workers = self.client, self.workers
        model = client.scatter(self.model, workers=workers, broadcast=True, hash=False)
        blocks = list(_blocks(e, rows))
        n = len(blocks)
        futures = client.map(_assign_rows, [model] * n, [self.store] * n, *zip(*blocks), workers=workers, pure=False)
        counts: dict[int, int] = {}
        for fut in as_completed(futures):
            _add_counts(counts, fut.result())
        return counts

    def silhouette(self, sample: int) -> float | None:
        """The silhouette score on a seeded sample of the fit set, gathered from the workers' parts."""
        n = sum(m for _, m in self.parts)
        if sample == 0 or n < 3:
            return None
        pos = np.sort(np.random.default_rng(self.seed).choice(n, min(sample, n), replace=False))
        bounds = np.cumsum([0] + [m for _, m in self.parts])
        picks = []
        for (fut, _), lo, hi in zip(self.parts, bounds[:-1], bounds[1:]):
            sel = pos[(pos >= lo) & (pos < hi)] - lo
            if len(sel):
                picks.append(self.client.submit(_take, fut, sel, pure=False))
        xp = self.backend.xp
        x = xp.concatenate([xp.asarray(p) for p in self.client.gather(picks)])
        z = self.model.pca.transform(x)
        labels = self.model.assign(z)
        return self.backend.silhouette(z, labels, sample, self.seed)

    def release(self) -> None:
        if self.parts:
            self.client.cancel([f for f, _ in self.parts])
        if self.z is not None:
            self.client.cancel(self.z)
        self.parts = []
        self.z = None


def _sweep_on_worker(
    backend: LearnBackend, zs: np.ndarray, k_range, sample: int, sil_sample: int, seed: int, stability
):
    """On a GPU worker: :func:`sweep_k` of the gathered sample ``zs`` (its fits run there, one after another)."""
    return sweep_k(backend, backend.asarray(zs), k_range, sample, sil_sample, seed, stability)


def _spread_parts(client, backend: LearnBackend, feats, idx: np.ndarray, rows: int, workers: list[str]):
    """Futures of the sample's parts, one per store chunk that holds sampled maps, each read by the
    worker it is pinned to (round-robin over ``workers``, so every one holds a share)."""
    e, nl, nh, _ = feats.shape
    per_ex = nl * nh
    parts = []
    for start, stop in _blocks(e, rows):
        lo, hi = np.searchsorted(idx, [start * per_ex, stop * per_ex])
        if hi == lo:
            continue
        local = idx[lo:hi] - start * per_ex
        if len(local) == (stop - start) * per_ex:
            local = None  # the whole chunk
        w = workers[len(parts) % len(workers)]
        args = (backend, feats.store, feats.path, start, stop, local)
        fut = client.submit(_read_part, *args, workers=[w], allow_other_workers=False, pure=False)
        parts.append((fut, int(hi - lo)))
    return parts


def _placement(client, parts) -> dict:
    """Where the parts are: counted from the scheduler's who_has and each worker's GPU UUID."""
    held = client.who_has([f for f, _ in parts])
    addrs = {a for where in held.values() for a in where}
    ids = gpu_ids(client)
    return {
        "parts": len(parts),
        "rows_per_worker": {a: sum(m for f, m in parts if a in held.get(f.key, ())) for a in sorted(addrs)},
        "workers_with_parts": len(addrs),
        "gpus_with_parts": len({ids[a] for a in addrs if ids.get(a)}),
    }
