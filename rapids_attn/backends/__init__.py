"""Estimator factories and array handling for the learn stage: scikit-learn on NumPy (CPU) or cuML
on CuPy (GPU). cuML mirrors scikit-learn's estimator API, so the learn stage calls the same ``fit``
/ ``transform`` / ``predict`` on whatever :class:`LearnBackend` builds. Which backend a job gets is
decided in :mod:`rapids_attn.devices`, the only module that looks at CUDA.
"""

from rapids_attn.backends.learn import LearnBackend

__all__ = ["LearnBackend"]
