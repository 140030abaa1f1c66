"""Dataset readers. The driver indexes the input (:func:`build_index` -> :class:`DataIndex`) and each
worker reads its own rows (:class:`Rows`); :func:`read_examples` reads a whole dataset into a list."""

from rapids_attn.data.example import Example
from rapids_attn.data.index import DataIndex, Rows
from rapids_attn.data.readers import build_index, read_examples

__all__ = ["DataIndex", "Example", "Rows", "build_index", "read_examples"]
