"""Read a dataset: index it in the driver (:func:`build_index`), or read it whole (:func:`read_examples`).

:func:`build_index` picks a reader by ``format`` (or by the path when ``format="auto"``), makes one
streaming pass that validates every record and applies the checks every dataset must pass (at
least one example, unique ids, because outputs are keyed by id), and then the optional seeded
``sample`` and ``limit`` (:mod:`rapids_attn.data.index`). The job's driver keeps only that index;
each worker reads its own rows. :func:`read_examples` returns every selected example as a list, for
tests and tools.

Every problem with the input raises :class:`DataError` with one line that names the file, the line or
record, the field, and the job setting to change.

Inputs are bounded before they are expensive: a record whose text (text and pair together; a SQuAD question
and its paragraph, or an article's joined paragraphs) holds more than
:data:`rapids_attn.data.fields.MAX_TEXT_CHARS` (1,000,000) characters is refused while indexing, before
anything is tokenized; a line-based file's record over :data:`rapids_attn.data.linefiles.MAX_RECORD_BYTES` is
refused before it is parsed; JSON nested too deeply for Python's parser is refused, naming the line. What each
format refuses besides: :mod:`rapids_attn.data.linefiles` (JSONL, CSV, text) and :mod:`rapids_attn.data.tables`
(Parquet, saved HF datasets, and which split of a DatasetDict is read).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapids_attn.data.example import Example
from rapids_attn.data.fields import FieldSpec, check_length
from rapids_attn.data.fingerprint import changed_while_reading
from rapids_attn.data.fingerprint import stamp as data_stamp
from rapids_attn.data.formats import FORMATS, REGISTRY, SUFFIX_FORMATS, Format, folder_formats
from rapids_attn.data.hub import hub_id, open_hub
from rapids_attn.data.index import (
    CHECKPOINT_EVERY,
    DataIndex,
    check_unique,
    duplicate,
    prefix_warning,
    scan,
    select_positions,
)
from rapids_attn.data.linefiles import not_utf8, too_deep
from rapids_attn.errors import DataError

logger = logging.getLogger(__name__)

# The formats, their sources, suffixes, marker files and fingerprint rules: rapids_attn.data.formats (one
# registration each). FORMATS ("auto", then every registered format) stays importable from here.


def build_index(
    path: str | os.PathLike[str],
    format: str = "auto",
    text_fields: Sequence[str] | str | None = None,
    id_field: str | None = None,
    group_field: str | None = None,
    label_field: str | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    collect: list[Example] | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
    squad_unit: str = "question",
    *,
    config: str | None = None,
    split: str | None = None,
    revision: str | None = None,
) -> DataIndex:
    """Index ``path``: validate and count every record, check ids are unique, apply ``sample`` and ``limit``.

    format:      "auto" or a registered format (:data:`rapids_attn.data.formats.FORMATS`: "squad" | "jsonl" |
                 "csv" | "text" | "parquet" | "hf"; see :func:`detect_format`).
    text_fields: 1 or 2 field names for jsonl/csv/parquet/hf (first -> text, second -> text_pair);
                 default ["text"]. Ignored by squad and text, whose layout is fixed.
    id_field:    field holding a unique id; default: the 0-based record index as a string.
    group_field, label_field: optional fields copied (with str()) into Example.group / .label.
    sample:      keep a seeded random subset of this many examples, in their original order.
    limit:       keep the first ``limit`` examples (after ``sample`` when both are given).
    squad_unit:  SQuAD JSON: one example per ``question`` (the question and its paragraph, a pair), or per
                 ``article`` (its paragraphs' contexts joined into one long document, no question).
    collect:     a list that receives every record's Example when the pass builds them anyway (all
                 formats but Parquet): :func:`read_examples` reads the file once that way.
    checkpoint_every: records between the seek points kept for line-based files.
    config, split, revision: a hub dataset id's configuration, split and revision (:mod:`rapids_attn.data.hub`).

    A ``path`` that is no file or folder but reads as a hub dataset id (``owner/name``, ``owner/name:config``)
    is loaded with ``datasets.load_dataset`` (:mod:`rapids_attn.data.hub`).
    """
    path = Path(path)
    hub = {"config": config, "split": split, "revision": revision}
    if not path.exists():
        if hub_id(path) is not None:
            named = (text_fields, id_field, group_field, label_field)
            return _hub_index(path, format, named, (limit, sample, seed), collect, squad_unit, hub)
        raise DataError(
            f"data.path: no such file or directory: {path}; set data.path to an existing file, or to a hub dataset id "
            "(owner/name)"
        )
    for name, value in hub.items():
        if value is not None:
            raise DataError(
                f"data.{name}: applies to a hub dataset id in data.path, and {path} is a local file or folder; leave "
                f"data.{name} out"
            )
    if not (path.is_file() or path.is_dir()):  # a pipe would block the pass, a device never end it
        raise DataError(
            f"data.path: {path} is not a regular file or folder (a pipe, device or socket); write the data to a file "
            "and set data.path to it"
        )
    if format not in FORMATS:
        raise DataError(f"data.format: unknown format {format!r}; use one of {', '.join(FORMATS)}")
    fmt = detect_format(path) if format == "auto" else format
    registered = REGISTRY[fmt]
    if bool(registered.folder) != path.is_dir():
        want = registered.folder or "a file"
        raise DataError(
            f"data.path: {path} is not {want}, as data.format {fmt!r} needs; set data.path or data.format to match"
        )
    select_positions(0, limit=limit, sample=sample)  # the settings' own checks, before the pass

    if squad_unit != "question" and fmt != "squad":
        raise DataError(
            f"data.squad_unit: {squad_unit!r} applies to SQuAD JSON only, and {path} is read as {fmt}; "
            "leave squad_unit out for this file"
        )
    stamped = data_stamp(path)
    if registered.source is None:  # SQuAD, read whole
        try:
            examples = read_squad(path, squad_unit)
        except PermissionError as e:
            raise DataError(f"data.path: cannot read {path} ({e.strerror}); fix its permissions") from None
        _empty(len(examples), path)
        _check_unique_ids(examples, path)
        digest = _fingerprint(path, registered, stamped)
        keep = select_positions(len(examples), limit=limit, sample=sample, seed=seed)
        inline = tuple(examples[i] for i in keep)
        warn = None if sample is not None else prefix_warning([e.group for e in examples], len(keep), "questions")
        return DataIndex(
            path,
            fmt,
            None,
            len(examples),
            range(0),
            inline=inline,
            pairs=squad_unit == "question",
            fingerprint=digest,
            warnings=(warn,) if warn else (),
        )

    try:
        source = _open_source(path, registered, text_fields, id_field, group_field, label_field)
    except PermissionError as e:
        raise DataError(f"data.path: cannot read {path} ({e.strerror}); fix its permissions") from None
    no_text: list[int] = []
    n, checkpoints, hashes = (
        (0, None, None) if source is None else scan(source, path, checkpoint_every, collect, no_text)
    )
    if hasattr(source, "empty_rows"):  # Parquet's pass reads ids only: its empty texts from their columns
        no_text.extend(source.empty_rows())
    _empty(n, path)
    digest = _fingerprint(path, registered, stamped)
    index = DataIndex(
        path,
        fmt,
        source,
        n,
        range(n),
        checkpoints,
        checkpoint_every,
        pairs=source.pairs,
        fingerprint=digest,
        empty_records=tuple(no_text),
    )
    check_unique(index, hashes)
    del hashes
    return dataclasses.replace(index, records=select_positions(n, limit=limit, sample=sample, seed=seed))


def _hub_index(
    path: Path, format: str, named: tuple, selection: tuple, collect, squad_unit: str, hub: dict
) -> DataIndex:
    """:func:`build_index` for a hub dataset id (:mod:`rapids_attn.data.hub`): SQuAD-shaped or read by fields.
    ``named``: (text_fields, id_field, group_field, label_field); ``selection``: (limit, sample, seed); ``hub``: the
    config, split and revision."""
    limit, sample, seed = selection
    if format not in ("auto", "squad", "hf"):
        raise DataError(
            f"data.format: {format!r} reads a local file, and {path} is a hub dataset id; set data.format to auto, "
            "squad (a SQuAD-shaped dataset) or hf (read by data.text_fields)"
        )
    if squad_unit != "question":
        raise DataError(
            f"data.squad_unit: {squad_unit!r} applies to SQuAD JSON files only, and {path} is a hub dataset id; leave "
            "squad_unit out"
        )
    select_positions(0, limit=limit, sample=sample)  # the settings' own checks, before the download
    spec = None if all(v is None for v in named) else FieldSpec.make(*named)
    source, fmt, digest, groups = open_hub(str(path), format, spec, **hub, log=logger)
    no_text: list[int] = []
    n, _, hashes = scan(source, path, CHECKPOINT_EVERY, collect, no_text)
    _empty(n, path)
    index = DataIndex(
        path, fmt, source, n, range(n), pairs=source.pairs, fingerprint=digest, empty_records=tuple(no_text)
    )
    check_unique(index, hashes)
    del hashes
    keep = select_positions(n, limit=limit, sample=sample, seed=seed)
    warn = None if sample is not None or not groups else prefix_warning(groups, len(keep), "questions")
    return dataclasses.replace(index, records=keep, warnings=(warn,) if warn else ())


def index_for(d, whole: bool = False) -> DataIndex:
    """:func:`build_index` for a job's ``data`` section (:class:`rapids_attn.job.DataConfig`); ``whole``: every
    record of the file, its ``sample`` and ``limit`` left out (the fine-tune's split is made on the whole file)."""
    return build_index(
        d.path,
        format=d.format,
        text_fields=d.text_fields,
        id_field=d.id_field,
        group_field=d.group_field,
        label_field=d.label_field,
        limit=None if whole else d.limit,
        sample=None if whole else d.sample,
        seed=d.seed,
        squad_unit=d.squad_unit,
        config=d.config,
        split=d.split,
        revision=d.revision,
    )


def _fingerprint(path: Path, fmt: Format, stamped: tuple) -> str:
    """The content hash of the input by its format's rule, refused if it changed since indexing began (the index
    and the hash must describe the same bytes)."""
    digest = fmt.fingerprint(path)
    if data_stamp(path) != stamped:
        raise changed_while_reading(path)
    return digest


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
    **hub: str | None,
) -> list[Example]:
    """Every selected example of ``path`` as a list, in file order (arguments as :func:`build_index`; ``hub``: its
    ``config``, ``split`` and ``revision``).

    Holds the whole dataset in memory: for tests, tools and small data. A job's driver keeps only the
    index, and its workers read their own rows."""
    every: list[Example] = []
    index = build_index(
        path, format, text_fields, id_field, group_field, label_field, limit, sample, seed, every, **hub
    )
    if index.source is None:  # SQuAD: read whole, already selected
        return list(index.inline)
    if len(every) == index.n_records:  # the pass built them all: no second read
        return [every[i] for i in index.records]
    del every
    return index.read(range(len(index)))


def _open_source(path: Path, fmt: Format, text_fields, id_field, group_field, label_field):
    """The format's source (None: it holds nothing); the header or schema is checked here. Its path is
    absolute: workers started elsewhere (another node, another folder) read the same file."""
    path = path.absolute()
    spec = FieldSpec.make(text_fields, id_field, group_field, label_field) if fmt.fields else None
    return fmt.source.open(path, spec, logger)


def _empty(n: int, path: Path) -> None:
    if not n:
        raise DataError(f"data.path: {path} holds no examples; point data.path at a non-empty dataset")


def detect_format(path: Path) -> str:
    """Guess the format from a directory's marker files (a folder format's) or a file's suffix."""
    if path.is_dir():
        folders = folder_formats()
        for f in folders:
            if any((path / name).is_file() for name in f.markers):
                return f.name
        raise DataError(
            f"data.path: {path} is a directory but not {' or '.join(f.folder_name for f in folders)} "
            f"(no {' / '.join(m for f in folders for m in f.markers)}); point data.path at a dataset file or a "
            f"save_to_disk directory"
        )
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
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
    return [examples[i] for i in select_positions(len(examples), limit=limit, sample=sample, seed=seed)]


# --------------------------------------------------------------------------------------------- squad


def read_squad(path: Path, unit: str = "question") -> list[Example]:
    """SQuAD 1.1 / 2.0 JSON: one Example per question (text=question, text_pair=context), or with ``unit``
    ``article`` one per article: its paragraphs' contexts joined by blank lines (id ``article-<n>``, group
    the title, label the number of paragraphs): the long documents of a long-context job."""
    if unit not in ("question", "article"):
        raise DataError(f"data.squad_unit: unknown unit {unit!r}; use question or article")
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
        if unit == "article":
            contexts = [
                _squad_get(paragraph, "context", str, path, f"{where}.paragraphs[{p}]")
                for p, paragraph in enumerate(paragraphs)
            ]
            if contexts:  # an article without paragraphs has no text (and, read by question, no examples)
                text = "\n\n".join(contexts)
                check_length(len(text), f"{where} (its paragraphs joined) in {path}")
                examples.append(Example(id=f"article-{a}", text=text, group=group, label=str(len(contexts))))
            continue
        for p, paragraph in enumerate(paragraphs):
            pwhere = f"{where}.paragraphs[{p}]"
            context = _squad_get(paragraph, "context", str, path, pwhere)
            for q, qa in enumerate(_squad_get(paragraph, "qas", list, path, pwhere)):
                qwhere = f"{pwhere}.qas[{q}]"
                question = _squad_get(qa, "question", str, path, qwhere)
                check_length(len(question) + len(context), f"{qwhere} (with its context) in {path}")
                qid = _squad_get(qa, "id", (str, int), path, qwhere)
                label = _squad_label(qa, path, qwhere)
                given = [a for a in qa.get("answers") or () if isinstance(a, dict) and "text" in a]
                answers = tuple(str(a["text"]) for a in given)
                starts = [a.get("answer_start") for a in given]
                starts = tuple(int(x) for x in starts) if all(isinstance(x, int) for x in starts) else ()
                examples.append(
                    Example(
                        id=str(qid),
                        text=question,
                        text_pair=context,
                        group=group,
                        label=label,
                        answers=answers,
                        answer_starts=starts,
                    )
                )
    return examples


def _squad_label(qa: dict, path: Path, where: str) -> str:
    """ "impossible" or "answerable": SQuAD 2.0's ``is_impossible`` when given; otherwise the answers, since
    an empty ``answers`` list is SQuAD 2.0's own mark of an unanswerable question (SQuAD 1.1 gives every
    question answers and no ``is_impossible``). A question with neither (a test file) has no label."""
    if "is_impossible" in qa:
        flag = qa["is_impossible"]
        if not isinstance(flag, bool):
            raise DataError(
                f"data.path: {where}.is_impossible in {path} is {flag!r}, not true or false; "
                "fix the file so it follows the SQuAD JSON layout"
            )
        return "impossible" if flag else "answerable"
    answers = qa.get("answers")
    if answers is None:
        return ""
    if not isinstance(answers, list):
        raise DataError(
            f"data.path: {where}.answers in {path} is a {type(answers).__name__}, not a list; "
            "fix the file so it follows the SQuAD JSON layout"
        )
    return "answerable" if answers else "impossible"


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
    except RecursionError:
        raise too_deep(f"line {_deep_line(path)} of {path}") from None
    except json.JSONDecodeError as e:
        hint = "fix the JSON"
        if e.msg == "Extra data":
            hint = "if it holds one JSON record per line, name it .jsonl or set data.format: jsonl"
        raise DataError(f"data.path: line {e.lineno} of {path} is not valid JSON ({e.msg}); {hint}") from None
    except UnicodeDecodeError as e:
        raise not_utf8(path, e.start) from None


def _deep_line(path: Path, depth: int = 500) -> int:
    """The line of ``path`` where JSON nesting first passes ``depth`` levels (brackets inside strings not
    counted); the last line if it never does. Only after the parser gave up, so its cost does not matter."""
    import re

    strings = re.compile(r'"(?:[^"\\\n]|\\.)*"')  # a JSON string never holds a raw newline
    level, n = 0, 0
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, start=1):
            for c in re.findall(r"[\[\]{}]", strings.sub("", line)):
                level += 1 if c in "[{" else -1
                if level > depth:
                    return n
    return n


#: the old private name of :class:`rapids_attn.data.fields.FieldSpec`
_FieldSpec = FieldSpec


# ------------------------------------------------------------------------------------------ checks


def _check_unique_ids(examples: list[Example], path: Path) -> None:
    first: dict[str, int] = {}
    for i, ex in enumerate(examples):
        j = first.setdefault(ex.id, i)
        if j != i:
            raise duplicate(ex.id, path, j, i)
