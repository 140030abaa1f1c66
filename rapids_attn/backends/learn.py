"""Estimator factories and array handling for the CPU (scikit-learn) and GPU (cuML) backends.

Which backend a job gets is decided once, in :func:`rapids_attn.devices.resolve_devices`; this
module only builds estimators and moves arrays for the backend it is given. Every estimator the
learn stage uses is built here, with the arguments written once, so that the contract tests
(``tests/contract``) can build each of them against the real cuML wheels and fail where cuML's
signature has moved (cuML's PCA, for one, takes no ``random_state``: its solvers are deterministic).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rapids_attn.errors import BackendUnavailableError

#: KMeans restarts; the best of them (lowest inertia) is kept, on both backends. With 4 the quickstart's
#: clusters moved with the seed (ARI 0.51 between seeds); 10 keeps them at ARI >= 0.96 for 60% more
#: time per fit (docs/benchmarks.md, the cluster stability row)
KMEANS_N_INIT = 10


def gpu_read(array, sl) -> Any:
    """A basic selection ``sl`` of the zarr array ``array`` in GPU memory (a CuPy array): zarr's GPU buffer
    prototype is handed to this one read. ``zarr.config.enable_gpu()`` would switch the whole process's zarr
    configuration while it holds, so a thread beside it (a shard's write, another stage's CPU read, a worker's
    other task) would get GPU buffers too; the configuration is left as it was."""
    from zarr.core.buffer.gpu import buffer_prototype

    return array.get_basic_selection(sl, prototype=buffer_prototype)


class EstimatorLibrary:
    """A learn backend's library: its array module and the estimators it builds, with scikit-learn's API
    (``fit`` / ``transform`` / ``predict`` / ``fit_predict``), which the learn stage calls whatever the library.

    Adding a learn backend is one subclass registered in :data:`LIBRARIES` under the name
    ``LearnBackend.name`` takes (:func:`rapids_attn.devices.resolve_learn_backend` decides which one a job
    gets). A subclass names where its estimator classes come from (:attr:`classes`); their arguments are
    written once, here, for every library, and a subclass overrides a builder only where its library's
    arguments differ. The library holds no state, and a :class:`LearnBackend` is rebuilt from its name where
    it is unpickled. ``dask_pca`` and ``dask_kmeans`` are the multi-GPU fit's (cuml.dask); a library without
    them refuses a spread fit."""

    #: whether arrays live on a GPU (the backend's ``gpu``)
    gpu: ClassVar[bool] = False
    #: each estimator's class, ``"module:Class"``, imported when first built
    classes: ClassVar[dict[str, str]] = {}

    @classmethod
    def estimator_class(cls, what: str):
        module, name = cls.classes[what].split(":")
        return getattr(importlib.import_module(module), name)

    @staticmethod
    def array_module():
        return np

    @staticmethod
    def read(array, sl, xp):
        """A block of a zarr array as float32 on the library's device (``xp``: the backend's array module)."""
        return np.asarray(array[sl], dtype=np.float32)

    @staticmethod
    def to_numpy(x, xp) -> np.ndarray:
        return np.asarray(x)

    @classmethod
    def pca(cls, n_components: int, seed: int):
        return cls.estimator_class("pca")(n_components=n_components, random_state=seed)

    @classmethod
    def kmeans(cls, n_clusters: int, seed: int):
        return cls.estimator_class("kmeans")(**kmeans_args(n_clusters, seed))

    @classmethod
    def dbscan(cls, eps: float, min_samples: int):
        return cls.estimator_class("dbscan")(eps=eps, min_samples=min_samples)

    @classmethod
    def hdbscan(cls, min_cluster_size: int, min_samples: int):
        return cls.estimator_class("hdbscan")(min_cluster_size=min_cluster_size, min_samples=min_samples)

    @classmethod
    def umap(cls, n_components: int, n_neighbors: int, min_dist: float, metric: str, seed: int):
        # the job's seed (runtime.seed) is always set, and a set random_state is a speed trade-off on both libraries:
        # umap-learn then optimises on one thread, cuML 26.10 with its slower, more memory-hungry reproducible
        # kernel. cuML still builds the KNN graph of more than 50,000 rows (reduce.fit_sample is 200,000 by
        # default) with NN Descent, which its documentation says is not reproducible (docs/deployment.md)
        return cls.estimator_class("umap")(
            n_components=n_components, n_neighbors=n_neighbors, min_dist=min_dist, metric=metric, random_state=seed
        )

    @classmethod
    def nearest_neighbors(cls):
        return cls.estimator_class("nearest_neighbors")(n_neighbors=1)

    @staticmethod
    def dask_pca(client, n_components: int):
        raise BackendUnavailableError("runtime.learn_backend: a multi-GPU PCA needs cuML; set learn_backend to gpu")

    @staticmethod
    def dask_kmeans(client, n_clusters: int, seed: int):
        raise BackendUnavailableError("runtime.learn_backend: a multi-GPU KMeans needs cuML; set learn_backend to gpu")


class ScikitLearn(EstimatorLibrary):
    """scikit-learn (and umap-learn) on NumPy arrays: the CPU backend."""

    classes: ClassVar[dict[str, str]] = {
        "pca": "sklearn.decomposition:PCA",
        "kmeans": "sklearn.cluster:KMeans",
        "dbscan": "sklearn.cluster:DBSCAN",
        "hdbscan": "sklearn.cluster:HDBSCAN",
        "umap": "umap:UMAP",
        "nearest_neighbors": "sklearn.neighbors:NearestNeighbors",
    }

    @classmethod
    def hdbscan(cls, min_cluster_size: int, min_samples: int):
        # copy=True: the future default, named so scikit-learn 1.8+ does not print a FutureWarning into the run
        return cls.estimator_class("hdbscan")(min_cluster_size=min_cluster_size, min_samples=min_samples, copy=True)

    @classmethod
    def umap(cls, n_components: int, n_neighbors: int, min_dist: float, metric: str, seed: int):
        try:
            return super().umap(n_components, n_neighbors, min_dist, metric, seed)
        except ImportError:
            raise BackendUnavailableError(
                "reduce.umap.enabled: umap-learn is not installed; pip install umap-learn"
            ) from None


class CuML(EstimatorLibrary):
    """cuML on CuPy arrays: the GPU backend, and cuml.dask for the fit spread over GPU workers."""

    gpu: ClassVar[bool] = True
    classes: ClassVar[dict[str, str]] = {
        "pca": "cuml.decomposition:PCA",
        "kmeans": "cuml.cluster:KMeans",
        "dbscan": "cuml.cluster:DBSCAN",
        "hdbscan": "cuml.cluster:HDBSCAN",
        "umap": "cuml.manifold:UMAP",
        "nearest_neighbors": "cuml.neighbors:NearestNeighbors",
    }

    @staticmethod
    def array_module():
        import cupy

        return cupy

    @staticmethod
    def read(array, sl, xp):
        """On the GPU the block arrives as a CuPy array (:func:`gpu_read`: zarr's GPU buffers for this read only).
        zarr decodes the chunks (zstd) on the host and copies the bytes to the device: no zarr release decodes
        zstd on the GPU."""
        return xp.asarray(gpu_read(array, sl), dtype=xp.float32)

    @staticmethod
    def to_numpy(x, xp) -> np.ndarray:
        return x if isinstance(x, np.ndarray) else xp.asnumpy(x)

    @classmethod
    def pca(cls, n_components: int, seed: int):
        return cls.estimator_class("pca")(n_components=n_components)  # deterministic (full SVD): no seed

    @staticmethod
    def dask_pca(client, n_components: int):
        """cuml.dask's PCA: its keyword arguments reach cuML's PCA on every worker."""
        from cuml.dask.decomposition import PCA

        return PCA(client=client, n_components=n_components)

    @staticmethod
    def dask_kmeans(client, n_clusters: int, seed: int):
        """cuml.dask's KMeans: its keyword arguments reach cuML's KMeans on every worker."""
        from cuml.dask.cluster import KMeans

        return KMeans(client=client, **kmeans_args(n_clusters, seed))


#: every learn backend, by the name ``LearnBackend.name`` takes: the one place a new backend is registered
LIBRARIES: dict[str, type[EstimatorLibrary]] = {"sklearn": ScikitLearn, "cuml": CuML}


def _xp_for(name: str):
    return LIBRARIES[name].array_module()


@dataclass
class LearnBackend:
    """Where the fit runs: ``name`` is a key of :data:`LIBRARIES` ("sklearn" or "cuml"), ``xp`` its array
    module (numpy or cupy). Its estimators and reads are the library's (:class:`EstimatorLibrary`).

    Picklable (it travels to the workers of a multi-GPU fit): the array module is looked up again
    where it is unpickled."""

    name: str
    reason: str
    xp: Any = field(default=np, repr=False)

    def __reduce__(self):
        return _restore_backend, (self.name, self.reason)

    @property
    def library(self) -> type[EstimatorLibrary]:
        return LIBRARIES[self.name]

    @property
    def gpu(self) -> bool:
        return self.library.gpu

    # -- arrays ---------------------------------------------------------------------------------
    def read(self, array, sl) -> Any:
        """Read a block of a zarr array as float32 on the backend's device (:meth:`EstimatorLibrary.read`)."""
        return self.library.read(array, sl, self.xp)

    def asarray(self, x) -> Any:
        return self.xp.asarray(x, dtype=self.xp.float32)

    def to_numpy(self, x) -> np.ndarray:
        return self.library.to_numpy(x, self.xp)

    # -- estimators (one process: the job's, or one worker's) ------------------------------------
    def pca(self, n_components: int, seed: int):
        return self.library.pca(n_components, seed)

    def kmeans(self, n_clusters: int, seed: int):
        return self.library.kmeans(n_clusters, seed)

    def dbscan(self, eps: float, min_samples: int):
        return self.library.dbscan(eps, min_samples)

    def hdbscan(self, min_cluster_size: int, min_samples: int):
        return self.library.hdbscan(min_cluster_size, min_samples)

    def umap(self, n_components: int, n_neighbors: int, min_dist: float, metric: str, seed: int):
        return self.library.umap(n_components, n_neighbors, min_dist, metric, seed)

    def nearest_neighbors(self):
        return self.library.nearest_neighbors()

    # -- estimators spread over the GPU workers of a Dask cluster (cuml.dask) ---------------------
    def dask_pca(self, client, n_components: int):
        return self.library.dask_pca(client, n_components)

    def dask_kmeans(self, client, n_clusters: int, seed: int):
        return self.library.dask_kmeans(client, n_clusters, seed)

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
