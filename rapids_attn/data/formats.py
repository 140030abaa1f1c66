"""The data formats: the :class:`Source` protocol, and one :class:`Format` registration per format.

A format is one entry in :data:`REGISTRY` (docs/architecture.md, "Adding a data format"): its name (what
``data.format`` takes), the :class:`Source` class that reads it, the suffixes ``data.format: auto`` reads as
it, whether its records are built from the named fields, whether its input is a folder (and the marker files
that tell ``auto`` so), and its fingerprint rule (the content hash that enters the store's extraction key).
Everything else reads the registry: the job schema's ``data.format`` values (:data:`FORMATS`, in this
order, ``auto`` first), ``auto``'s detection, the reader (:func:`rapids_attn.data.readers.build_index`), and
the index's ``Source`` type.

This module is light on purpose (no NumPy, no pyarrow): the job schema imports it to validate ``data.format``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from rapids_attn.data.example import Example
from rapids_attn.data.fields import FieldSpec
from rapids_attn.data.fingerprint import file_fingerprint, folder_fingerprint
from rapids_attn.data.linefiles import CsvSource, JsonlSource, Seek, TextSource
from rapids_attn.data.tables import HfSource, ParquetSource


@runtime_checkable
class Source(Protocol):
    """A record source: where the input is and how its records become :class:`Example` s.

    The driver opens it (:meth:`open`: the header or schema is checked there), makes one pass over it
    (:meth:`scan`: every record validated) and keeps only the index; the source itself then travels inside
    every shard task, so it is small and picklable, and each worker reads its own records (:meth:`read`).
    ``path`` is absolute: workers started elsewhere read the same file.

    A source whose pass yields ids only (not Examples: Parquet) also has ``empty_rows() -> Iterable[int]``,
    the records with no text. A line-based source (a :class:`rapids_attn.data.linefiles.LineSource`) gets seek
    points from the pass's offsets; any other is read by record number (its offsets are 0).
    """

    path: str

    @classmethod
    def open(cls, path: Path, spec: FieldSpec | None, log: logging.Logger) -> Source | None:
        """The source for ``path`` (``spec``: the job's fields, None for a format that does not read fields;
        ``log``: where to say a choice it made), or None when it holds no records. DataError for a header,
        schema or layout the job's settings cannot read."""
        ...

    @property
    def numbered(self) -> bool:
        """The ids are record (or line) numbers, so unique without a check."""
        ...

    @property
    def pairs(self) -> bool:
        """The examples are text pairs."""
        ...

    def scan(self) -> Iterator[tuple[int, int, Example | str]]:
        """The driver's pass: for every record, (byte offset before it, line before it, its Example or only its
        id). Validates every record with the rules :meth:`read` applies."""
        ...

    def read(self, records: Sequence[int], seeks: Sequence[Seek]) -> list[Example]:
        """The records numbered ``records`` (ascending), reading forward from the nearest of ``seeks`` (line
        files) or by row number; DataError when the input changed since the pass."""
        ...


@dataclass(frozen=True)
class Format:
    """One data format: everything the job, ``auto`` and the reader need to know of it."""

    #: the value of ``data.format``
    name: str
    #: reads its records; None: SQuAD's one JSON document, the format read whole in the driver
    #: (:func:`rapids_attn.data.readers.read_squad`), whose examples travel inline
    source: type[Source] | None
    #: file suffixes (lower case, with the dot) that ``data.format: auto`` reads as this format
    suffixes: tuple[str, ...] = ()
    #: records are built from the named fields (``data.text_fields``, ``id_field``, ...); False: a fixed layout
    #: that ignores them
    fields: bool = True
    #: a folder format: what ``data.path`` must then be, as a message says it; "" for a file format
    folder: str = ""
    #: a folder format: files, any one of which marks a folder as this format for ``auto``
    markers: tuple[str, ...] = ()
    #: a folder format: its name in the message for a folder that is no known format
    folder_name: str = ""
    #: the content hash of the input (part of the store's extraction key: an existing format's rule never
    #: changes, or its stores stop matching)
    fingerprint: Callable[[Path], str] = file_fingerprint


def _registry(*formats: Format) -> dict[str, Format]:
    out: dict[str, Format] = {}
    suffixes: dict[str, str] = {}
    for f in formats:
        if f.name == "auto" or f.name in out:
            raise ValueError(f"data format {f.name!r} registered twice (or named auto)")
        if bool(f.folder) != bool(f.markers) or (f.folder and f.suffixes):
            raise ValueError(f"data format {f.name!r}: a folder format has markers and no suffixes")
        for s in f.suffixes:
            if s != s.lower() or not s.startswith(".") or s in suffixes:
                raise ValueError(f"data format {f.name!r}: suffix {s!r} is not lower case, dotted and unique")
            suffixes[s] = f.name
        out[f.name] = f
    return out


#: every data format, by name, in the order the job schema lists them. Adding a format is one entry here.
REGISTRY: dict[str, Format] = _registry(
    Format("squad", None, (".json",), fields=False),
    Format("jsonl", JsonlSource, (".jsonl", ".ndjson")),
    Format("csv", CsvSource, (".csv", ".tsv")),
    Format("text", TextSource, (".txt",), fields=False),
    Format("parquet", ParquetSource, (".parquet",)),
    Format(
        "hf",
        HfSource,
        folder="a directory written by datasets' save_to_disk",
        # what `datasets` `save_to_disk` writes: state.json / dataset_info.json for a Dataset, dataset_dict.json
        # at the top of a DatasetDict (its splits sit in sub-directories)
        markers=("dataset_info.json", "state.json", "dataset_dict.json"),
        folder_name="a saved HuggingFace dataset",
        fingerprint=folder_fingerprint,
    ),
)

#: what ``data.format`` accepts: ``auto`` (detect, :func:`rapids_attn.data.readers.detect_format`), then every
#: registered format
FORMATS: tuple[str, ...] = ("auto", *REGISTRY)

#: file suffix -> format name, for ``data.format: auto``
SUFFIX_FORMATS: dict[str, str] = {s: f.name for f in REGISTRY.values() for s in f.suffixes}


def folder_formats() -> list[Format]:
    return [f for f in REGISTRY.values() if f.folder]
