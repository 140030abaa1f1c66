"""The dataset index: what the driver knows about the input, without holding it.

:func:`build_index` makes one streaming pass over the input: it validates every record (the same
rules and one-line messages as ever), counts the records, streams a 64-bit hash of each id into a
NumPy array to find duplicates (a hash seen twice is checked against the records themselves, so a
collision is never reported as a duplicate), and keeps, for line-based files, the byte offset and
line number every :data:`CHECKPOINT_EVERY` records. Then it applies the seeded ``sample`` and
``limit`` to record numbers, exactly as :func:`rapids_attn.data.readers.select` does to a list.

The result, a :class:`DataIndex`, holds per record at most the selected record numbers (none
without ``sample``). :meth:`DataIndex.rows` describes a run of positions as :class:`Rows`: a small
picklable value (source, record numbers, seek points) that a worker reads itself. SQuAD's single
JSON document is read whole in the driver, and its examples, like the generated probes, travel
inline.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.data.formats import Source
from rapids_attn.data.linefiles import LineSource, Seek, changed
from rapids_attn.errors import DataError

# Source (a record source: where the file is and how its records become Examples; small, picklable) is the protocol
# every registered format's source follows: rapids_attn.data.formats

#: records between two seek points of a line-based file: a worker reads at most this many extra records
CHECKPOINT_EVERY = 256


def select_positions(n: int, limit: int | None = None, sample: int | None = None, seed: int = 0):
    """The record numbers (ascending) that the seeded ``sample`` and then ``limit`` keep of ``n``: a
    ``range`` without ``sample``, else a NumPy array. The same draw as :func:`readers.select`."""
    for name, value in (("sample", sample), ("limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DataError(
                f"data.{name}: must be a positive integer, got {value!r}; "
                f"set data.{name} to a number >= 1 or leave it unset"
            )
    keep: range | np.ndarray = range(n)
    if sample is not None and sample < n:
        rng = np.random.default_rng(seed)
        keep = np.sort(rng.choice(n, size=sample, replace=False))
    if limit is not None:
        keep = keep[:limit]
    return keep


def prefix_warning(groups: Sequence[str], kept: int, what: str = "examples") -> str | None:
    """A warning when ``data.limit`` (without ``sample``) keeps the first ``kept`` records of a file whose
    ``groups`` come in runs (SQuAD's articles): a prefix then covers far fewer groups than a random draw
    of the same size would (less than half the expected number, computed exactly from the group sizes),
    and statistics by group describe a handful of them."""
    n = len(groups)
    if not 0 < kept < n:
        return None
    sizes = np.unique(np.asarray(groups, dtype=object), return_counts=True)[1].astype(float)
    if len(sizes) < 2:
        return None
    from scipy.special import gammaln

    def log_choose(a, b):
        return gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1)

    # E[groups hit by a draw of `kept` without replacement] = sum over groups of 1 - P(none of it drawn)
    missed = np.where(n - sizes >= kept, np.exp(log_choose(n - sizes, kept) - log_choose(n, kept)), 0.0)
    expected = float(np.sum(1.0 - missed))
    got = len(set(groups[:kept]))
    if got >= 0.5 * expected:
        return None
    return (
        f"data.limit keeps the first {kept:,} of {n:,} {what} in file order: they come from {got} of {len(sizes):,} "
        f"groups, where a random draw would cover about {expected:.0f}; set data.sample: {kept} (a seeded draw) "
        "for a selection that represents the file"
    )


@dataclass(frozen=True, eq=False)
class Rows:
    """Examples described, not held: the file records numbered ``records`` (ascending), each read forward
    from the nearest of ``seeks``, followed by the ``inline`` examples. What a shard task carries."""

    source: Source | None
    records: range | np.ndarray = range(0)
    seeks: tuple[Seek, ...] = ()
    inline: tuple[Example, ...] = ()

    def __len__(self) -> int:
        return len(self.records) + len(self.inline)

    def read(self) -> list[Example]:
        out = self.source.read(self.records, self.seeks) if len(self.records) else []
        if len(out) != len(self.records):
            raise changed(self.source.path, int(self.records[len(out)]))
        return [*out, *self.inline]


@dataclass(frozen=True, eq=False)
class DataIndex:
    """The run's examples, by position: the selected records of the file, then the inline examples."""

    path: Path
    format: str
    source: Source | None
    #: records in the file, before sample and limit
    n_records: int
    #: the file's records this run uses, ascending
    records: range | np.ndarray
    #: line-based files: (offset, line) before record ``b * every``, for each block b; else None
    checkpoints: np.ndarray | None = None
    every: int = CHECKPOINT_EVERY
    #: examples after the file's: SQuAD's (read whole), then the probes
    inline: tuple[Example, ...] = ()
    #: the examples are text pairs
    pairs: bool = False
    #: SHA-256 of the input's content (:func:`rapids_attn.data.fingerprint.content_fingerprint`); part of the
    #: extraction key, so an edited dataset at the same path is a different store
    fingerprint: str = ""
    #: what the user should know about the selection (one line each; the pipeline prints them)
    warnings: tuple[str, ...] = ()
    #: the file's records with no text (:func:`no_text`), ascending (Parquet's from ParquetSource.empty_rows)
    empty_records: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.records) + len(self.inline)

    def first_without_text(self) -> tuple[int, Example, int] | None:
        """The first example this run reads that has no text, as (its position in the run, the example, how
        many such examples the run reads), or None."""
        inline = [i for i, ex in enumerate(self.inline) if no_text(ex)]
        empty = np.asarray(self.empty_records, dtype=np.int64)  # ascending
        if not len(empty):
            picked = np.zeros(0, dtype=np.int64)
        elif isinstance(self.records, range):  # no array of every record: positions from the range's bounds
            r = self.records
            hits = empty[(empty >= r.start) & (empty < r.stop) & ((empty - r.start) % r.step == 0)]
            picked = (hits - r.start) // r.step
        else:
            picked = np.flatnonzero(np.isin(self.records, empty))
        count = len(picked) + len(inline)
        if not count:
            return None
        pos = int(picked[0]) if len(picked) else len(self.records) + inline[0]
        return pos, self.read([pos])[0], count

    def with_inline(self, examples: Iterable[Example]) -> DataIndex:
        """This index with ``examples`` appended (the probes)."""
        return dataclasses.replace(self, inline=(*self.inline, *examples))

    def subset(self, positions: Sequence[int]) -> DataIndex:
        """This index keeping only the examples at ``positions`` (ascending), in that order: the file's records
        stay records a worker reads itself, the inline examples stay inline (the fine-tune's held-out split)."""
        pos = np.asarray(positions, dtype=np.int64)
        nf = len(self.records)
        if len(pos) and (np.any(np.diff(pos) <= 0) or pos[0] < 0 or pos[-1] >= len(self)):
            raise ValueError("subset positions must be ascending, distinct and inside the index")
        file_pos = pos[pos < nf]
        records = np.asarray(self.records, dtype=np.int64)[file_pos] if len(file_pos) else range(0)
        inline = tuple(self.inline[int(p) - nf] for p in pos[pos >= nf])
        return dataclasses.replace(self, records=records, inline=inline)

    def seeks(self, records) -> tuple[Seek, ...]:
        """The seek points a reader of ``records`` (ascending) needs: one per block they fall in."""
        if self.checkpoints is None or not len(records):
            return ()
        if isinstance(records, range):
            blocks = range(records[0] // self.every, records[-1] // self.every + 1)
        else:
            blocks = np.unique(np.asarray(records) // self.every)
        return tuple((int(b) * self.every, int(self.checkpoints[b, 0]), int(self.checkpoints[b, 1])) for b in blocks)

    def rows(self, start: int, stop: int) -> Rows:
        """Positions ``start`` to ``stop`` as :class:`Rows` (a shard's task carries them)."""
        nf = len(self.records)
        records = self.records[min(start, nf) : min(stop, nf)]
        inline = self.inline[max(start - nf, 0) : max(stop - nf, 0)]
        return Rows(self.source, records, self.seeks(records), tuple(inline))

    def read(self, positions: Iterable[int]) -> list[Example]:
        """The examples at ``positions`` (any order), reading only those records of the file."""
        positions = [int(p) for p in positions]
        nf, n = len(self.records), len(self)
        for p in positions:
            if not 0 <= p < n:
                raise IndexError(f"example position {p} out of range (the run has {n} examples)")
        wanted = sorted({p for p in positions if p < nf})
        records = np.asarray([self.records[p] for p in wanted], dtype=np.int64)
        found = dict(zip(wanted, Rows(self.source, records, self.seeks(records)).read())) if wanted else {}
        return [found[p] if p < nf else self.inline[p - nf] for p in positions]

    def examples(self) -> Examples:
        """A read-only sequence view: ``view[i]`` reads example i alone (with a small cache)."""
        return Examples(self)


class Examples(Sequence):
    """The run's examples as a sequence that reads only the ones indexed (head views, tools)."""

    CACHE = 64

    def __init__(self, index: DataIndex) -> None:
        self.index = index
        self._cache: dict[int, Example] = {}

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.index.read(range(len(self))[i])
        i = int(i)
        if i < 0:
            i += len(self)
        if i not in self._cache:
            if len(self._cache) >= self.CACHE:
                self._cache.clear()
            self._cache[i] = self.index.read([i])[0]
        return self._cache[i]


# ---------------------------------------------------------------------------------------- the pass


def scan(
    source: Source, path: Path, every: int = CHECKPOINT_EVERY, collect: list | None = None, empty: list | None = None
):
    """One pass: (record count, checkpoints or None, id hashes or None). A source's pass yields each record's
    Example (line files, HF) or only its id (Parquet); ``collect``, if given, receives the Examples, and
    otherwise each is dropped once its id is hashed; ``empty``, if given, receives the record numbers of the
    Examples with no text (:func:`no_text`)."""
    lines = isinstance(source, LineSource)
    marks = array("q")
    hashes = None if source.numbered else array("q")
    n = 0
    try:
        for offset, line, item in source.scan():
            if lines and n % every == 0:
                marks.append(offset)
                marks.append(line)
            if isinstance(item, Example):
                if collect is not None:
                    collect.append(item)
                if empty is not None and no_text(item):
                    empty.append(n)
                item = item.id
            if hashes is not None:
                hashes.append(hash(item))
            n += 1
    except PermissionError as e:
        raise DataError(f"data.path: cannot read {path} ({e.strerror}); fix its permissions") from None
    checkpoints = np.frombuffer(marks, dtype=np.int64).reshape(-1, 2).copy() if lines else None
    return n, checkpoints, hashes


def no_text(ex: Example) -> bool:
    """The example's text (and pair) are empty: a tokenizer that adds no special tokens (GPT-2's) reads it as
    no tokens, and there is no attention to capture."""
    return not ex.text and not ex.text_pair


def check_unique(index: DataIndex, hashes) -> None:
    """DataError naming the first duplicate id (records j and i, as a list's first repeat): records whose id
    hash is seen twice are read again and compared by id."""
    if hashes is None or len(hashes) < 2:
        return
    h = np.frombuffer(hashes, dtype=np.int64)
    s = np.sort(h)
    repeated = s[1:][s[1:] == s[:-1]]
    del s
    if not len(repeated):
        return
    candidates = np.flatnonzero(np.isin(h, repeated))
    first: dict[str, int] = {}
    for rec, ex in zip(candidates, Rows(index.source, candidates, index.seeks(candidates)).read()):
        j = first.setdefault(ex.id, int(rec))
        if j != rec:
            raise duplicate(ex.id, index.path, j, int(rec))


def duplicate(ex_id: str, path, j: int, i: int) -> DataError:
    return DataError(
        f"data.path: duplicate id {ex_id!r} in {path} (records {j} and {i}, counting from 0); ids must be "
        f"unique: set data.id_field to a unique field or leave it unset to number the records"
    )
