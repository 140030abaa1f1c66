"""Reduce (PCA, optional UMAP) and cluster (KMeans, DBSCAN, HDBSCAN) every map of a store.

:func:`fit_store` works on any store with a ``features`` array, given the job's reduce and cluster
sections and a learn backend; :class:`rapids_attn.learn.stage.LearnStage` is the job's stage.
"""

from rapids_attn.learn.fit import fit_store

__all__ = ["fit_store"]
