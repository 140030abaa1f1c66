"""Benchmarks: ``python -m rapids_attn.bench`` (see docs/benchmarks.md)."""
