"""The fit spread over the GPU workers (cuml.dask). Thin on cuML's documented API: the estimators come from
LearnBackend.dask_pca / dask_kmeans; docs/deployment.md says what has run where.

Each worker reads its share of the sample's store chunks itself, onto its own GPU (the job process reads no
features), the parts stay there (persisted, assigned round-robin), cuml.dask fits PCA and KMeans on them, and
every store chunk is then transformed, assigned and written by a worker. The figures of the single-process fit
are kept: the k sweep runs on one GPU worker over its seeded sample of the reduced maps (gathered from the parts),
and the stability refits are cuml.dask KMeans fits of the whole spread sample with the next seeds.

The job process reads no features, but it is not free of the GPU: it drives cuml.dask, whose client code runs here.
It makes CuPy arrays (the 0-row ``meta`` of the parts below, and cuml.dask's own for ``transform`` and ``predict``),
cuml.dask's ``KMeans.fit`` pulls the first worker's fitted model here (its centroids, and labels of that worker's
rows), and ``get_combined_model`` pulls the PCA's; :class:`MapClusterer` holds both and is scattered from here. So
the job process holds a CUDA context and those arrays (kept in CuPy's memory pool once freed) on its first visible
GPU (GPU 0, whose pool worker 0 holds) until it exits: small next to the 20% of the card the default pool leaves,
but not nothing (read against cuML 26.10's ``cuml.dask``; measured on no GPU yet: docs/deployment.md, "The first
GPU run").
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import zarr

from rapids_attn.backends import LearnBackend
from rapids_attn.learn.estimator import MapClusterer
from rapids_attn.learn.kmeans_fits import sweep_k
from rapids_attn.learn.storeio import add_counts, blocks, sample_maps, write_block
from rapids_attn.store import schema as S

log = logging.getLogger(__name__)


def read_part(backend: LearnBackend, store, path: str, start: int, stop: int, local: np.ndarray | None):
    """On a worker: the features of examples [start, stop) (one row per map), or of the maps
    ``local`` among them, read from the store onto this worker's device."""
    arr = zarr.open_array(store, path=path, mode="r")
    x = backend.read(arr, slice(start, stop))
    x = x.reshape(-1, x.shape[-1])
    return x if local is None else x[backend.xp.asarray(local)]


def take(x, rows: np.ndarray):
    """On a worker: the rows ``rows`` of a part (a few, for the silhouette score)."""
    return x[rows]


def assign_rows(model: MapClusterer, store, start: int, stop: int) -> dict[int, int]:
    """On a worker: read examples [start, stop) of ``features``, transform, assign, write them."""
    feats = zarr.open_array(store, path=S.FEATURES, mode="r")
    outputs = tuple(zarr.open_array(store, path=spec, mode="r+") for spec in (S.REDUCED, S.COORDS, S.CLUSTER))
    x = model.backend_.read(feats, slice(start, stop)).reshape(-1, feats.shape[-1])
    return write_block(model, outputs, x, start, stop)


class SpreadFit:
    """A fit whose data lives on the workers (one per GPU): the sample's parts (futures), the fitted
    single-GPU models (cuml.dask's combined models), and where the parts were."""

    def __init__(self, client, backend: LearnBackend, store, workers: list[str], seed: int, ids: dict | None = None):
        self.client, self.backend, self.store = client, backend, store
        self.workers = workers
        self.ids = ids or {}  # each worker's GPU UUID (devices.gpu_ids)
        self.seed = seed
        self.parts = []  # [(future, n_rows)]
        self.z = None  # the reduced sample (a dask array persisted on the workers)
        self.kmeans = None  # cuml.dask's fitted KMeans
        self.model: MapClusterer | None = None
        self.placement: dict = {}

    def fit(self, feats, idx: np.ndarray, reduce, cluster, timings: dict) -> None:
        """PCA and KMeans fitted with cuml.dask on the sample, read by the workers onto their GPUs."""
        import dask.array as da
        from distributed import wait

        client, backend = self.client, self.backend
        d = feats.shape[-1]
        t0 = time.perf_counter()
        self.parts = spread_parts(client, backend, feats, idx, feats.chunks[0], self.workers)
        wait([f for f, _ in self.parts])
        timings["read_sample"] = time.perf_counter() - t0
        self.placement = placement(client, self.parts, self.ids)
        meta = backend.xp.empty((0, d), dtype=np.float32)
        x = da.concatenate([da.from_delayed(f, shape=(m, d), dtype=np.float32, meta=meta) for f, m in self.parts])

        t1 = time.perf_counter()
        log.info("PCA to %d components", min(reduce.pca_components, d))
        pca = backend.dask_pca(client, min(reduce.pca_components, d))
        pca.fit(x)
        self.z = client.persist(pca.transform(x))  # the reduced sample, on the workers' GPUs
        wait(self.z)
        if any(math.isnan(c) for c in self.z.chunks[0]):  # rows per part, for the sweep's row selection
            self.z.compute_chunk_sizes()
        t2 = time.perf_counter()
        sweep = self.sweep(cluster) if cluster.k_sweep is not None else None
        t3 = time.perf_counter()
        k = cluster.n_clusters if cluster.n_clusters != "auto" else sweep["best_silhouette_k"] or cluster.k_sweep[0]
        if sweep is not None:
            sweep["chosen"] = int(k)
        log.info("KMeans with k %d%s", k, " (the k sweep's pick)" if cluster.n_clusters == "auto" else "")
        kmeans = backend.dask_kmeans(client, int(k), self.seed)
        kmeans.fit(self.z)
        t4 = time.perf_counter()
        timings.update({"fit": t4 - t1, "reduce_fit": t2 - t1, "k_sweep": t3 - t2, "cluster_fit": t4 - t3})
        self.kmeans = kmeans
        self.model = MapClusterer.from_fitted(  # the single-GPU chain the workers apply
            reduce, cluster, self.seed, backend, pca.get_combined_model(), kmeans.get_combined_model(), sweep
        )

    def _gather(self, x, rows: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (all: None) of a spread dask array, gathered here as one NumPy array. Each block is
        made a NumPy array on its worker first, and the rows picked there: only they travel."""
        x = x.map_blocks(self.backend.to_numpy, dtype=x.dtype, meta=np.empty((0,) * x.ndim, dtype=x.dtype))
        return np.asarray((x if rows is None else x[rows]).compute())

    def sweep(self, cluster) -> dict:
        """The k sweep of the single-process fit, on one GPU worker: the sweep's seeded sample of the reduced
        maps (at most ``cluster.sweep_sample``, the rows :func:`sweep_k` would draw) gathered from the parts and
        swept there, with each k's stability refit."""
        rows = sample_maps(int(self.z.shape[0]), cluster.sweep_sample, self.seed)
        log.info("k sweep: KMeans for k %d to %d on %s maps, on one GPU worker", *cluster.k_sweep, f"{len(rows):,}")
        zs = self._gather(self.z, rows)
        args = (zs, cluster.k_sweep, cluster.sweep_sample, cluster.silhouette_sample, self.seed)
        fut = self.client.submit(
            sweep_on_worker, self.backend, *args, cluster.stability_seeds > 0, workers=self.workers[:1], pure=False
        )
        return fut.result()

    def stability(self, n_seeds: int) -> dict | None:
        """The single-process fit's stability figure: the fit's labels of the whole spread sample against
        cuml.dask KMeans refits of it with the next ``n_seeds`` seeds (adjusted Rand index)."""
        if not n_seeds:
            return None
        from sklearn.metrics import adjusted_rand_score

        k = self.model.n_clusters_
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
        chunks = list(blocks(e, rows))
        n = len(chunks)
        futures = client.map(assign_rows, [model] * n, [self.store] * n, *zip(*chunks), workers=workers, pure=False)
        counts: dict[int, int] = {}
        for fut in as_completed(futures):
            add_counts(counts, fut.result())
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
                picks.append(self.client.submit(take, fut, sel, pure=False))
        # scored on the first GPU worker (its pool), not here: the job process holds only what the module says
        args = (self.model, picks, sample, self.seed)
        return self.client.submit(silhouette_on_worker, *args, workers=self.workers[:1], pure=False).result()

    def release(self) -> None:
        if self.parts:
            self.client.cancel([f for f, _ in self.parts])
        if self.z is not None:
            self.client.cancel(self.z)
        self.parts = []
        self.z = None


def silhouette_on_worker(model: MapClusterer, picks: list, sample: int, seed: int) -> float | None:
    """On a GPU worker: the silhouette score of the sampled rows ``picks`` (parts of the fit set) under ``model``."""
    xp = model.backend_.xp
    x = xp.concatenate([xp.asarray(p) for p in picks])
    z = model.transform(x)
    return model.backend_.silhouette(z, model.predict_embedding(z), sample, seed)


def sweep_on_worker(backend: LearnBackend, zs: np.ndarray, k_range, sample: int, sil_sample: int, seed: int, stability):
    """On a GPU worker: :func:`sweep_k` of the gathered sample ``zs`` (its fits run there, one after another)."""
    return sweep_k(backend, backend.asarray(zs), k_range, sample, sil_sample, seed, stability)


def spread_parts(client, backend: LearnBackend, feats, idx: np.ndarray, rows: int, workers: list[str]):
    """Futures of the sample's parts, one per store chunk that holds sampled maps, each read by the
    worker it is pinned to (round-robin over ``workers``, so every one holds a share)."""
    e, nl, nh, _ = feats.shape
    per_ex = nl * nh
    parts = []
    for start, stop in blocks(e, rows):
        lo, hi = np.searchsorted(idx, [start * per_ex, stop * per_ex])
        if hi == lo:
            continue
        local = idx[lo:hi] - start * per_ex
        if len(local) == (stop - start) * per_ex:
            local = None  # the whole chunk
        w = workers[len(parts) % len(workers)]
        args = (backend, feats.store, feats.path, start, stop, local)
        fut = client.submit(read_part, *args, workers=[w], allow_other_workers=False, pure=False)
        parts.append((fut, int(hi - lo)))
    return parts


def placement(client, parts, ids: dict[str, str | None]) -> dict:
    """Where the parts are: counted from the scheduler's who_has and each worker's GPU UUID (``ids``,
    :func:`rapids_attn.devices.gpu_ids`)."""
    held = client.who_has([f for f, _ in parts])
    addrs = {a for where in held.values() for a in where}
    return {
        "parts": len(parts),
        "rows_per_worker": {a: sum(m for f, m in parts if a in held.get(f.key, ())) for a in sorted(addrs)},
        "workers_with_parts": len(addrs),
        "gpus_with_parts": len({ids[a] for a in addrs if ids.get(a)}),
    }
