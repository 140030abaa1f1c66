"""The reduce-then-cluster chain as a scikit-learn estimator: :class:`MapClusterer`.

It is the learn stage's fit (:func:`rapids_attn.learn.fit.fit_store` builds one with
:meth:`MapClusterer.from_config` from the job's ``reduce`` and ``cluster`` sections, fits it on a sample of a store's
maps and applies it chunk by chunk), the public API's (:func:`rapids_attn.api.cluster_features`) and the multi-GPU
fit's (:mod:`rapids_attn.learn.spread` builds one from cuml.dask's combined models with
:meth:`MapClusterer.from_fitted`).

As scikit-learn asks: flat keyword parameters stored unchanged by ``__init__`` (so ``get_params``, ``set_params``,
``sklearn.base.clone``, ``GridSearchCV`` and ``Pipeline`` work), checked by ``fit`` (with the job's own rules: the
``reduce`` and ``cluster`` sections'), ``fit`` returning the estimator, and what it fitted ending in an underscore.
On a GPU backend (cuML) the arrays that come out are CuPy arrays.

Each step of a fit is logged at INFO on this module's logger (``rapids_attn.learn.estimator``); the learn stage
shows them on stderr (:func:`rapids_attn.learn.progress.stage_lines`), a library user sees them through
``logging`` when asked for.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from rapids_attn.backends import LearnBackend
from rapids_attn.errors import BackendUnavailableError, UserError
from rapids_attn.learn.kmeans_fits import seed_agreement, sweep_k
from rapids_attn.settings import show

log = logging.getLogger(__name__)

#: the largest seed: scikit-learn's random_state is below 2**32; the stability refits use the ``stability_seeds``
#: seeds after ``random_state``
MAX_SEED = 2**32 - 1
BACKENDS = ("auto", "cpu", "gpu")

#: each parameter's place in the job's sections (``reduce.umap.n_neighbors``); the others are ``cluster``'s
_REDUCE_PARAMS = {"pca_components": "pca_components"}
_UMAP_PARAMS = {
    "umap": "enabled",
    "umap_components": "n_components",
    "n_neighbors": "n_neighbors",
    "min_dist": "min_dist",
    "metric": "metric",
}
_CLUSTER_PARAMS = (
    "method",
    "n_clusters",
    "k_sweep",
    "sweep_sample",
    "silhouette_sample",
    "eps",
    "min_samples",
    "min_cluster_size",
    "stability_seeds",
)


class InvalidParameterError(UserError, ValueError, TypeError):
    """A parameter of :class:`MapClusterer` that cannot be used: one line naming it and what it must be (a
    ValueError and a TypeError, as scikit-learn's own; a user error, exit code 2, through the CLI)."""


class MapClusterer(ClusterMixin, TransformerMixin, BaseEstimator):
    """PCA to ``pca_components`` (then UMAP, if ``umap``), then KMeans, DBSCAN or HDBSCAN (``method``), fitted on
    [n, d] features, one row per attention map.

    The defaults are the job's (``reduce`` and ``cluster`` sections, docs/configuration.md), checked by ``fit`` with
    its rules; :meth:`from_config` builds one from those sections.

    Parameters
    ----------
    pca_components:
        PCA's components (at most the features' width: clipped to it).
    umap, umap_components, n_neighbors, min_dist, metric:
        UMAP after PCA (``reduce.umap``: ``enabled``, ``n_components``, ...); the maps are then clustered in its
        ``umap_components`` dimensions.
    method:
        ``kmeans``, ``dbscan`` or ``hdbscan``.
    n_clusters, k_sweep, sweep_sample, stability_seeds:
        KMeans: the clusters (an int, or ``"auto"``: the k sweep's pick); the k sweep's ``(first, last)`` k
        (None skips it), fitted on a seeded sample of ``sweep_sample`` maps; :meth:`seed_stability`'s refits
        with the next ``stability_seeds`` seeds (the sweep refits each k with the next seed unless 0).
    silhouette_sample:
        The maps the k sweep scores each k's silhouette on.
    eps, min_samples, min_cluster_size:
        DBSCAN's ``eps`` and ``min_samples``; HDBSCAN's ``min_cluster_size`` and ``min_samples``.
    random_state:
        The seed (a whole number) of PCA's randomised solver, UMAP and KMeans; the stability refits use the next.
    backend:
        Where the fit runs: ``cpu`` (scikit-learn and umap-learn, NumPy arrays), ``gpu`` (cuML, CuPy arrays) or
        ``auto`` (cuML when it is installed and a GPU is visible); or a resolved
        :class:`rapids_attn.backends.LearnBackend` (the learn stage's). KMeans's extra fits (the k sweep's and the
        stability refits) run there too (:mod:`rapids_attn.learn.kmeans_fits`).

    Fitted attributes
    -----------------
    ``backend_`` (the LearnBackend), ``n_features_in_``, ``pca_``, ``umap_`` (None without UMAP), ``clusterer_``,
    ``embedding_`` (the fitted maps in the space they are clustered in), ``labels_`` (int32, on the backend's
    device), ``n_clusters_`` (KMeans: the k it fitted, the sweep's pick under ``n_clusters="auto"``; None
    otherwise), ``k_sweep_`` (the sweep's figures, or None) and ``seconds_`` (what each part of the fit took).
    """

    def __init__(
        self,
        *,
        pca_components=32,
        umap=False,
        umap_components=2,
        n_neighbors=15,
        min_dist=0.1,
        metric="euclidean",
        method="kmeans",
        n_clusters=8,
        k_sweep=(2, 16),
        sweep_sample=5000,
        silhouette_sample=5000,
        eps=0.5,
        min_samples=5,
        min_cluster_size=20,
        stability_seeds=2,
        random_state=0,
        backend="cpu",
    ):
        self.pca_components = pca_components
        self.umap = umap
        self.umap_components = umap_components
        self.n_neighbors = n_neighbors
        self.min_dist = min_dist
        self.metric = metric
        self.method = method
        self.n_clusters = n_clusters
        self.k_sweep = k_sweep
        self.sweep_sample = sweep_sample
        self.silhouette_sample = silhouette_sample
        self.eps = eps
        self.min_samples = min_samples
        self.min_cluster_size = min_cluster_size
        self.stability_seeds = stability_seeds
        self.random_state = random_state
        self.backend = backend

    @classmethod
    def from_config(cls, reduce, cluster, random_state: int = 0, backend="cpu") -> MapClusterer:
        """The estimator of the job's ``reduce`` and ``cluster`` sections (:mod:`rapids_attn.learn.config`'s
        ``ReduceConfig`` and ``ClusterConfig``; ``reduce.fit_sample`` and ``sample_by`` are the learn stage's, not
        the fit's) and its seed; ``backend`` as the parameter (None: ``cpu``)."""
        u = reduce.umap
        return cls(
            pca_components=reduce.pca_components,
            **{name: getattr(u, field) for name, field in _UMAP_PARAMS.items()},
            **{name: getattr(cluster, name) for name in _CLUSTER_PARAMS if name != "k_sweep"},
            k_sweep=None if cluster.k_sweep is None else tuple(cluster.k_sweep),
            random_state=random_state,
            backend="cpu" if backend is None else backend,
        )

    # -- the parameters, checked ---------------------------------------------------------------------
    def _settings(self):
        """``(reduce, cluster)``: the parameters as the job's sections, checked with their rules (one
        :class:`InvalidParameterError` naming the parameter), and the seed's range."""
        from pydantic import ValidationError

        from rapids_attn.learn.config import ClusterConfig, ReduceConfig, UmapConfig

        try:
            umap = UmapConfig(**{field: getattr(self, name) for name, field in _UMAP_PARAMS.items()})
        except ValidationError as e:
            raise _parameter_error(e, {field: name for name, field in _UMAP_PARAMS.items()}) from None
        try:  # fit_sample is the learn stage's (the maps it reads), not the fit's: as large as can be here
            reduce = ReduceConfig(pca_components=self.pca_components, umap=umap, fit_sample=sys.maxsize)
        except ValidationError as e:
            raise _parameter_error(e, _REDUCE_PARAMS) from None
        try:
            cluster = ClusterConfig(**{name: getattr(self, name) for name in _CLUSTER_PARAMS})
        except ValidationError as e:
            raise _parameter_error(e, {}) from None
        seed, top = self.random_state, MAX_SEED - cluster.stability_seeds
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= top:
            refits = (
                f" (its {cluster.stability_seeds} stability refits use the seeds after it)" if top < MAX_SEED else ""
            )
            raise InvalidParameterError(f"random_state: must be a whole number from 0 to {top}{refits}; got {seed!r}")
        return reduce, cluster

    def _resolve_backend(self) -> LearnBackend:
        if isinstance(self.backend, LearnBackend):
            return self.backend
        if not isinstance(self.backend, str) or self.backend not in BACKENDS:
            raise InvalidParameterError(
                f"backend: must be one of {', '.join(BACKENDS)} or a LearnBackend; got {self.backend!r}"
            )
        from rapids_attn.devices import resolve_learn_backend

        try:
            return resolve_learn_backend(self.backend)
        except BackendUnavailableError as e:
            raise BackendUnavailableError(str(e).replace("runtime.learn_backend", "backend")) from None

    # -- fitting -----------------------------------------------------------------------------------
    def fit(self, x, y=None) -> MapClusterer:
        """Fit on ``x`` ([n, d] features; ``y`` is ignored, as scikit-learn's clusterers do)."""
        reduce, cluster = self._settings()
        b = self._start(reduce, cluster, self._resolve_backend(), self.random_state)
        x = _features(b, x, min_rows=2)
        self.n_features_in_ = int(x.shape[1])
        n = int(x.shape[0])
        t0 = time.perf_counter()
        self.pca_, self.umap_ = self._reducers(b, reduce, x.shape[1], self._seed)
        log.info("PCA to %d components, fitted on %s maps of %d features", self.pca_.n_components, f"{n:,}", x.shape[1])
        self.pca_.fit(x)
        z = self.pca_.transform(x)
        if self.umap_ is not None:
            log.info("UMAP to %d dimensions (%d neighbours)", reduce.umap.n_components, reduce.umap.n_neighbors)
            z = self.umap_.fit_transform(z)
        t1 = time.perf_counter()
        self.seconds_ = {"reduce_fit": t1 - t0, "k_sweep": 0.0}
        c, k = cluster, None
        if c.method == "kmeans":
            if c.k_sweep is not None:
                log.info(
                    "k sweep: KMeans for k %d to %d on %s maps%s",
                    c.k_sweep[0],
                    c.k_sweep[1],
                    f"{min(n, c.sweep_sample):,}",
                    ", each refitted with the next seed" if c.stability_seeds > 0 else "",
                )
                self.k_sweep_ = sweep_k(
                    b, z, c.k_sweep, c.sweep_sample, c.silhouette_sample, self._seed, c.stability_seeds > 0
                )
                self.seconds_["k_sweep"] = time.perf_counter() - t1
            k = c.n_clusters
            if k == "auto":
                k = self.k_sweep_["best_silhouette_k"] or c.k_sweep[0]
            if self.k_sweep_ is not None:
                self.k_sweep_["chosen"] = int(k)
        self.clusterer_ = self._make_clusterer(b, cluster, k, self._seed)
        log.info("%s", _describe(cluster, k))
        self.n_clusters_ = None if k is None else int(k)
        labels = self.clusterer_.fit_predict(z)
        self.embedding_, self.labels_ = z, b.asarray(labels).astype(b.xp.int32)
        self.seconds_["cluster_fit"] = time.perf_counter() - t1 - self.seconds_["k_sweep"]
        return self

    def fit_transform(self, x, y=None):
        """Fit, and return the fitted maps in the space they are clustered in (``embedding_``: with UMAP, the
        embedding its fit made, as UMAP's own ``fit_transform``)."""
        return self.fit(x).embedding_

    @classmethod
    def from_fitted(cls, reduce, cluster, seed: int, backend: LearnBackend, pca, clusterer, k_sweep=None):
        """A fitted chain from parts fitted elsewhere (the multi-GPU fit: cuml.dask's combined single-GPU PCA and
        KMeans), which :meth:`project` and :meth:`predict_embedding` then apply. KMeans only: the fitted maps
        themselves are not held, so there is no nearest-neighbour assignment."""
        est = cls.from_config(reduce, cluster, seed, backend)
        est._start(reduce, cluster, backend, seed)
        est.pca_, est.umap_, est.clusterer_ = pca, None, clusterer
        est.n_clusters_ = int(clusterer.n_clusters)
        est.k_sweep_ = k_sweep
        return est

    def _start(self, reduce, cluster, backend: LearnBackend, seed: int) -> LearnBackend:
        # the settings of this fit (a set_params after it changes the next fit, not this one)
        self._reduce, self._cluster, self._seed = reduce, cluster, seed
        self.backend_ = backend
        self.k_sweep_ = None
        self.embedding_ = self.labels_ = None
        self.seconds_ = {}
        self._nn = None
        return backend

    def reducers(self, dim: int):
        """``(pca, umap)``, unfitted, as :meth:`fit` builds them for ``dim``-wide features (umap None when off)."""
        reduce, _ = self._settings()
        return self._reducers(self._resolve_backend(), reduce, dim, self.random_state)

    def make_clusterer(self, k: int | None = None):
        """The clusterer, unfitted, as :meth:`fit` builds it (KMeans with ``k``: ``n_clusters``, or the sweep's
        pick)."""
        _, cluster = self._settings()
        return self._make_clusterer(self._resolve_backend(), cluster, k, self.random_state)

    @staticmethod
    def _reducers(b: LearnBackend, reduce, dim: int, seed: int):
        u = reduce.umap
        pca = b.pca(min(reduce.pca_components, dim), seed)
        return pca, (b.umap(u.n_components, u.n_neighbors, u.min_dist, u.metric, seed) if u.enabled else None)

    @staticmethod
    def _make_clusterer(b: LearnBackend, cluster, k: int | None, seed: int):
        c = cluster
        if c.method == "kmeans":
            return b.kmeans(c.n_clusters if k is None else k, seed)
        if c.method == "dbscan":
            return b.dbscan(c.eps, c.min_samples)
        return b.hdbscan(c.min_cluster_size, c.min_samples)

    # -- KMeans's seed stability ---------------------------------------------------------------------
    def seed_stability(self) -> dict | None:
        """KMeans's dependence on its seed: the fit's labels of the fitted maps against refits with the next
        ``stability_seeds`` seeds (adjusted Rand index; None for a deterministic method, or when skipped)."""
        check_is_fitted(self)
        c = self._cluster
        if c.method != "kmeans" or not c.stability_seeds:
            return None
        log.info("seed stability: KMeans refitted with the next %d seed(s)", c.stability_seeds)
        t = time.perf_counter()
        seeds = [self._seed + i for i in range(1, c.stability_seeds + 1)]
        ari = seed_agreement(self.backend_, self.embedding_, self.labels_, self.n_clusters_, seeds)
        self.seconds_["stability"] = time.perf_counter() - t
        return {"seeds": seeds, "ari": ari, "min_ari": min(ari), "n_fit": int(self.embedding_.shape[0])}

    # -- applying the fit ----------------------------------------------------------------------------
    def project(self, x):
        """``(pca, z)``: the maps' PCA coordinates and their coordinates in the clustered space (UMAP's, or the
        PCA's when UMAP is off)."""
        check_is_fitted(self)
        p = self.pca_.transform(_features(self.backend_, x))
        return p, (self.umap_.transform(p) if self.umap_ is not None else p)

    def transform(self, x):
        """The maps in the space they are clustered in."""
        return self.project(x)[1]

    def predict_embedding(self, z):
        """Cluster labels (int32) of maps already in the clustered space (:meth:`transform`'s output). KMeans
        predicts; DBSCAN and HDBSCAN have no predict, so each map takes the label of its nearest fitted map
        (noise stays noise): for the fitted maps themselves that is their own label."""
        check_is_fitted(self)
        xp = self.backend_.xp
        if self._cluster.method == "kmeans":
            return xp.asarray(self.clusterer_.predict(z)).astype(xp.int32)
        if self._nn is None:
            self._nn = self.backend_.nearest_neighbors().fit(self.embedding_)
        _, ind = self._nn.kneighbors(z)
        return self.labels_[xp.asarray(ind)[:, 0]]

    def predict(self, x):
        """Cluster labels (int32) of new maps: :meth:`transform`, then :meth:`predict_embedding`."""
        return self.predict_embedding(self.transform(x))


def _features(b: LearnBackend, x, min_rows: int = 1):
    """[n, d] features as float32 on the backend's device; on the CPU checked by scikit-learn's ``check_array`` (2-D,
    dense, real, finite, ``min_rows`` rows or more: its own one-line errors). A float32 array already there is
    returned as it is (the learn stage's blocks)."""
    if b.gpu:
        x = b.asarray(x)
        if x.ndim != 2 or x.shape[0] < min_rows:
            raise ValueError(f"x: must be [n_maps, n_features] with at least {min_rows} rows; got {tuple(x.shape)}")
        return x
    from sklearn.utils import check_array

    return check_array(x, dtype=np.float32, ensure_min_samples=min_rows)


def _describe(cluster, k) -> str:
    """The clusterer a fit runs, in one line of the learn stage's progress."""
    if cluster.method == "kmeans":
        return f"KMeans with k {k}" + (" (the k sweep's pick)" if cluster.n_clusters == "auto" else "")
    if cluster.method == "dbscan":
        return f"DBSCAN (eps {cluster.eps}, min_samples {cluster.min_samples})"
    return f"HDBSCAN (min_cluster_size {cluster.min_cluster_size}, min_samples {cluster.min_samples})"


def _parameter_error(err, names: dict[str, str]) -> InvalidParameterError:
    """A job section's pydantic ValidationError -> one line naming the first parameter at fault (``names``: the
    section's field -> the parameter, where they differ)."""
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    name = names.get(loc[0], loc[0]) + "".join(f"[{p}]" for p in loc[1:]) if loc else ""
    msg = first.get("msg", str(err)).removeprefix("Value error, ")
    if not name:  # a rule of the whole section: its message names the parameters
        return InvalidParameterError(msg)
    return InvalidParameterError(f"{name}: {msg}; got {show(first.get('input'))}")
