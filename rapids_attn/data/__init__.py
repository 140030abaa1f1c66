"""Dataset readers. Every reader yields :class:`Example` records; see :func:`read_examples`."""

from rapids_attn.data.example import Example
from rapids_attn.data.readers import read_examples

__all__ = ["Example", "read_examples"]
