"""Line-based files (JSON Lines, CSV/TSV, plain text), read as a stream of records with byte offsets.

The driver makes one pass over a file with :meth:`LineSource.scan`: it validates every record with
the same rules and messages as ever, and notes the byte offset (and line number) at record
boundaries, so that a worker can later :meth:`LineSource.read` its own records by seeking to the
nearest noted boundary and reading forward. No pass holds more than one record.

Files are read as bytes and split into lines the way Python's text mode splits them (at ``\\n``,
``\\r\\n`` and a lone ``\\r``); each line is decoded as UTF-8 (a BOM at the start of the file is
dropped, as ``utf-8-sig`` does). A CSV record may span lines (a quoted newline): ``csv`` pulls one
line at a time from the stream, so the offset after a record is the offset after the last line it
pulled.
"""

from __future__ import annotations

import bisect
import csv
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapids_attn.data.example import Example
from rapids_attn.data.fields import FieldSpec, FieldsSource
from rapids_attn.errors import DataError

BOM = b"\xef\xbb\xbf"

#: (record number, byte offset, line number) of a point where reading forward yields that record next
Seek = tuple[int, int, int]


def not_utf8(path, offset: int) -> DataError:
    return DataError(f"data.path: {path} is not UTF-8 text (bad byte at offset {offset}); re-save the file as UTF-8")


def changed(path, record: int) -> DataError:
    return DataError(
        f"data.path: {path} changed after the job read it (record {record}, counting from 0, is no longer there); "
        "leave the data unchanged while a job runs, then rerun it"
    )


def file_stamp(path) -> tuple[int, int]:
    """(size, modification time in ns): taken when the driver opens a file, checked by each worker."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def check_stamp(path, stamp: tuple[int, int] | None) -> None:
    """DataError when the file is not the one the driver indexed (its offsets and row numbers would lie)."""
    if stamp is not None and file_stamp(path) != tuple(stamp):
        raise DataError(
            f"data.path: {path} changed after the job read it (its size or modification time differs); "
            "leave the data unchanged while a job runs, then rerun it"
        )


class LineReader:
    """The decoded lines of a binary file from byte ``offset`` on; ``pos`` is the byte offset after the
    last line handed out and ``line`` its 1-based line number (``line`` counts from the given base)."""

    def __init__(self, f, path, offset: int, line: int) -> None:
        f.seek(offset)
        self.f, self.path, self.pos, self.line = f, path, offset, line
        self._pending: list[bytes] = []

    def __iter__(self) -> LineReader:
        return self

    def __next__(self) -> str:
        if not self._pending:
            chunk = self.f.readline()
            if not chunk:
                raise StopIteration
            # text mode also ends a line at a lone "\r"; bytes.splitlines splits exactly at \n, \r\n and \r
            self._pending = chunk.splitlines(keepends=True)[::-1] if b"\r" in chunk else [chunk]
        piece = self._pending.pop()
        start = self.pos
        self.pos += len(piece)
        self.line += 1
        if start == 0 and piece.startswith(BOM):
            piece, start = piece[len(BOM) :], len(BOM)
        try:
            return piece.decode("utf-8")
        except UnicodeDecodeError as e:
            raise not_utf8(self.path, start + e.start) from None


@dataclass(frozen=True)
class LineSource(FieldsSource):
    """A line-based file: where it is and how its records become Examples. Small and picklable."""

    path: str
    spec: FieldSpec | None = None
    #: the file's (size, mtime) when the driver opened it; a worker refuses a file that differs
    stamp: tuple[int, int] | None = field(default=None, compare=False)

    format = "lines"

    def __post_init__(self) -> None:
        if self.stamp is None:
            object.__setattr__(self, "stamp", file_stamp(self.path))

    def _stream(self, lines: LineReader) -> Iterator[tuple[int, int, int, Any]]:
        """Every record from the reader's position: (offset before it, line before it, its line, raw)."""
        raise NotImplementedError

    def _build(self, raw: Any, record: int, line: int) -> Example:
        raise NotImplementedError

    def _start(self, lines: LineReader) -> None:
        """Read what precedes the first record (a header); the driver's pass only."""

    def scan(self) -> Iterator[tuple[int, int, Example]]:
        """The driver's pass: every record validated (built as a worker will build it), as (offset before it,
        line before it, its Example); the caller keeps what it needs of each (its id) and drops the rest."""
        with open(self.path, "rb") as f:
            lines = LineReader(f, self.path, 0, 0)
            self._start(lines)
            for record, (offset, base, line, raw) in enumerate(self._stream(lines)):
                yield offset, base, self._build(raw, record, line)

    def read(self, records: Sequence[int], seeks: Sequence[Seek]) -> list[Example]:
        """The records numbered ``records`` (ascending), each read forward from the nearest ``seeks`` entry
        at or before it (reading on from the previous record when that is nearer)."""
        check_stamp(self.path, self.stamp)
        marks = [s[0] for s in seeks]
        out: list[Example] = []
        with open(self.path, "rb") as f:
            stream, cur = None, -1
            for want in records:
                k = bisect.bisect_right(marks, want) - 1
                if k < 0:
                    raise ValueError(f"no seek point at or before record {want}")
                rec, offset, line = seeks[k]
                if stream is None or cur > want or rec > cur:
                    stream, cur = self._stream(LineReader(f, self.path, offset, line)), rec
                try:
                    while cur < want:
                        next(stream)
                        cur += 1
                    _, _, line_no, raw = next(stream)
                except StopIteration:
                    raise changed(self.path, want) from None
                cur += 1
                out.append(self._build(raw, want, line_no))
        return out


def _non_blank(lines: LineReader) -> Iterator[tuple[int, int, int, str]]:
    mark = (lines.pos, lines.line)
    for text in lines:
        if text.strip():
            yield mark[0], mark[1], lines.line, text
            mark = (lines.pos, lines.line)


@dataclass(frozen=True)
class JsonlSource(LineSource):
    """JSON Lines: one JSON object per line; blank lines are skipped."""

    format = "jsonl"

    def _stream(self, lines):
        return _non_blank(lines)

    def _build(self, raw: str, record: int, line: int) -> Example:
        where = f"line {line} of {self.path}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(f"data.path: {where} is not valid JSON ({e.msg}); fix or remove that line") from None
        if not isinstance(obj, dict):
            raise DataError(
                f"data.path: {where} is a JSON {type(obj).__name__}, not an object; write one JSON object per line"
            )
        return self.spec.example(obj, record, where)


@dataclass(frozen=True)
class TextSource(LineSource):
    """Plain text: one Example per non-empty line (stripped); id = 1-based line number."""

    format = "text"

    @property
    def numbered(self) -> bool:
        return True

    def _stream(self, lines):
        return _non_blank(lines)

    def _build(self, raw: str, record: int, line: int) -> Example:
        return Example(id=str(line), text=raw.strip())


@dataclass(frozen=True)
class CsvSource(LineSource):
    """CSV with a header row (TSV when the suffix is .tsv); blank lines are skipped. ``fieldnames`` is
    the header, read by the driver (:meth:`open`), so a worker starts anywhere after it."""

    delimiter: str = ","
    fieldnames: tuple[str, ...] = ()

    format = "csv"

    @classmethod
    def open(cls, path: Path, spec: FieldSpec) -> CsvSource | None:
        """Read and check the header; None for an empty file."""
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        with open(path, "rb") as f:
            lines = LineReader(f, path, 0, 0)
            try:
                header = next(csv.reader(lines, delimiter=delimiter), None)
            except csv.Error as e:
                raise DataError(
                    f"data.path: line {lines.line} of {path} is not valid CSV ({e}); fix that row"
                ) from None
        if header is None:
            return None
        spec.check_fields(header, f"the header (line 1) of {path}")
        return cls(str(path), spec, delimiter=delimiter, fieldnames=tuple(header))

    def _start(self, lines: LineReader) -> None:
        next(csv.reader(lines, delimiter=self.delimiter))  # the header, checked in open()

    def _stream(self, lines: LineReader):
        reader = csv.DictReader(lines, fieldnames=list(self.fieldnames), delimiter=self.delimiter)
        mark = (lines.pos, lines.line)
        while True:
            try:
                row = next(reader)  # skips blank lines; pulls as many lines as a quoted newline needs
            except StopIteration:
                return
            except csv.Error as e:
                raise DataError(
                    f"data.path: line {lines.line} of {self.path} is not valid CSV ({e}); fix that row"
                ) from None
            yield mark[0], mark[1], lines.line, row
            mark = (lines.pos, lines.line)

    def _build(self, raw: dict, record: int, line: int) -> Example:
        where = f"line {line} of {self.path}"
        if None in raw or any(v is None for v in raw.values()):
            raise DataError(
                f"data.path: {where} has a different number of columns than the header "
                f"({len(self.fieldnames)}); fix that row"
            )
        return self.spec.example(raw, record, where)
