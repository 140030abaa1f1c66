"""The reduce-then-cluster chain, as a scikit-learn-shaped estimator: :class:`MapClusterer`.

It is the learn stage's fit (:func:`rapids_attn.learn.fit.fit_store` fits one on a sample of a store's maps and
applies it chunk by chunk), the public API's (:func:`rapids_attn.api.cluster_features`) and the multi-GPU fit's
(:mod:`rapids_attn.learn.spread` builds one from cuml.dask's combined models with :meth:`MapClusterer.from_fitted`).

As scikit-learn's estimators: the parameters are stored by ``__init__`` as given, ``fit`` returns the estimator,
and what it fitted ends in an underscore. On a GPU backend (cuML) ``x`` is a CuPy array and so is what comes out.
"""

from __future__ import annotations

import time

from rapids_attn.backends import LearnBackend
from rapids_attn.learn.kmeans_fits import seed_agreement, sweep_k


class MapClusterer:
    """PCA to ``reduce.pca_components`` (then UMAP, if ``reduce.umap.enabled``), then KMeans, DBSCAN or HDBSCAN
    (``cluster.method``), fitted on [n, d] features, one row per attention map.

    Parameters
    ----------
    reduce, cluster:
        The job's ``reduce`` and ``cluster`` sections (:class:`rapids_attn.job.ReduceConfig`, ``ClusterConfig``).
    seed:
        The seed of PCA's randomised solver, UMAP and KMeans; KMeans's stability refits use the next seeds.
    backend:
        Where the fit runs (:class:`rapids_attn.backends.LearnBackend`); None is scikit-learn. KMeans's extra
        fits (the k sweep's and the stability refits) run here too (:mod:`rapids_attn.learn.kmeans_fits`).

    Fitted attributes
    -----------------
    ``backend_``, ``pca_``, ``umap_`` (None without UMAP), ``clusterer_``, ``embedding_`` (the fitted maps in the
    space they are clustered in), ``labels_`` (int32, on the backend's device), ``n_clusters_`` (KMeans: the k it
    fitted, the sweep's pick under ``n_clusters: auto``; None otherwise), ``k_sweep_`` (the sweep's figures, or
    None) and ``seconds_`` (what each part of the fit took).
    """

    def __init__(self, reduce, cluster, seed: int = 0, backend: LearnBackend | None = None):
        self.reduce = reduce
        self.cluster = cluster
        self.seed = seed
        self.backend = backend

    # -- fitting -----------------------------------------------------------------------------------
    def fit(self, x) -> MapClusterer:
        b = self._start()
        c = self.cluster
        t0 = time.perf_counter()
        self.pca_, self.umap_ = self.reducers(x.shape[1])
        self.pca_.fit(x)
        z = self.pca_.transform(x)
        if self.umap_ is not None:
            z = self.umap_.fit_transform(z)
        t1 = time.perf_counter()
        self.seconds_ = {"reduce_fit": t1 - t0, "k_sweep": 0.0}
        k = None
        if c.method == "kmeans":
            if c.k_sweep is not None:
                self.k_sweep_ = sweep_k(
                    b, z, c.k_sweep, c.sweep_sample, c.silhouette_sample, self.seed, c.stability_seeds > 0
                )
                self.seconds_["k_sweep"] = time.perf_counter() - t1
            k = c.n_clusters
            if k == "auto":
                k = self.k_sweep_["best_silhouette_k"] or c.k_sweep[0]
            if self.k_sweep_ is not None:
                self.k_sweep_["chosen"] = int(k)
        self.clusterer_ = self.make_clusterer(k)
        self.n_clusters_ = None if k is None else int(k)
        labels = self.clusterer_.fit_predict(z)
        self.embedding_, self.labels_ = z, b.asarray(labels).astype(b.xp.int32)
        self.seconds_["cluster_fit"] = time.perf_counter() - t1 - self.seconds_["k_sweep"]
        return self

    def fit_predict(self, x):
        return self.fit(x).labels_

    @classmethod
    def from_fitted(cls, reduce, cluster, seed: int, backend: LearnBackend, pca, clusterer, k_sweep=None):
        """A fitted chain from parts fitted elsewhere (the multi-GPU fit: cuml.dask's combined single-GPU PCA and
        KMeans), which :meth:`project` and :meth:`predict_embedding` then apply. KMeans only: the fitted maps
        themselves are not held, so there is no nearest-neighbour assignment."""
        est = cls(reduce, cluster, seed, backend)
        est._start()
        est.pca_, est.umap_, est.clusterer_ = pca, None, clusterer
        est.n_clusters_ = int(clusterer.n_clusters)
        est.k_sweep_ = k_sweep
        return est

    def _backend(self) -> LearnBackend:
        return self.backend or LearnBackend("sklearn", "scikit-learn")

    def _start(self) -> LearnBackend:
        self.backend_ = self._backend()
        self.k_sweep_ = None
        self.embedding_ = self.labels_ = None
        self.seconds_ = {}
        self._nn = None
        return self.backend_

    def reducers(self, dim: int):
        """``(pca, umap)``, unfitted, as :meth:`fit` builds them for ``dim``-wide features (umap None when off)."""
        b, u = self._backend(), self.reduce.umap
        pca = b.pca(min(self.reduce.pca_components, dim), self.seed)
        return pca, (b.umap(u.n_components, u.n_neighbors, u.min_dist, u.metric, self.seed) if u.enabled else None)

    def make_clusterer(self, k: int | None = None):
        """The clusterer, unfitted, as :meth:`fit` builds it (KMeans with ``k``: ``n_clusters``, or the sweep's
        pick)."""
        c, b = self.cluster, self._backend()
        if c.method == "kmeans":
            return b.kmeans(c.n_clusters if k is None else k, self.seed)
        if c.method == "dbscan":
            return b.dbscan(c.eps, c.min_samples)
        return b.hdbscan(c.min_cluster_size, c.min_samples)

    # -- KMeans's seed stability ---------------------------------------------------------------------
    def stability_seeds(self) -> list[int]:
        """The seeds of the stability refits: the next ``cluster.stability_seeds`` after the fit's."""
        return [self.seed + i for i in range(1, self.cluster.stability_seeds + 1)]

    def seed_stability(self) -> dict | None:
        """KMeans's dependence on its seed: the fit's labels of the fitted maps against refits with the next
        ``cluster.stability_seeds`` seeds (adjusted Rand index; None for a deterministic method, or when skipped)."""
        if self.cluster.method != "kmeans" or not self.cluster.stability_seeds:
            return None
        t = time.perf_counter()
        seeds = self.stability_seeds()
        ari = seed_agreement(self.backend_, self.embedding_, self.labels_, self.n_clusters_, seeds)
        self.seconds_["stability"] = time.perf_counter() - t
        return {"seeds": seeds, "ari": ari, "min_ari": min(ari), "n_fit": int(self.embedding_.shape[0])}

    # -- applying the fit ----------------------------------------------------------------------------
    def project(self, x):
        """``(pca, z)``: the maps' PCA coordinates and their coordinates in the clustered space (UMAP's, or the
        PCA's when UMAP is off)."""
        p = self.pca_.transform(x)
        return p, (self.umap_.transform(p) if self.umap_ is not None else p)

    def transform(self, x):
        """The maps in the space they are clustered in."""
        return self.project(x)[1]

    def predict_embedding(self, z):
        """Cluster labels (int32) of maps already in the clustered space (:meth:`transform`'s output). KMeans
        predicts; DBSCAN and HDBSCAN have no predict, so each map takes the label of its nearest fitted map
        (noise stays noise): for the fitted maps themselves that is their own label."""
        xp = self.backend_.xp
        if self.cluster.method == "kmeans":
            return xp.asarray(self.clusterer_.predict(z)).astype(xp.int32)
        if self._nn is None:
            self._nn = self.backend_.nearest_neighbors().fit(self.embedding_)
        _, ind = self._nn.kneighbors(z)
        return self.labels_[xp.asarray(ind)[:, 0]]

    def predict(self, x):
        return self.predict_embedding(self.transform(x))
