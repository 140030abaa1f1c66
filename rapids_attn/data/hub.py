"""Hub datasets: a ``data.path`` that is no file or folder but a Hugging Face hub dataset id, read through
``datasets.load_dataset``.

``data.path: rajpurkar/squad_v2`` (``owner/name``, or ``owner/name:config``) is loaded with
``datasets.load_dataset(repo, config, split=..., revision=...)`` (``data.config``, ``data.split``,
``data.revision``): downloaded once into the ``datasets`` cache (``HF_DATASETS_CACHE``, under ``HF_HOME``),
then read from it, offline too (``HF_HUB_OFFLINE=1``). Without ``data.split`` the split is the only one, or
``validation``; with several and no ``validation`` the choice is the user's.

Records become Examples two ways. A SQuAD-shaped dataset (columns ``id``, ``question``, ``context``,
``answers``; ``title`` too where given: ``rajpurkar/squad``, ``rajpurkar/squad_v2``) is read as SQuAD JSON is,
one example per question (question and context as a pair, group the title, label ``answerable`` /
``impossible``, the gold answers), under ``data.format: auto`` or ``squad``. Any other dataset (or ``data.format:
hf``, or any ``data.text_fields`` named) is read by the named fields, as a saved dataset folder is.

The driver loads the split once and keeps only what :class:`HubSource` holds: the id, and the paths of the cached
Arrow files the split is made of, which each worker memory-maps and reads its own rows from, with no call to the
hub. Workers on other nodes need the same cache at the same path (a shared ``HF_DATASETS_CACHE``).

The fingerprint (part of the store's extraction key) is the split's own ``datasets`` fingerprint, which ``datasets``
derives from the dataset's cached revision, configuration and split, with the id: a new revision of the dataset on
the hub is a different store, and the same cached revision gives the same key on every load.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rapids_attn.data.example import Example
from rapids_attn.data.fields import FieldSpec, FieldsSource, check_length, plain_text
from rapids_attn.data.linefiles import changed
from rapids_attn.errors import DataError

logger = logging.getLogger(__name__)

#: ``owner/name`` or ``owner/name:config``, with the characters the hub allows in a repository id
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?::(?P<config>[\w.-]+))?")

#: the columns of a SQuAD-shaped hub dataset (``title`` is read where given)
SQUAD_COLUMNS = ("id", "question", "context", "answers")

#: rows per batch in the driver's pass
BATCH_ROWS = 8192


def hub_id(path: str | os.PathLike[str]) -> tuple[str, str | None] | None:
    """(repository id, configuration or None) when ``path`` reads as a hub dataset id: ``owner/name`` or
    ``owner/name:config``, not absolute or dotted (``./x``), and not ending in a data file's suffix
    (``data/train.jsonl`` is a file that is missing, not a dataset). None otherwise. The caller checks first
    that no file or folder is there."""
    from rapids_attn.data.formats import SUFFIX_FORMATS

    text = os.fspath(path)
    m = HUB_ID.fullmatch(text)
    if m is None or Path(m["repo"]).suffix.lower() in SUFFIX_FORMATS:
        return None
    return m["repo"], m["config"]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _offline() -> bool:
    import datasets

    flags = (os.environ.get(v, "").upper() for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return bool(getattr(datasets.config, "HF_HUB_OFFLINE", False)) or any(
        f in ("1", "ON", "YES", "TRUE") for f in flags
    )


def load_split(repo: str, config: str | None, split: str | None, revision: str | None, log=logger):
    """The split of the hub dataset ``repo`` a job reads (a ``datasets.Dataset``) and its name; DataError in one line
    for a dataset that cannot be had (not on the hub, offline and not cached, no such configuration or split)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"data.path: reading the hub dataset {repo} needs the datasets library; pip install datasets"
        ) from None
    try:
        ds = datasets.load_dataset(repo, config, split=split, revision=revision)
    except (ConnectionError, FileNotFoundError) as e:
        raise _unavailable(repo, config, revision, e) from None
    except ValueError as e:
        text = str(e)
        if "split" in text.lower() and split is not None:
            raise DataError(
                f"data.split: the hub dataset {repo} has no split {split!r} ({_first_line(e)}); set data.split to "
                "one of its splits, or leave it out to read the only one (or validation)"
            ) from None
        if "config" in text.lower():
            raise DataError(
                f"data.config: the hub dataset {repo} cannot be read with configuration {config!r} "
                f"({_first_line(e)}); set data.config (or data.path: {repo}:<config>) to one it has"
            ) from None
        raise DataError(
            f"data.path: the hub dataset {repo} cannot be loaded with datasets.load_dataset ({_first_line(e)}); "
            "set data.path to a local file or folder, or to another hub dataset id"
        ) from None
    except OSError as e:
        if isinstance(e, PermissionError):
            raise DataError(
                f"data.path: cannot read the cached hub dataset {repo} ({_first_line(e)}); fix the permissions of "
                "the datasets cache (HF_DATASETS_CACHE)"
            ) from None
        raise _unavailable(repo, config, revision, e) from None
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        if not names:
            raise DataError(f"data.path: the hub dataset {repo} has no splits; point data.path at a dataset with data")
        split = _pick_split(repo, names)
        log.info("data.path: the hub dataset %s has splits %s; using split %r", repo, ", ".join(names), split)
        ds = ds[split]
    return ds, split


def _pick_split(repo: str, splits: list[str]) -> str:
    if len(splits) == 1:
        return splits[0]
    if "validation" in splits:
        return "validation"
    raise DataError(
        f"data.split: the hub dataset {repo} has splits {', '.join(repr(s) for s in splits)} and none named "
        f"'validation', so which to read is not clear; set data.split, e.g. data.split: {splits[0]}"
    )


def _unavailable(repo: str, config: str | None, revision: str | None, e: BaseException) -> DataError:
    what = (
        repo + (f" (configuration {config!r})" if config else "") + (f" at revision {revision!r}" if revision else "")
    )
    if _offline():
        return DataError(
            f"data.path: {repo} is no local file or folder, and the hub dataset {what} is not in the datasets cache "
            "while HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set; run once with network access (unset them) to "
            "download it, or set data.path to a local file or folder"
        )
    if isinstance(e, ConnectionError) and "not found" not in str(e).lower():
        return DataError(
            f"data.path: the hub dataset {what} could not be downloaded ({_first_line(e)}); check the network (or "
            "set HF_HUB_OFFLINE=1 to read a copy already in the datasets cache), or set data.path to a local file"
        )
    return DataError(
        f"data.path: {repo} is no local file or folder, and the hub has no dataset {what} that this user can read "
        f"({_first_line(e)}); set data.path to an existing file or folder, or to a hub dataset id owner/name (a "
        "gated or private one needs `hf auth login`)"
    )


def squad_shaped(columns: Sequence[str]) -> bool:
    return all(c in columns for c in SQUAD_COLUMNS)


@dataclass(frozen=True)
class HubSource(FieldsSource):
    """A hub dataset's split, as the ``datasets`` cache holds it: ``files``, the cached Arrow files it is made of
    (absolute), read by row number. ``spec`` None: SQuAD-shaped, one example per question."""

    path: str
    split: str
    files: tuple[str, ...]
    spec: FieldSpec | None = None
    #: SQuAD-shaped: the dataset has a ``title`` column (the examples' group)
    titles: bool = False

    @property
    def numbered(self) -> bool:
        return self.spec is not None and self.spec.id is None

    @property
    def pairs(self) -> bool:
        return self.spec is None or self.spec.pair is not None

    @property
    def where(self) -> str:
        return f"hub dataset {self.path} (split {self.split!r})"

    @classmethod
    def open(cls, path, spec, log=logger):  # the Source protocol's entry point; a hub id opens through hub_index
        raise NotImplementedError("a hub dataset is opened by rapids_attn.data.hub.hub_index")

    def columns(self) -> list[str]:
        if self.spec is not None:
            return self.spec.columns()
        return [*SQUAD_COLUMNS, *(["title"] if self.titles else [])]

    def _dataset(self):
        try:
            return _cached_split(self.files, tuple(self.columns()))
        except FileNotFoundError:
            raise DataError(
                f"data.path: the cached files of the {self.where} are gone ({self.files[0]}...); rerun the job, which "
                "loads the dataset again (workers on other nodes need the same HF_DATASETS_CACHE at the same path)"
            ) from None

    def example(self, row: dict, i: int) -> Example:
        where = f"row {i} of {self.where}"
        if self.spec is not None:
            return self.spec.example(row, i, where)
        question, context = row["question"], row["context"]
        for field, value in (("question", question), ("context", context)):
            if not isinstance(value, str):
                raise DataError(
                    f"data.path: {where} field {field!r} is a {type(value).__name__}, not text; read the dataset by "
                    "its fields instead (data.format: hf, data.text_fields)"
                )
        check_length(len(question) + len(context), where)
        answers = row["answers"] or {}
        texts = tuple(str(t) for t in answers.get("text") or ())
        starts = [s for s in answers.get("answer_start") or ()]
        ok = len(starts) == len(texts) and all(isinstance(s, int) and not isinstance(s, bool) for s in starts)
        title = row.get("title")
        return Example(
            id=plain_text(row["id"], where, "id", "data.id_field"),
            text=question,
            text_pair=context,
            group="" if title is None else str(title),
            label="answerable" if texts else "impossible",
            answers=texts,
            answer_starts=tuple(int(s) for s in starts) if ok else (),
        )

    def scan(self) -> Iterator[tuple[int, int, Example]]:
        """The driver's pass: every row validated (built as the worker will build it), batch by batch."""
        i = 0
        for batch in self._dataset().iter(batch_size=BATCH_ROWS):
            names = list(batch)
            for values in zip(*batch.values()):
                yield 0, 0, self.example(dict(zip(names, values)), i)
                i += 1

    def read(self, records: Sequence[int], seeks: Sequence = ()) -> list[Example]:
        ds = self._dataset()
        if len(records) and records[-1] >= len(ds):
            raise changed(self.path, int(records[-1]))
        return [self.example(row, int(i)) for i, row in zip(records, ds.select(records))]


@functools.lru_cache(maxsize=4)
def _cached_split(files: tuple[str, ...], columns: tuple[str, ...]):
    """The split made of the cached Arrow ``files`` (memory-mapped), its ``columns`` only; kept open per process, so
    a worker (or a view reading one example at a time) opens them once."""
    from datasets import Dataset, concatenate_datasets

    parts = [Dataset.from_file(f) for f in files]
    ds = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    return ds.select_columns(list(columns))


def open_hub(
    path: str,
    fmt: str,
    spec: FieldSpec | None,
    config: str | None = None,
    split: str | None = None,
    revision: str | None = None,
    log=logger,
) -> tuple[HubSource, str, str, list[str]]:
    """The source of the hub dataset ``path`` (``owner/name`` or ``owner/name:config``), the format it is read
    as (``squad`` or ``hf``), its fingerprint and its titles (SQuAD-shaped with a ``title`` column: the
    examples' groups, for the prefix warning; else empty). ``fmt``: ``data.format`` (auto, squad or hf);
    ``spec``: the named fields, None when the job names none."""
    parsed = hub_id(path)
    if parsed is None:
        raise ValueError(f"{path!r} is not a hub dataset id")
    repo, named = parsed
    if named and config and named != config:
        raise DataError(f"data.config: {config!r} and data.path {path} name two configurations; give it in one place")
    config = config or named
    ds, split = load_split(repo, config, split, revision, log)
    columns = list(ds.column_names)
    squad = fmt == "squad" or (fmt == "auto" and spec is None and squad_shaped(columns))
    if squad and not squad_shaped(columns):
        raise DataError(
            f"data.format: the hub dataset {path} has columns {', '.join(columns)}, not SQuAD's "
            f"({', '.join(SQUAD_COLUMNS)}); set data.format: hf and name its fields in data.text_fields"
        )
    files = tuple(str(Path(f["filename"]).absolute()) for f in ds.cache_files)
    if not files:
        raise DataError(
            f"data.path: the hub dataset {path} (split {split!r}) was loaded into memory, not into the datasets cache; "
            "unset HF_DATASETS_IN_MEMORY_MAX_SIZE so it is cached on disk"
        )
    titles = squad and "title" in columns
    source = HubSource(path, split, files, None if squad else spec or FieldSpec.make(None, None, None, None), titles)
    if not squad:
        source.spec.check_fields(columns, source.where)
    fingerprint = hashlib.sha256(
        json.dumps([repo, ds.info.config_name, split, ds._fingerprint]).encode()  # datasets' own, from its revision
    ).hexdigest()[:16]
    groups = [("" if t is None else str(t)) for t in ds.data.column("title").to_pylist()] if titles else []
    return source, "squad" if squad else "hf", fingerprint, groups
