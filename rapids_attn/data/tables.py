"""Column files: Parquet and saved HuggingFace datasets (``datasets`` ``save_to_disk``), read by row number.

Both are random access by row, so the driver keeps no offsets: it checks the columns, validates the
values, and counts the rows; a worker opens the file itself and reads only its rows (Parquet: the
row groups that hold them, only the named columns, batch by batch; HF: ``Dataset.select`` on the
memory-mapped dataset).

Parquet: the driver reads the metadata (row counts, schema, null counts, string minimums) and streams only
the id column (when ``data.id_field`` is set) and, where the metadata cannot rule out a null or an empty
string, the text columns; it never holds more than one batch. Rows are numbered from 0 in messages, as for HF.

A text column (Parquet's or HF's) holds strings; or binary values, decoded as UTF-8 and refused, naming the
row, when they are not UTF-8; or numbers (integers, floats, decimals), read as their decimal text. Any other
type (true/false, dates and times, lists, structs) is refused in one line naming the column. The driver's pass
also refuses a row whose text holds more than :data:`rapids_attn.data.fields.MAX_TEXT_CHARS` characters,
streaming the text columns of a row group only when its metadata leaves room for one (or for a null, or holds
binary values to check).

A saved DatasetDict is read by one split: the only one, or ``validation`` when there are several; with several
and no ``validation`` the choice is the user's, and the reader refuses, naming the splits (point
``data.path`` at the split's own folder, which ``save_to_disk`` writes as a Dataset).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rapids_attn.data.example import Example
from rapids_attn.data.fields import (
    MAX_TEXT_CHARS,
    FieldSpec,
    FieldsSource,
    empty_id,
    not_text,
    not_utf8_value,
    plain_text,
    too_long,
)
from rapids_attn.data.linefiles import changed, check_stamp, file_stamp
from rapids_attn.errors import DataError

logger = logging.getLogger(__name__)

#: rows per batch when the driver streams a column or a worker reads a row group
BATCH_ROWS = 8192


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


# ------------------------------------------------------------------------------------------- parquet


def _parquet_file(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(str(path))
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, PermissionError):
            raise
        raise DataError(
            f"data.path: {path} cannot be read as Parquet ({_first_line(e)}); point data.path at a Parquet file "
            "or set data.format to the file's format"
        ) from None


@dataclass(frozen=True)
class ParquetSource(FieldsSource):
    """A Parquet file: one Example per row, fields from its columns."""

    path: str
    spec: FieldSpec
    #: the file's (size, mtime) when the driver opened it; a worker refuses a file that differs
    stamp: tuple[int, int] | None = dataclasses.field(default=None, compare=False)

    format = "parquet"

    def __post_init__(self) -> None:
        if self.stamp is None:
            object.__setattr__(self, "stamp", file_stamp(self.path))

    @classmethod
    def open(cls, path: Path, spec: FieldSpec, log: logging.Logger | None = None) -> ParquetSource:
        """Check the schema: every named column exists, and the text columns hold text, binary or numbers."""
        schema = _parquet_file(path).schema_arrow
        spec.check_fields(schema.names, f"the schema of {path}")
        spec.check_unrepeated(schema.names, f"the schema of {path}", "column", "give each column its own name")
        for field in (spec.text, spec.pair):
            if field is not None and _text_kind(schema.field(field).type) is None:
                raise not_text(f"the schema of {path}", field, f"a {schema.field(field).type} column, not text")
        return cls(str(path), spec)

    def scan(self) -> Iterator[tuple[int, int, str]]:
        """The driver's pass: (0, 0, id) for every row, after checking the text columns (:meth:`_check_texts`)."""
        pf = _parquet_file(self.path)
        md = pf.metadata
        self._check_texts(pf)
        if self.spec.id is None:
            for _ in range(md.num_rows):
                yield 0, 0, ""
            return
        row = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[self.spec.id]):
            for value in batch.column(0).to_pylist():
                if value is None or value == "" or value == b"":
                    raise empty_id(f"row {row} of {self.path}", self.spec.id)
                yield 0, 0, plain_text(value, f"row {row} of {self.path}", self.spec.id, "data.id_field")
                row += 1

    def _check_texts(self, pf) -> None:
        """Refuse the first row (row groups in order; in a row, the text before the pair) whose text is null, or
        binary but not UTF-8, or whose text and pair hold more than :data:`MAX_TEXT_CHARS` characters together.
        A row group is read only
        when its metadata leaves room for one: a null not ruled out by its statistics, binary values, or text
        columns whose uncompressed size (at least the byte length of any one value, so of its characters) is
        over the bound."""
        import pyarrow as pa
        import pyarrow.compute as pc

        md, schema = pf.metadata, pf.schema_arrow
        fields = [f for f in (self.spec.text, self.spec.pair) if f is not None]
        kinds = {f: _text_kind(schema.field(f).type) for f in fields}
        leaves = {md.schema.column(i).path: i for i in range(md.num_columns)}  # a nested column has several
        start = 0
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            cols = [leaves.get(f) for f in fields]
            if not (
                any(c is None or not _no_nulls(group, c) for c in cols)
                or any(kinds[f] == "binary" for f in fields)
                or sum(group.column(c).total_uncompressed_size for c in cols) > MAX_TEXT_CHARS
            ):
                start += group.num_rows
                continue
            row = start
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=list(dict.fromkeys(fields))):
                batch, total = _plain_strings(batch), None
                for field in fields:
                    values = batch.column(field)
                    if values.null_count:
                        bad = row + pc.index(pc.is_null(values), True).as_py()
                        raise not_text(f"row {bad} of {self.path}", field, "empty")
                    if kinds[field] == "number":
                        continue  # a few dozen characters at most
                    if pa.types.is_dictionary(values.type):
                        values = values.dictionary_decode()
                    if kinds[field] == "binary":
                        values = _decoded(values, f"of {self.path}", field, row)
                    chars = pc.utf8_length(values)
                    total = chars if total is None else pc.add(total, chars)
                if total is not None and pc.max(total).as_py() > MAX_TEXT_CHARS:
                    at = pc.index(pc.greater(total, MAX_TEXT_CHARS), True).as_py()
                    raise too_long(f"row {row + at} of {self.path}", total[at].as_py())
                row += batch.num_rows
            start += group.num_rows

    def read(self, records: Sequence[int], seeks: Sequence = ()) -> list[Example]:
        """Rows ``records`` (ascending): only the row groups that hold them, only the named columns, batch by
        batch, stopping after the last row wanted in each group."""
        import numpy as np

        check_stamp(self.path, self.stamp)
        pf = _parquet_file(self.path)
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
        wanted = np.asarray(records, dtype=np.int64)
        if len(wanted) and wanted[-1] >= starts[-1]:
            raise changed(self.path, int(wanted[wanted >= starts[-1]][0]))
        groups = np.searchsorted(starts, wanted, side="right") - 1
        out: list[Example] = []
        columns = self.spec.columns()
        for g in np.unique(groups):
            mine = wanted[groups == g] - starts[g]  # rows wanted, within the group
            row, k = 0, 0
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[int(g)], columns=columns):
                n = batch.num_rows
                stop = int(np.searchsorted(mine, row + n))
                if stop > k:
                    taken = _plain_strings(batch).take(mine[k:stop] - row).to_pylist()
                    for local, values in zip(mine[k:stop], taken):
                        i = int(starts[g] + local)
                        out.append(self.spec.example(values, i, f"row {i} of {self.path}"))
                    k = stop
                row += n
                if k == len(mine):
                    break
        return out

    def empty_rows(self) -> list[int]:
        """The rows with no text (:func:`rapids_attn.data.index.no_text`: the text, and the pair if there is one,
        both empty strings), ascending. Read only from the row groups whose statistics leave room for one (a
        string column that holds an empty string has the minimum ""), so a file without empty texts
        whose writer kept statistics costs its metadata alone; a column of numbers is never empty (its values
        become text)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        pf = _parquet_file(self.path)
        md, schema = pf.metadata, pf.schema_arrow
        fields = [f for f in (self.spec.text, self.spec.pair) if f is not None]
        if any(_text_kind(schema.field(f).type) == "number" for f in fields):
            return []
        leaves = {md.schema.column(i).path: i for i in range(md.num_columns)}
        out: list[int] = []
        start = 0
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            if all(_may_hold_empty(group, leaves.get(f)) for f in fields):
                row = start
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=fields):
                    hit = None
                    for values in _plain_strings(batch).columns:
                        if pa.types.is_dictionary(values.type):
                            values = values.dictionary_decode()
                        empty = pc.fill_null(pc.equal(pc.binary_length(values), 0), False)
                        hit = empty if hit is None else pc.and_(hit, empty)
                    out.extend((row + np.flatnonzero(hit.to_numpy(zero_copy_only=False))).tolist())
                    row += batch.num_rows
            start += group.num_rows
        return out


def _text_kind(t) -> str | None:
    """How a text column of Arrow type ``t`` becomes text: "string", "binary" (decoded as UTF-8), "number"
    (its decimal text), or None: not text (true/false, dates and times, nested types...)."""
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    return None


def _decoded(values, where: str, field: str, row: int):
    """A binary column's values as large strings; DataError naming the first row (``row`` is the first value's)
    that is not UTF-8."""
    import pyarrow as pa

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    try:
        return values.cast(pa.large_string())
    except pa.ArrowInvalid:
        for i, value in enumerate(values.to_pylist()):
            try:
                if value is not None:
                    value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise not_utf8_value(f"row {row + i} {where}", field, e) from None
        raise


def _plain_strings(batch):
    """``batch`` with its view columns as large strings and large binaries (pyarrow's take and string kernels want
    those)."""
    import pyarrow as pa

    for i, f in enumerate(batch.schema):
        if pa.types.is_string_view(f.type) or pa.types.is_binary_view(f.type):
            kind = pa.large_string() if pa.types.is_string_view(f.type) else pa.large_binary()
            batch = batch.set_column(i, f.name, batch.column(i).cast(kind))
    return batch


def _may_hold_empty(row_group, column: int | None) -> bool:
    """False when the row group's statistics rule out an empty string in the column (its minimum is not "", and
    a minimum, truncated or not, is at most every value); True when they do not say."""
    if column is None:
        return True
    stats = row_group.column(column).statistics
    if stats is None or not stats.has_min_max:
        return True
    return stats.min in ("", b"")


def _no_nulls(row_group, column: int) -> bool:
    """True when the row group's statistics say the column has no null (False when they do not say)."""
    stats = row_group.column(column).statistics
    return stats is not None and stats.has_null_count and stats.null_count == 0


# ------------------------------------------------------------------------------------------------ hf


def _load_hf(path):
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"data.format: reading {path} as a HuggingFace dataset needs the datasets library; pip install datasets"
        ) from None
    try:
        return datasets, datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        if isinstance(e, PermissionError):
            raise
        raise DataError(
            f"data.path: {path} cannot be loaded with datasets.load_from_disk ({_first_line(e)}); "
            f"point data.path at a directory written by save_to_disk"
        ) from None


def pick_split(path, splits: list[str]) -> str:
    """The split of a DatasetDict a job reads: the only one, or ``validation``; DataError when the choice is not
    clear (the job has no setting for a split: its folder is a dataset of its own)."""
    if len(splits) == 1:
        return splits[0]
    if "validation" in splits:
        return "validation"
    listed = ", ".join(repr(s) for s in splits)
    raise DataError(
        f"data.path: {path} is a DatasetDict with splits {listed} and none named 'validation', so which to read "
        f"is not clear; set data.path to the split's own folder, e.g. {Path(path) / splits[0]}"
    )


@dataclass(frozen=True)
class HfSource(FieldsSource):
    """A directory written by ``datasets`` ``save_to_disk`` (Dataset, or a DatasetDict and the split used)."""

    path: str
    spec: FieldSpec
    split: str | None = None

    format = "hf"

    @property
    def where(self) -> str:
        return f"dataset {self.path}" + ("" if self.split is None else f" (split {self.split!r})")

    @classmethod
    def open(cls, path: Path, spec: FieldSpec, log: logging.Logger = logger) -> HfSource | None:
        """Pick the split (said on ``log``): the only one, else ``validation``; with several and no
        ``validation`` DataError listing them. Check the columns; None for an empty DatasetDict."""
        datasets, ds = _load_hf(path)
        split = None
        if isinstance(ds, datasets.DatasetDict):
            if not ds:
                return None
            split = pick_split(path, list(ds))
            log.info("data.path: %s is a DatasetDict with splits %s; using split %r", path, ", ".join(ds), split)
            ds = ds[split]
        src = cls(str(path), spec, split)
        spec.check_fields(ds.column_names, src.where)
        return src

    def _dataset(self):
        _, ds = _load_hf(self.path)
        ds = ds if self.split is None else ds[self.split]
        return ds.select_columns(self.spec.columns())

    def scan(self) -> Iterator[tuple[int, int, Example]]:
        """The driver's pass: every row validated (built as the worker will build it), batch by batch."""
        ds = self._dataset()
        i = 0
        for batch in ds.iter(batch_size=BATCH_ROWS):
            names = list(batch)
            for values in zip(*batch.values()):
                yield 0, 0, self.spec.example(dict(zip(names, values)), i, f"row {i} of {self.where}")
                i += 1

    def read(self, records: Sequence[int], seeks: Sequence = ()) -> list[Example]:
        ds = self._dataset()
        if len(records) and records[-1] >= len(ds):
            raise changed(self.path, int(records[-1]))
        rows = ds.select(records)
        return [self.spec.example(row, int(i), f"row {int(i)} of {self.where}") for i, row in zip(records, rows)]
