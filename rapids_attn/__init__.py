"""rapids_attn: attention-head research at dataset scale.

One command, ``python -m rapids_attn.run job.yaml``, runs a HuggingFace transformer over a dataset,
captures every attention map (example x layer x head), embeds each map, stores everything in Zarr,
then reduces and clusters the maps. Nothing GPU-specific (cupy, cuml, cudf, dask_cuda) is imported
at package import time.
"""

__version__ = "0.1.0"
