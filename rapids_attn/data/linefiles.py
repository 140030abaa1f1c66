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

What the readers refuse, each in one line that names the file and the line:

- a record over :data:`MAX_RECORD_BYTES` (a JSONL or text line, or a CSV row with its quoted newlines):
  no line is read whole into memory before its length is known (``readline`` is bounded);
- a NUL byte (a binary file, or UTF-16 read as UTF-8), and bytes that are not UTF-8;
- a JSONL line nested too deeply for Python's JSON parser (a ``RecursionError`` otherwise);
- CSV that is not well formed (``csv`` in strict mode): a quote that is never closed, named by the line it
  opens on (without strict mode it would swallow the rest of the file into one record), a closing quote
  followed by more text (``"a"b``), a row with more or fewer fields than the header, and a field longer than
  :data:`rapids_attn.data.fields.MAX_TEXT_CHARS` characters (the CSV reader raises ``csv``'s process-wide
  field limit to that bound, never lowers it). A BOM before the header is dropped.
- a field the job reads named twice: a CSV header's column (``text,text``), a JSONL record's key (``json`` would
  keep the last value without a word); Parquet's schema the same way (:mod:`rapids_attn.data.tables`).

A record's text over :data:`rapids_attn.data.fields.MAX_TEXT_CHARS` characters is refused by the field rules
(:meth:`FieldSpec.example`), and a text line's the same way.
"""

from __future__ import annotations

import bisect
import csv
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapids_attn.data.example import Example
from rapids_attn.data.fields import MAX_TEXT_CHARS, FieldSpec, FieldsSource, check_length
from rapids_attn.errors import DataError

BOM = b"\xef\xbb\xbf"

#: the most bytes one record of a line-based file may take: a JSONL or text line, or a CSV row with its quoted
#: newlines. Room for two texts of :data:`rapids_attn.data.fields.MAX_TEXT_CHARS` characters written with
#: JSON's ``\u`` escapes (6 bytes a character, 12 outside the BMP) and other fields besides; a longer record is
#: refused before it is parsed (a line is read at most this many bytes at a time).
MAX_RECORD_BYTES = 32 * 1024 * 1024

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


def record_too_long(path, first: int, at: int, limit: int) -> DataError:
    """The record that starts on line ``first`` runs past ``limit`` bytes on line ``at``."""
    bound = f"{limit:,} bytes, the bound on one record (rapids_attn.data.linefiles.MAX_RECORD_BYTES)"
    if at <= first:
        return DataError(
            f"data.path: line {first} of {path} is longer than {bound}; cut that record or split it into several"
        )
    return DataError(
        f"data.path: the record that starts on line {first} of {path} runs past {bound} by line {at}; if a quote "
        "opened there is never closed, close it, else cut that record or split it into several"
    )


class LineReader:
    """The decoded lines of a binary file from byte ``offset`` on; ``pos`` is the byte offset after the
    last line handed out and ``line`` its 1-based line number (``line`` counts from the given base).

    A record (the lines handed out since the last :meth:`begin`) may take at most ``limit`` bytes: a longer one
    raises DataError, and no more than ``limit + 1`` bytes are read in one go."""

    def __init__(self, f, path, offset: int, line: int, limit: int | None = None) -> None:
        f.seek(offset)
        self.f, self.path, self.pos, self.line = f, path, offset, line
        self.limit = MAX_RECORD_BYTES if limit is None else limit
        self._pending: list[bytes] = []
        self.begin()

    def begin(self) -> None:
        """A record starts with the next line."""
        self.start_pos, self.start_line = self.pos, self.line

    def __iter__(self) -> LineReader:
        return self

    def __next__(self) -> str:
        if not self._pending:
            chunk = self.f.readline(self.limit + 1)
            if not chunk:
                raise StopIteration
            # text mode also ends a line at a lone "\r"; bytes.splitlines splits exactly at \n, \r\n and \r
            pieces = chunk.splitlines(keepends=True) if b"\r" in chunk else [chunk]
            if len(chunk) > self.limit and not chunk.endswith(b"\n"):
                # cut at the bound: hand out the lines that ended within it and read the rest again (a last
                # "\r" may be the first half of "\r\n"); one line alone over the bound is refused
                rest = pieces.pop()
                if not pieces:
                    raise record_too_long(self.path, self.start_line + 1, self.line + 1, self.limit)
                self.f.seek(-len(rest), os.SEEK_CUR)
            self._pending = pieces[::-1]
        piece = self._pending.pop()
        start = self.pos
        self.pos += len(piece)
        self.line += 1
        if self.pos - self.start_pos > self.limit:
            raise record_too_long(self.path, self.start_line + 1, self.line, self.limit)
        if start == 0 and piece.startswith(BOM):
            piece, start = piece[len(BOM) :], len(BOM)
        nul = piece.find(b"\0")
        if nul >= 0:
            raise DataError(
                f"data.path: line {self.line} of {self.path} holds a NUL byte (offset {start + nul}), "
                "so it is not UTF-8 text (a binary file, or UTF-16?); re-save the file as UTF-8 text"
            )
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

    @classmethod
    def open(cls, path: Path, spec: FieldSpec | None, log: logging.Logger | None = None) -> LineSource | None:
        """The source for ``path`` (:class:`rapids_attn.data.formats.Source`); nothing is read before the pass."""
        return cls(str(path), spec)

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
    """Each non-blank line, a record of its own: (offset before it, line before it, its line, its text)."""
    mark = (lines.pos, lines.line)
    while True:
        lines.begin()
        try:
            text = next(lines)
        except StopIteration:
            return
        if text.strip():
            yield mark[0], mark[1], lines.line, text
            mark = (lines.pos, lines.line)


def too_deep(where: str) -> DataError:
    return DataError(
        f"data.path: {where} nests JSON too deeply to parse (Python's parser stops near "
        f"{sys.getrecursionlimit():,} levels); flatten that record"
    )


@dataclass(frozen=True)
class JsonlSource(LineSource):
    """JSON Lines: one JSON object per line; blank lines are skipped."""

    format = "jsonl"

    def _stream(self, lines):
        return _non_blank(lines)

    def _build(self, raw: str, record: int, line: int) -> Example:
        where = f"line {line} of {self.path}"
        try:
            obj = json.loads(raw, object_pairs_hook=_object)
        except json.JSONDecodeError as e:
            raise DataError(f"data.path: {where} is not valid JSON ({e.msg}); fix or remove that line") from None
        except RecursionError:
            raise too_deep(where) from None
        if not isinstance(obj, dict):
            raise DataError(
                f"data.path: {where} is a JSON {type(obj).__name__}, not an object; write one JSON object per line"
            )
        if isinstance(obj, _RepeatedKeys):
            self.spec.check_unrepeated(obj.keys_written, where, "key", "write each key once (JSON keeps the last)")
        return self.spec.example(obj, record, where)


class _RepeatedKeys(dict):
    """A JSON object that gave a key more than once (``json`` keeps the last value): its keys as written."""

    keys_written: list


def _object(pairs: list) -> dict:
    """``json``'s ``object_pairs_hook``: the object as ``json`` builds it, marked when a key repeats."""
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    out = _RepeatedKeys(d)
    out.keys_written = [k for k, _ in pairs]
    return out


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
        text = raw.strip()
        check_length(len(text), f"line {line} of {self.path}")
        return Example(id=str(line), text=text)


def _csv_reader(lines: LineReader, delimiter: str):
    """``csv``'s reader in strict mode, with its field limit at least :data:`MAX_TEXT_CHARS` characters (the
    limit is process-wide: this raises it, never lowers it)."""
    if csv.field_size_limit() < MAX_TEXT_CHARS:
        csv.field_size_limit(MAX_TEXT_CHARS)
    return csv.reader(lines, delimiter=delimiter, strict=True)


@dataclass(frozen=True)
class CsvSource(LineSource):
    """CSV with a header row (TSV when the suffix is .tsv); blank lines are skipped. ``fieldnames`` is
    the header, read by the driver (:meth:`open`), so a worker starts anywhere after it. Read by ``csv`` in
    strict mode: what it cannot read faithfully is refused, naming the line (see the module's notes)."""

    delimiter: str = ","
    fieldnames: tuple[str, ...] = ()

    format = "csv"

    @classmethod
    def open(cls, path: Path, spec: FieldSpec, log: logging.Logger | None = None) -> CsvSource | None:
        """Read and check the header; None for an empty file."""
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        with open(path, "rb") as f:
            lines = LineReader(f, path, 0, 0)
            try:
                header = next(_csv_reader(lines, delimiter), None)
            except csv.Error as e:
                raise _csv_error(f, path, delimiter, e, 0, 0, lines.line) from None
        if header is None:
            return None
        spec.check_fields(header, f"the header (line 1) of {path}")
        spec.check_unrepeated(header, f"the header (line 1) of {path}", "column", "give each column its own name")
        return cls(str(path), spec, delimiter=delimiter, fieldnames=tuple(header))

    def _start(self, lines: LineReader) -> None:
        next(_csv_reader(lines, self.delimiter))  # the header, checked in open()

    def _stream(self, lines: LineReader):
        reader = _csv_reader(lines, self.delimiter)
        while True:
            mark = (lines.pos, lines.line)
            lines.begin()
            try:
                row = next(reader)  # pulls as many lines as a quoted newline needs
            except StopIteration:
                return
            except csv.Error as e:
                raise _csv_error(lines.f, self.path, self.delimiter, e, mark[0], mark[1], lines.line) from None
            if row:  # [] is a blank line
                yield mark[0], mark[1], lines.line, row

    def _build(self, raw: list, record: int, line: int) -> Example:
        where = f"line {line} of {self.path}"
        if len(raw) != len(self.fieldnames):
            raise DataError(
                f"data.path: {where} has a different number of columns ({len(raw)}) than the header "
                f"({len(self.fieldnames)}); fix that row (quote a field that holds the delimiter)"
            )
        return self.spec.example(dict(zip(self.fieldnames, raw)), record, where)


def _csv_error(f, path, delimiter: str, e: csv.Error, offset: int, base: int, at: int) -> DataError:
    """One line for ``csv``'s error in the record read from ``offset`` (after line ``base``; the error came on
    line ``at``): an unclosed quote is named by the line it opens on."""
    first = base + 1
    problem = str(e)
    if problem == "unexpected end of data":  # strict mode's end of file inside a quoted field
        line = _open_quote_line(f, path, delimiter, offset, base, at)
        return DataError(
            f"data.path: line {line} of {path} opens a quoted field that is never closed (it runs to the end of the "
            f'file, line {at}); close the quote, or write a quote inside a quoted field as two ("")'
        )
    if problem.startswith("field larger than field limit"):
        return DataError(
            f"data.path: the record that starts on line {first} of {path} has a field longer than "
            f"{MAX_TEXT_CHARS:,} characters (rapids_attn.data.fields.MAX_TEXT_CHARS); if a quote opened there is "
            "never closed, close it, else cut that field or split the record into several"
        )
    where = f"line {at} of {path}" + (f" (in the record that starts on line {first})" if at > first else "")
    return DataError(
        f"data.path: {where} is not valid CSV ({problem}); fix that row: a field with a quote, the delimiter or a "
        'newline is quoted whole, a quote inside it written as two ("")'
    )


def _open_quote_line(f, path, delimiter: str, offset: int, base: int, at: int) -> int:
    """The line where the quoted field left open at the end of the file begins: the record read again from
    ``offset`` without strict mode, whose last field then holds everything after the quote."""
    try:
        lines = LineReader(f, path, offset, base)
        row = next(csv.reader(lines, delimiter=delimiter))
    except (csv.Error, StopIteration, DataError):
        return base + 1
    spanned = len(row[-1].encode("utf-8").splitlines()) if row else 0  # the lines LineReader split it into
    return max(at - max(spanned, 1) + 1, base + 1)
