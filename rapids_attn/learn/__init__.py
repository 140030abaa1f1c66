"""Reduce (PCA, optional UMAP) and cluster (KMeans, DBSCAN, HDBSCAN) every map of a store.

:class:`MapClusterer` is the reduce-then-cluster chain as a scikit-learn estimator (flat keyword parameters,
``get_params`` / ``set_params`` / ``clone``; :meth:`MapClusterer.from_config` builds one from the job's ``reduce``
and ``cluster`` sections); :func:`fit_store` fits one on a sample of any store with a ``features`` array,
given the job's reduce and cluster sections and a learn backend, and applies it chunk by chunk;
:class:`rapids_attn.learn.stage.LearnStage` is the job's stage.
"""

__all__ = ["MapClusterer", "fit_store"]


def __getattr__(name: str):
    """``MapClusterer`` and ``fit_store``, imported on first use: the job's schema imports this package's
    :mod:`~rapids_attn.learn.config` without loading scikit-learn, Zarr and the fit."""
    if name == "MapClusterer":
        from rapids_attn.learn.estimator import MapClusterer

        return MapClusterer
    if name == "fit_store":
        from rapids_attn.learn.fit import fit_store

        return fit_store
    raise AttributeError(f"module 'rapids_attn.learn' has no attribute {name!r}")
