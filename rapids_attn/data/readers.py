"""Read a dataset file (or a saved HuggingFace dataset) into a list of :class:`Example` records.

One public entry point, :func:`read_examples`, picks a reader by ``format`` (or by the path when
``format="auto"``), then applies the checks every dataset must pass (at least one example, unique ids,
because outputs are keyed by id) and finally the optional seeded ``sample`` and ``limit``.

Every problem with the input raises :class:`DataError` with one line that names the file, the line or
record, the field, and the job setting to change. Readers load the whole dataset into memory: the job
runs a transformer over every example, so the datasets are small compared to the work done on them.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError

logger = logging.getLogger(__name__)

FORMATS = ("auto", "squad", "jsonl", "csv", "text", "hf")

# File suffix -> format, used when format="auto".
_SUFFIX_FORMATS = {
    ".json": "squad",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
}
# Files that `datasets` `save_to_disk` writes: state.json / dataset_info.json for a Dataset,
# dataset_dict.json at the top of a DatasetDict (its splits sit in sub-directories).
_HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def read_examples(
    path: str | os.PathLike[str],
    format: str = "auto",
    text_fields: Sequence[str] | str | None = None,
    id_field: str | None = None,
    group_field: str | None = None,
    label_field: str | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[Example]:
    """Read ``path`` into Examples, in file order.

    format:      "auto" | "squad" | "jsonl" | "csv" | "text" | "hf" (see :func:`detect_format`).
    text_fields: 1 or 2 field names for jsonl/csv/hf (first -> text, second -> text_pair);
                 default ["text"]. Ignored by squad and text, whose layout is fixed.
    id_field:    field holding a unique id; default: the 0-based record index as a string.
    group_field, label_field: optional fields copied (with str()) into Example.group / .label.
    sample:      keep a seeded random subset of this many examples, in their original order.
    limit:       keep the first ``limit`` examples (after ``sample`` when both are given).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"data.path: no such file or directory: {path}; set data.path to an existing file")
    if format not in FORMATS:
        raise DataError(f"data.format: unknown format {format!r}; use one of {', '.join(FORMATS)}")
    fmt = detect_format(path) if format == "auto" else format
    if (fmt == "hf") != path.is_dir():
        want = "a directory written by datasets' save_to_disk" if fmt == "hf" else "a file"
        raise DataError(
            f"data.path: {path} is not {want}, as data.format {fmt!r} needs; set data.path or data.format to match"
        )

    try:
        if fmt == "squad":
            examples = read_squad(path)
        elif fmt == "text":
            examples = read_text(path)
        else:
            spec = _FieldSpec.make(text_fields, id_field, group_field, label_field)
            readers = {"jsonl": read_jsonl, "csv": read_csv, "hf": read_hf}
            examples = readers[fmt](path, spec)
    except PermissionError as e:
        raise DataError(f"data.path: cannot read {path} ({e.strerror}); fix its permissions") from None

    if not examples:
        raise DataError(f"data.path: {path} holds no examples; point data.path at a non-empty dataset")
    _check_unique_ids(examples, path)
    return select(examples, limit=limit, sample=sample, seed=seed)


def detect_format(path: Path) -> str:
    """Guess the format from a directory's HF marker files or a file's suffix."""
    if path.is_dir():
        if any((path / name).is_file() for name in _HF_MARKERS):
            return "hf"
        raise DataError(
            f"data.path: {path} is a directory but not a saved HuggingFace dataset "
            f"(no {' / '.join(_HF_MARKERS)}); point data.path at a dataset file or a "
            f"save_to_disk directory"
        )
    fmt = _SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(
            f"data.format: cannot tell the format of {path} from its suffix "
            f"{path.suffix or '(none)'!r}; set data.format to one of "
            f"{', '.join(FORMATS[1:])}"
        )
    return fmt


def select(
    examples: list[Example], limit: int | None = None, sample: int | None = None, seed: int = 0
) -> list[Example]:
    """Apply the seeded ``sample`` (original order kept), then ``limit``."""
    for name, value in (("sample", sample), ("limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DataError(
                f"data.{name}: must be a positive integer, got {value!r}; "
                f"set data.{name} to a number >= 1 or leave it unset"
            )
    if sample is not None and sample < len(examples):
        rng = np.random.default_rng(seed)
        keep = np.sort(rng.choice(len(examples), size=sample, replace=False))
        examples = [examples[i] for i in keep]
    if limit is not None:
        examples = examples[:limit]
    return examples


# --------------------------------------------------------------------------------------------- squad


def read_squad(path: Path) -> list[Example]:
    """SQuAD 1.1 / 2.0 JSON: one Example per question (text=question, text_pair=context)."""
    root = _load_json(path)
    articles = root.get("data") if isinstance(root, dict) else None
    if not isinstance(articles, list):
        raise DataError(
            f"data.path: {path} has no top-level 'data' list, so it is not SQuAD JSON; "
            f"for one JSON record per line name the file .jsonl or set data.format: jsonl"
        )
    examples = []
    for a, article in enumerate(articles):
        where = f"data[{a}]"
        paragraphs = _squad_get(article, "paragraphs", list, path, where)
        title = article.get("title")
        group = "" if title is None else str(title)
        for p, paragraph in enumerate(paragraphs):
            pwhere = f"{where}.paragraphs[{p}]"
            context = _squad_get(paragraph, "context", str, path, pwhere)
            for q, qa in enumerate(_squad_get(paragraph, "qas", list, path, pwhere)):
                qwhere = f"{pwhere}.qas[{q}]"
                question = _squad_get(qa, "question", str, path, qwhere)
                qid = _squad_get(qa, "id", (str, int), path, qwhere)
                impossible = qa.get("is_impossible", False)  # SQuAD 1.1 has no is_impossible
                label = "impossible" if impossible else "answerable"
                examples.append(Example(id=str(qid), text=question, text_pair=context, group=group, label=label))
    return examples


def _squad_get(node: Any, key: str, kind: type | tuple[type, ...], path: Path, where: str) -> Any:
    """node[key], checked to be of ``kind``; DataError naming the JSON location otherwise."""
    if not isinstance(node, dict):
        raise DataError(
            f"data.path: {where} in {path} is a {type(node).__name__}, not an object; "
            f"fix the file so it follows the SQuAD JSON layout"
        )
    if key not in node:
        raise DataError(
            f"data.path: {where} in {path} has no {key!r}; fix the file so it follows the SQuAD JSON layout"
        )
    value = node[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(
            f"data.path: {where}.{key} in {path} is a {type(value).__name__}; "
            f"fix the file so it follows the SQuAD JSON layout"
        )
    return value


def _load_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8-sig") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        hint = "fix the JSON"
        if e.msg == "Extra data":
            hint = "if it holds one JSON record per line, name it .jsonl or set data.format: jsonl"
        raise DataError(f"data.path: line {e.lineno} of {path} is not valid JSON ({e.msg}); {hint}") from None
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None


# ------------------------------------------------------------------------------------- record files


class _FieldSpec:
    """Which record fields feed an Example (jsonl, csv and hf share this)."""

    def __init__(self, text: str, pair: str | None, id: str | None, group: str | None, label: str | None) -> None:
        self.text, self.pair, self.id, self.group, self.label = text, pair, id, group, label

    @classmethod
    def make(
        cls,
        text_fields: Sequence[str] | str | None,
        id_field: str | None,
        group_field: str | None,
        label_field: str | None,
    ) -> _FieldSpec:
        fields = ["text"] if text_fields is None else text_fields
        if isinstance(fields, str):
            fields = [fields]
        fields = list(fields)
        if not 1 <= len(fields) <= 2 or not all(isinstance(f, str) and f for f in fields):
            raise DataError(
                f"data.text_fields: must list 1 or 2 field names, got {text_fields!r}; "
                f"e.g. [question] or [question, context]"
            )
        return cls(fields[0], fields[1] if len(fields) == 2 else None, id_field, group_field, label_field)

    def required(self) -> list[tuple[str, str]]:
        """(field, setting that names it) for every field each record must have."""
        named = [
            (self.text, "data.text_fields"),
            (self.pair, "data.text_fields"),
            (self.id, "data.id_field"),
            (self.group, "data.group_field"),
            (self.label, "data.label_field"),
        ]
        return [(field, setting) for field, setting in named if field is not None]

    def check_fields(self, present: Iterable[str], where: str) -> None:
        """DataError if a named field is absent; the message lists the fields that exist."""
        present = list(present)
        for field, setting in self.required():
            if field not in present:
                raise DataError(
                    f"data.path: {where} has no field {field!r}; set {setting} to a field "
                    f"that exists (found: {', '.join(map(str, present)) or 'none'})"
                )

    def example(self, record: Mapping[str, Any], index: int, where: str) -> Example:
        """Build the Example for record number ``index`` (0-based); ``where`` locates it in messages."""
        self.check_fields(record.keys(), where)
        text = _text_value(record, self.text, where)
        pair = None if self.pair is None else _text_value(record, self.pair, where)
        if self.id is None:
            ex_id = str(index)
        else:
            value = record[self.id]
            if value is None or value == "":
                raise DataError(
                    f"data.path: {where} has an empty id in field {self.id!r}; "
                    f"give every record an id or leave data.id_field unset"
                )
            ex_id = str(value)
        return Example(
            id=ex_id,
            text=text,
            text_pair=pair,
            group=_plain_value(record, self.group),
            label=_plain_value(record, self.label),
        )


def _text_value(record: Mapping[str, Any], field: str, where: str) -> str:
    value = record[field]
    if value is None or isinstance(value, (dict, list, tuple)):
        kind = "empty" if value is None else f"a {type(value).__name__}, not text"
        raise DataError(f"data.path: {where} field {field!r} is {kind}; set data.text_fields to fields that hold text")
    return value if isinstance(value, str) else str(value)


def _plain_value(record: Mapping[str, Any], field: str | None) -> str:
    if field is None or record[field] is None:
        return ""
    return str(record[field])


def read_jsonl(path: Path, spec: _FieldSpec) -> list[Example]:
    """JSON Lines: one JSON object per line; blank lines are skipped."""
    examples = []
    try:
        with open(path, encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"line {lineno} of {path}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"data.path: {where} is not valid JSON ({e.msg}); fix or remove that line"
                    ) from None
                if not isinstance(record, dict):
                    raise DataError(
                        f"data.path: {where} is a JSON {type(record).__name__}, not an "
                        f"object; write one JSON object per line"
                    )
                examples.append(spec.example(record, len(examples), where))
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None
    return examples


def read_csv(path: Path, spec: _FieldSpec) -> list[Example]:
    """CSV with a header row (TSV when the suffix is .tsv); blank lines are skipped."""
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    examples = []
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter=delimiter)
            if reader.fieldnames is None:  # empty file
                return []
            spec.check_fields(reader.fieldnames, f"the header (line 1) of {path}")
            for row in reader:
                where = f"line {reader.line_num} of {path}"
                if None in row or any(v is None for v in row.values()):
                    raise DataError(
                        f"data.path: {where} has a different number of columns than the "
                        f"header ({len(reader.fieldnames)}); fix that row"
                    )
                examples.append(spec.example(row, len(examples), where))
    except csv.Error as e:
        raise DataError(f"data.path: line {reader.line_num} of {path} is not valid CSV ({e}); fix that row") from None
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None
    return examples


def read_text(path: Path) -> list[Example]:
    """Plain text: one Example per non-empty line (stripped); id = 1-based line number."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return [
                Example(id=str(lineno), text=line.strip()) for lineno, line in enumerate(f, start=1) if line.strip()
            ]
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None


def read_hf(path: Path, spec: _FieldSpec) -> list[Example]:
    """A directory written by ``datasets`` ``save_to_disk`` (Dataset or DatasetDict)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"data.format: reading {path} as a HuggingFace dataset needs the datasets library; pip install datasets"
        ) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(
            f"data.path: {path} cannot be loaded with datasets.load_from_disk ({reason}); "
            f"point data.path at a directory written by save_to_disk"
        ) from None
    where = f"dataset {path}"
    if isinstance(ds, datasets.DatasetDict):
        if not ds:
            return []
        split = "validation" if "validation" in ds else next(iter(ds))
        logger.info("data.path: %s is a DatasetDict with splits %s; using split %r", path, ", ".join(ds), split)
        ds = ds[split]
        where = f"dataset {path} (split {split!r})"
    spec.check_fields(ds.column_names, where)
    return [spec.example(row, i, f"row {i} of {where}") for i, row in enumerate(ds)]


# ------------------------------------------------------------------------------------------ checks


def _check_unique_ids(examples: list[Example], path: Path) -> None:
    first: dict[str, int] = {}
    for i, ex in enumerate(examples):
        j = first.setdefault(ex.id, i)
        if j != i:
            raise DataError(
                f"data.path: duplicate id {ex.id!r} in {path} (records {j} and {i}, "
                f"counting from 0); ids must be unique: set data.id_field to a unique "
                f"field or leave it unset to number the records"
            )


def _not_utf8(path: Path, e: UnicodeDecodeError) -> DataError:
    return DataError(f"data.path: {path} is not UTF-8 text (bad byte at offset {e.start}); re-save the file as UTF-8")
