"""What every job section is built on: :class:`Section` (a pydantic model whose extra keys are refused and whose
number fields refuse true/false), and the helpers its messages use to quote a user's value (:func:`show`,
:func:`clip`) and to keep an error to one line (:func:`one_line`).

It imports nothing of rapids_attn, so a stage package's settings (``rapids_attn/<stage>/config.py``) build on it
without importing :mod:`rapids_attn.job`, which assembles the whole job from the core sections and the registered
stages' ones (:mod:`rapids_attn.registry`).
"""

from __future__ import annotations

import reprlib
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

#: characters of a user's value an error line quotes (then "...", and its length).
MAX_QUOTED = 120
#: characters of a whole job error line (a longer one keeps its start and its end, the fix).
MAX_LINE = 1000


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` as an error line quotes it: whole when short, else its first ``limit`` characters, "..." and
    its length."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 12, 12, 8, 12
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_QUOTED


def show(value: Any) -> str:
    """A user's value as an error line quotes it: its repr, at most :data:`MAX_QUOTED` characters (a long
    string is cut after them with its length; a long list or mapping shows its first entries and its length),
    built without writing out the whole value first."""
    if isinstance(value, str):
        return repr(value) if len(value) <= MAX_QUOTED else f"{value[:MAX_QUOTED]!r}... ({len(value):,} characters)"
    try:
        text = _REPR.repr(value)
    except ValueError:  # an int past Python's 4,300-digit str conversion limit (YAML reads 0x... of any size)
        return (
            f"a number of {value.bit_length() * 0.30103:,.0f} digits"
            if isinstance(value, int)
            else "a value too long to show"
        )
    if isinstance(value, (list, tuple, dict, set)) and len(value) > _REPR.maxlist:
        text += f" ({len(value):,} entries)"
    return clip(text, MAX_QUOTED + 30)


def one_line(message: str) -> str:
    """A job error as one line of at most :data:`MAX_LINE` characters: the start and the end (where the fix
    is) of a longer one, around a note of what was cut. Every error :func:`rapids_attn.jobfile.load_job` raises goes
    through it."""
    message = " ".join(str(message).splitlines())
    if len(message) <= MAX_LINE:
        return message
    head, tail = MAX_LINE * 3 // 5, MAX_LINE // 3
    return f"{message[:head]} ...({len(message) - head - tail:,} characters cut)... {message[-tail:]}"


def _leaf_types(annotation: Any) -> set:
    """The plain types an annotation admits (``int | None`` -> {int, NoneType}; ``Literal`` leaves are
    left out: they name their own values)."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return {annotation} if isinstance(annotation, type) else set()
    if origin is Literal:
        return set()
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (list, tuple, set, dict):
        return set()
    return set().union(*(_leaf_types(a) for a in typing.get_args(annotation)))


def _is_bool_field(annotation: Any) -> bool:
    """Whether a field takes true/false and nothing else (``bool`` or ``bool | None``)."""
    leaves = _leaf_types(annotation)
    return bool in leaves and not leaves - {bool, type(None)}


def _numeric_kind(annotation: Any) -> tuple[str | None, bool]:
    """("int"/"float"/None, whether it is a list of them) for a field that does not admit a bool."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list or (origin is not None and any(typing.get_origin(a) is list for a in args)):
        inner = next((a for a in (annotation, *args) if typing.get_origin(a) is list), None)
        kind, _ = _numeric_kind(typing.get_args(inner)[0]) if inner is not None else (None, False)
        return kind, True
    leaves = _leaf_types(annotation)
    if bool in leaves:
        return None, False
    return ("int" if int in leaves else "float" if float in leaves else None), False


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info) -> Any:
        """pydantic reads ``true`` as 1 for an int (and 1.0 for a float) field: a YAML ``limit: true`` would
        silently mean one example. A number field that does not admit a bool refuses one; a true/false field
        refuses anything else (pydantic would read 1, 0, "yes" or "off" as a bool)."""
        field = cls.model_fields.get(info.field_name)
        if field is None:
            return value
        if _is_bool_field(field.annotation):
            if value is not None and not isinstance(value, bool):
                raise ValueError("must be true or false")
            return value
        kind, is_list = _numeric_kind(field.annotation)
        if kind is None:
            return value
        values = value if is_list and isinstance(value, list) else [value]
        if any(isinstance(v, bool) for v in values):
            what = "a whole number" if kind == "int" else "a number"
            raise ValueError(f"must be {what}{' in each entry' if is_list else ''}, not true/false")
        return value

    @classmethod
    def store_settings(cls, key: str, section: dict) -> dict:
        """What of this section, as a job dict holds it under ``key``, decides the store's contents beyond the core
        sections (entries added to :func:`rapids_attn.job.extraction_settings`, so to the store's key): nothing,
        unless the section's stage changes what the later stages read (the finetune stage's fine-tuned model)."""
        return {}
