"""Which record fields feed an :class:`Example`, and the rules every record must pass (JSONL, CSV,
Parquet and saved HF datasets share them).

A :class:`FieldSpec` is small and picklable: it travels inside each shard task, so a worker builds
its rows' Examples with exactly the rules the driver validated them with.

What a text field may hold (:func:`text_value`): a string; bytes (a binary Parquet or HF column), decoded as
UTF-8 and refused when they are not UTF-8, never written as their ``b'...'`` repr; a number (int, float,
Decimal), read as its decimal text (``str``). Anything else (null, true/false, a list, an object, a date) is
refused in one line that names the record and the field. A record's text (its text and pair together) holds at
most :data:`MAX_TEXT_CHARS` characters: a longer one is refused while the driver indexes the data, before
anything is tokenized.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError

#: the most characters of text one record may hold (its text and pair together). Far above what a model reads
#: at once (a 512-token window is a few thousand characters), yet small enough that tokenizing a record and
#: capturing its windows stays cheap; a longer record is refused in preflight, naming it. Cut its text or split
#: it into several records.
MAX_TEXT_CHARS = 1_000_000


@dataclass(frozen=True)
class FieldSpec:
    """text (and pair) -> Example.text (and .text_pair); id, group, label are optional field names."""

    text: str
    pair: str | None = None
    id: str | None = None
    group: str | None = None
    label: str | None = None

    @classmethod
    def make(
        cls,
        text_fields: Sequence[str] | str | None,
        id_field: str | None,
        group_field: str | None,
        label_field: str | None,
    ) -> FieldSpec:
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

    def columns(self) -> list[str]:
        """The distinct fields a reader must load (in the order named)."""
        return list(dict.fromkeys(field for field, _ in self.required()))

    def check_fields(self, present: Iterable[str], where: str) -> None:
        """DataError if a named field is absent; the message lists the fields that exist."""
        present = list(present)
        for field, setting in self.required():
            if field not in present:
                raise DataError(
                    f"data.path: {where} has no field {field!r}; set {setting} to a field "
                    f"that exists (found: {', '.join(map(str, present)) or 'none'})"
                )

    def check_unrepeated(self, names: Sequence[str], where: str, thing: str, fix: str) -> None:
        """DataError if a field the job reads is named more than once among ``names`` (a header's or a schema's
        columns, a record's keys; ``thing`` says which): which one is read would be the reader's choice (CSV and
        JSON keep the last silently, Parquet neither)."""
        for field, setting in self.required():
            at = [i + 1 for i, name in enumerate(names) if name == field]
            if len(at) > 1:
                times = "twice" if len(at) == 2 else f"{len(at)} times"
                cols = f" (columns {', '.join(map(str, at[:-1]))} and {at[-1]})" if thing == "column" else ""
                raise DataError(
                    f"data.path: {where} names the {thing} {field!r} {times}{cols}, and {setting} reads it: which one "
                    f"is read would be a guess; {fix}"
                )

    def example(self, record: Mapping[str, Any], index: int, where: str) -> Example:
        """Build the Example for record number ``index`` (0-based); ``where`` locates it in messages."""
        self.check_fields(record.keys(), where)
        text = text_value(record, self.text, where)
        pair = None if self.pair is None else text_value(record, self.pair, where)
        check_length(len(text) + (0 if pair is None else len(pair)), where)
        if self.id is None:
            ex_id = str(index)
        else:
            value = record[self.id]
            if value is None or value in ("", b""):
                raise empty_id(where, self.id)
            ex_id = plain_text(value, where, self.id, "data.id_field")
        return Example(
            id=ex_id,
            text=text,
            text_pair=pair,
            group=plain_value(record, self.group, where, "data.group_field"),
            label=plain_value(record, self.label, where, "data.label_field"),
        )


def empty_id(where: str, field: str) -> DataError:
    return DataError(
        f"data.path: {where} has an empty id in field {field!r}; give every record an id or leave data.id_field unset"
    )


def not_text(where: str, field: str, kind: str) -> DataError:
    return DataError(f"data.path: {where} field {field!r} is {kind}; set data.text_fields to fields that hold text")


def too_long(where: str, n: int) -> DataError:
    return DataError(
        f"data.path: {where} holds {n:,} characters of text, more than the {MAX_TEXT_CHARS:,} one record may hold "
        "(rapids_attn.data.fields.MAX_TEXT_CHARS); cut that record's text or split it into several records"
    )


def check_length(n: int, where: str) -> None:
    """DataError when a record's text (text and pair together, ``n`` characters) is over :data:`MAX_TEXT_CHARS`."""
    if n > MAX_TEXT_CHARS:
        raise too_long(where, n)


def not_utf8_value(where: str, field: str, e: UnicodeDecodeError, setting: str = "data.text_fields") -> DataError:
    return DataError(
        f"data.path: {where} field {field!r} holds bytes that are not UTF-8 text (bad byte at offset {e.start} of "
        f"the value); store that column as UTF-8 text, or set {setting} to a field that holds text"
    )


def text_value(record: Mapping[str, Any], field: str, where: str) -> str:
    """The text of ``record[field]``: a string as it is, bytes decoded as UTF-8 (refused when they are not), a
    number as its decimal text; DataError for anything else (null, true/false, a list, an object, a date)."""
    value = record[field]
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise not_utf8_value(where, field, e) from None
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return str(value)
    if value is None:
        kind = "empty"
    elif isinstance(value, bool):
        kind = f"{str(value).lower()}, not text"
    else:
        kind = f"a {type(value).__name__}, not text"
    raise not_text(where, field, kind)


def plain_text(value: Any, where: str, field: str, setting: str) -> str:
    """An id, group or label (named by ``setting``) as text: bytes decoded as UTF-8 (refused when they are not),
    anything else str()."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise not_utf8_value(where, field, e, setting) from None
    return str(value)


def plain_value(record: Mapping[str, Any], field: str | None, where: str, setting: str) -> str:
    if field is None or record[field] is None:
        return ""
    return plain_text(record[field], where, field, setting)


class FieldsSource:
    """What every record source tells the index about its fields (mixed into each source class)."""

    spec: FieldSpec | None

    @property
    def numbered(self) -> bool:
        """The ids are record (or line) numbers, so they are unique without a check."""
        return self.spec is None or self.spec.id is None

    @property
    def pairs(self) -> bool:
        return self.spec is not None and self.spec.pair is not None
