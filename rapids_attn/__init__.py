"""rapids_attn: attention-head research at dataset scale.

One command, ``python -m rapids_attn.run job.yaml``, runs a HuggingFace transformer over a dataset,
captures every attention map (example x layer x head), embeds each map, stores everything in Zarr,
then reduces and clusters the maps. Nothing GPU-specific (cupy, cuml, cudf, dask_cuda) is imported
at package import time.

:class:`MapClusterer` (the learn stage's reduce-then-cluster chain, a scikit-learn estimator) is exported here,
imported on first use (``from rapids_attn import MapClusterer``): ``import rapids_attn`` stays light.
"""

__version__ = "0.1.0"

__all__ = ["MapClusterer", "__version__"]


def __getattr__(name: str):
    if name == "MapClusterer":
        from rapids_attn.learn.estimator import MapClusterer

        return MapClusterer
    raise AttributeError(f"module 'rapids_attn' has no attribute {name!r}")
