"""Dataset readers. The driver indexes the input (:func:`build_index` -> :class:`DataIndex`) and each
worker reads its own rows (:class:`Rows`); :func:`read_examples` reads a whole dataset into a list. The data
formats, and the :class:`Source` protocol their readers follow, are registered in :mod:`rapids_attn.data.formats`.

The names below are imported when first used (PEP 562), not with the package: the job schema imports
:mod:`rapids_attn.data.formats` (light) to validate ``data.format``, without NumPy and the index."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapids_attn.data.example import Example
    from rapids_attn.data.index import DataIndex, Rows
    from rapids_attn.data.readers import build_index, read_examples

__all__ = ["DataIndex", "Example", "Rows", "build_index", "read_examples"]

_WHERE = {
    "DataIndex": "rapids_attn.data.index",
    "Example": "rapids_attn.data.example",
    "Rows": "rapids_attn.data.index",
    "build_index": "rapids_attn.data.readers",
    "read_examples": "rapids_attn.data.readers",
}


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
