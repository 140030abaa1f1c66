"""Benchmarks of rapids_attn, run from the repository root: ``python -m benchmarks`` (docs/benchmarks.md).

They live beside the package, not in it (as scikit-learn's asv_benchmarks do): they need the
checkout's jobs/ and the sibling ../shared data, which an installed wheel has neither of.
"""
