"""The one place that knows CPU from GPU.

:func:`resolve_learn_backend` picks, once, where the fit runs: cuML on CuPy arrays (GPU) or
scikit-learn / umap-learn on NumPy arrays (CPU). cuML mirrors scikit-learn's estimator API, so the
learn stage calls the same ``fit`` / ``transform`` / ``predict`` on whatever the backend builds.
Nothing here imports cupy, cuml or dask_cuda until a GPU backend is asked for.
"""

from rapids_attn.backends.learn import LearnBackend, cuda_device_count, resolve_learn_backend

__all__ = ["LearnBackend", "cuda_device_count", "resolve_learn_backend"]
