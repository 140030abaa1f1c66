"""Reduce (PCA, optional UMAP) and cluster (KMeans, DBSCAN, HDBSCAN) every map of a store.

:class:`MapClusterer` is the reduce-then-cluster chain as a scikit-learn-shaped estimator (``fit`` returns it,
fitted state ends in an underscore); :func:`fit_store` fits one on a sample of any store with a ``features`` array,
given the job's reduce and cluster sections and a learn backend, and applies it chunk by chunk;
:class:`rapids_attn.learn.stage.LearnStage` is the job's stage.
"""

from rapids_attn.learn.estimator import MapClusterer
from rapids_attn.learn.fit import fit_store

__all__ = ["MapClusterer", "fit_store"]
