"""Estimator factories and array handling for the CPU (scikit-learn) and GPU (cuML) backends.

Which backend a job gets is decided once, in :func:`rapids_attn.devices.resolve_devices`; this
module only builds estimators and moves arrays for the backend it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rapids_attn.errors import BackendUnavailableError


@dataclass
class LearnBackend:
    """Where the fit runs. ``name`` is "sklearn" or "cuml"; ``xp`` is numpy or cupy."""

    name: str
    reason: str
    xp: Any = field(default=np, repr=False)

    @property
    def gpu(self) -> bool:
        return self.name == "cuml"

    # -- arrays ---------------------------------------------------------------------------------
    def read(self, array, sl) -> Any:
        """Read a block of a zarr array as float32 on the backend's device.

        On the GPU the block is read in zarr's GPU mode and arrives as a CuPy array (no NumPy copy
        in between). zarr 3.1 still decodes chunks on the host and copies them over; the store uses
        plain zstd so that zarr's nvCOMP zstd codec can decode on the device where it is available.
        """
        if not self.gpu:
            return np.asarray(array[sl], dtype=np.float32)
        import zarr

        with zarr.config.enable_gpu():
            gpu_array = zarr.open_array(array.store, path=array.path, mode="r")
            return self.xp.asarray(gpu_array[sl], dtype=self.xp.float32)

    def asarray(self, x) -> Any:
        return self.xp.asarray(x, dtype=self.xp.float32)

    def to_numpy(self, x) -> np.ndarray:
        if self.gpu and not isinstance(x, np.ndarray):
            return self.xp.asnumpy(x)
        return np.asarray(x)

    # -- estimators ------------------------------------------------------------------------------
    def pca(self, n_components: int, seed: int):
        if self.gpu:
            from cuml.decomposition import PCA
        else:
            from sklearn.decomposition import PCA
        return PCA(n_components=n_components, random_state=seed)

    def kmeans(self, n_clusters: int, seed: int):
        if self.gpu:
            from cuml.cluster import KMeans
        else:
            from sklearn.cluster import KMeans
        return KMeans(n_clusters=n_clusters, random_state=seed, n_init=4)

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

        return HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples)

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
