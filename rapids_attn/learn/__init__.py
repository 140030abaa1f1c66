"""Phase 2: reduce (PCA, optional UMAP) and cluster (KMeans, DBSCAN, HDBSCAN) every map.

See :func:`rapids_attn.learn.fit.run_learn`.
"""

from rapids_attn.learn.fit import run_learn

__all__ = ["run_learn"]
