"""Estimator factories and array handling for the CPU (scikit-learn) and GPU (cuML) backends.

Which backend a job gets is decided once, in :func:`rapids_attn.devices.resolve_devices`; this
module only builds estimators and moves arrays for the backend it is given. Every estimator the
learn stage uses is built here, with the arguments written once, so that the contract tests
(``tests/contract``) can build each of them against the real cuML wheels and fail where cuML's
signature has moved (cuML's PCA, for one, takes no ``random_state``: its solvers are deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rapids_attn.errors import BackendUnavailableError

#: KMeans restarts; the best of them (lowest inertia) is kept, on both backends. With 4 the quickstart's
#: clusters moved with the seed (ARI 0.51 between seeds); 10 keeps them at ARI >= 0.96 for 60% more
#: time per fit (docs/benchmarks.md, "Cluster stability")
KMEANS_N_INIT = 10


def gpu_read(array, sl) -> Any:
    """A basic selection ``sl`` of the zarr array ``array`` in GPU memory (a CuPy array): zarr's GPU buffer
    prototype is handed to this one read. ``zarr.config.enable_gpu()`` would switch the whole process's zarr
    configuration while it holds, so a thread beside it (a shard's write, another stage's CPU read, a worker's
    other task) would get GPU buffers too; the configuration is left as it was."""
    from zarr.core.buffer.gpu import buffer_prototype

    return array.get_basic_selection(sl, prototype=buffer_prototype)


def _xp_for(name: str):
    if name == "cuml":
        import cupy

        return cupy
    return np


@dataclass
class LearnBackend:
    """Where the fit runs. ``name`` is "sklearn" or "cuml"; ``xp`` is numpy or cupy.

    Picklable (it travels to the workers of a multi-GPU fit): the array module is looked up again
    where it is unpickled."""

    name: str
    reason: str
    xp: Any = field(default=np, repr=False)

    def __reduce__(self):
        return _restore_backend, (self.name, self.reason)

    @property
    def gpu(self) -> bool:
        return self.name == "cuml"

    # -- arrays ---------------------------------------------------------------------------------
    def read(self, array, sl) -> Any:
        """Read a block of a zarr array as float32 on the backend's device.

        On the GPU the block arrives as a CuPy array (:func:`gpu_read`: zarr's GPU buffers for this read only).
        zarr decodes the chunks (zstd) on the host and copies the bytes to the device: no zarr release decodes
        zstd on the GPU.
        """
        if not self.gpu:
            return np.asarray(array[sl], dtype=np.float32)
        return self.xp.asarray(gpu_read(array, sl), dtype=self.xp.float32)

    def asarray(self, x) -> Any:
        return self.xp.asarray(x, dtype=self.xp.float32)

    def to_numpy(self, x) -> np.ndarray:
        if self.gpu and not isinstance(x, np.ndarray):
            return self.xp.asnumpy(x)
        return np.asarray(x)

    # -- estimators (one process: the job's, or one worker's) ------------------------------------
    def pca(self, n_components: int, seed: int):
        if self.gpu:
            from cuml.decomposition import PCA

            return PCA(n_components=n_components)  # deterministic (full SVD / eigendecomposition): no seed
        from sklearn.decomposition import PCA

        return PCA(n_components=n_components, random_state=seed)

    def kmeans(self, n_clusters: int, seed: int):
        if self.gpu:
            from cuml.cluster import KMeans
        else:
            from sklearn.cluster import KMeans
        return KMeans(**kmeans_args(n_clusters, seed))

    def dbscan(self, eps: float, min_samples: int):
        if self.gpu:
            from cuml.cluster import DBSCAN
        else:
            from sklearn.cluster import DBSCAN
        return DBSCAN(eps=eps, min_samples=min_samples)

    def hdbscan(self, min_cluster_size: int, min_samples: int):
        if self.gpu:
            from cuml.cluster import HDBSCAN

            return HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples, prediction_data=True)
        from sklearn.cluster import HDBSCAN

        # copy=True: the future default, named so scikit-learn 1.8+ does not print a FutureWarning into the run
        return HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples, copy=True)

    def umap(self, n_components: int, n_neighbors: int, min_dist: float, metric: str, seed: int):
        if self.gpu:
            from cuml.manifold import UMAP
        else:
            try:
                from umap import UMAP
            except ImportError:
                raise BackendUnavailableError(
                    "reduce.umap.enabled: umap-learn is not installed; pip install umap-learn"
                ) from None
        return UMAP(
            n_components=n_components, n_neighbors=n_neighbors, min_dist=min_dist, metric=metric, random_state=seed
        )

    def nearest_neighbors(self):
        if self.gpu:
            from cuml.neighbors import NearestNeighbors
        else:
            from sklearn.neighbors import NearestNeighbors
        return NearestNeighbors(n_neighbors=1)

    # -- estimators spread over the GPU workers of a Dask cluster (cuml.dask) ---------------------
    def dask_pca(self, client, n_components: int):
        """cuml.dask's PCA: its keyword arguments reach cuML's PCA on every worker."""
        self._need_gpu("a multi-GPU PCA")
        from cuml.dask.decomposition import PCA

        return PCA(client=client, n_components=n_components)

    def dask_kmeans(self, client, n_clusters: int, seed: int):
        """cuml.dask's KMeans: its keyword arguments reach cuML's KMeans on every worker."""
        self._need_gpu("a multi-GPU KMeans")
        from cuml.dask.cluster import KMeans

        return KMeans(client=client, **kmeans_args(n_clusters, seed))

    def _need_gpu(self, what: str) -> None:
        if not self.gpu:
            raise BackendUnavailableError(f"runtime.learn_backend: {what} needs cuML; set learn_backend to gpu")

    # -- scores ----------------------------------------------------------------------------------
    def silhouette(self, x, labels, sample: int, seed: int) -> float | None:
        """Silhouette score on a seeded sample of the non-noise points (None when undefined)."""
        from sklearn.metrics import silhouette_score

        x = self.to_numpy(x)
        labels = self.to_numpy(labels)
        keep = labels >= 0
        x, labels = x[keep], labels[keep]
        if sample == 0 or len(np.unique(labels)) < 2 or len(labels) < 3:
            return None
        rng = np.random.default_rng(seed)
        if len(labels) > sample:
            idx = rng.choice(len(labels), sample, replace=False)
            x, labels = x[idx], labels[idx]
            if len(np.unique(labels)) < 2:
                return None
        return float(silhouette_score(x, labels))


def kmeans_args(n_clusters: int, seed: int) -> dict:
    """KMeans's arguments on every backend (scikit-learn, cuML, cuml.dask). ``n_clusters`` must be
    an int: ``auto`` is resolved by the k sweep before any KMeans is built."""
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)):
        raise TypeError(f"KMeans needs an integer n_clusters, got {n_clusters!r}")
    return {"n_clusters": int(n_clusters), "random_state": seed, "n_init": KMEANS_N_INIT}


def _restore_backend(name: str, reason: str) -> LearnBackend:
    return LearnBackend(name, reason, xp=_xp_for(name))
