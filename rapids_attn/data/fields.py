"""Which record fields feed an :class:`Example`, and the rules every record must pass (JSONL, CSV,
Parquet and saved HF datasets share them).

A :class:`FieldSpec` is small and picklable: it travels inside each shard task, so a worker builds
its rows' Examples with exactly the rules the driver validated them with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError


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

    def example(self, record: Mapping[str, Any], index: int, where: str) -> Example:
        """Build the Example for record number ``index`` (0-based); ``where`` locates it in messages."""
        self.check_fields(record.keys(), where)
        text = text_value(record, self.text, where)
        pair = None if self.pair is None else text_value(record, self.pair, where)
        if self.id is None:
            ex_id = str(index)
        else:
            value = record[self.id]
            if value is None or value == "":
                raise empty_id(where, self.id)
            ex_id = str(value)
        return Example(
            id=ex_id,
            text=text,
            text_pair=pair,
            group=plain_value(record, self.group),
            label=plain_value(record, self.label),
        )


def empty_id(where: str, field: str) -> DataError:
    return DataError(
        f"data.path: {where} has an empty id in field {field!r}; give every record an id or leave data.id_field unset"
    )


def not_text(where: str, field: str, kind: str) -> DataError:
    return DataError(f"data.path: {where} field {field!r} is {kind}; set data.text_fields to fields that hold text")


def text_value(record: Mapping[str, Any], field: str, where: str) -> str:
    value = record[field]
    if value is None or isinstance(value, (dict, list, tuple)):
        raise not_text(where, field, "empty" if value is None else f"a {type(value).__name__}, not text")
    return value if isinstance(value, str) else str(value)


def plain_value(record: Mapping[str, Any], field: str | None) -> str:
    if field is None or record[field] is None:
        return ""
    return str(record[field])


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
