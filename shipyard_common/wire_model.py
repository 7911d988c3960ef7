"""The base of every JSON model on the wire: camelCase field names like Determined's /api/v1,
snake_case in Python. Shared by the master's API and the agent.

Requests (`StrictWire`) are also where input is hardened, once for every body the master takes:
every text and every JSON value in them (keys and nested strings included) must be something a
database can store, JSON values nest at most MAX_JSON_DEPTH deep, booleans are strict, and floats
finite (see `StrictWire`)."""

from __future__ import annotations

import enum
import sys
import types
import typing
from datetime import datetime
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Strict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

# The largest magnitude of a number inside a JSON value (metric values, metadata): float64's, the
# only number Determined's protobuf Struct carries and what metric values are converted to.
MAX_JSON_NUMBER = sys.float_info.max
# How deep a JSON value (a metric, metadata) may nest: far beyond any real one (Determined's
# protobuf parser stops at 100), well within the recursion of the code that walks values later
# (core/metrics.py, the JSON encoders: a metric nested 500 deep was a RecursionError). Deeper
# bodies do not get this far: pydantic-core's parser (the fast paths) stops at 200 levels and
# json.loads (FastAPI's) at the recursion limit, both a 400.
MAX_JSON_DEPTH = 64
# `Union[...]` and, from Python 3.10, `X | Y` (the master's models use both).
_UNION_ORIGINS = (typing.Union, getattr(types, "UnionType", typing.Union))

Loc = tuple[Union[str, int], ...]


class Wire(BaseModel):
    """Unknown fields are ignored: what a newer peer adds must not break an older one."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, object]:
        """The JSON object as sent: camelCase names, JSON-ready values."""
        return self.model_dump(mode="json", by_alias=True)


def text_problem(value: str) -> str | None:
    """Why a text cannot be stored (PostgreSQL refuses NUL in text, UTF-8 lone surrogates), or None."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return "must be valid Unicode (no lone surrogates)"
    return None


def _members(value: Any) -> Any:
    """(key, member) pairs of a container, None for anything else."""
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    if isinstance(value, BaseModel) and not isinstance(value, StrictWire):  # one that does not check itself
        return ((name, getattr(value, name)) for name in type(value).model_fields)
    return None


def _leaf_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_JSON_NUMBER <= value <= MAX_JSON_NUMBER:
        return "number out of range"
    return None


def unstorable(value: Any) -> tuple[Loc, str] | None:
    """The first place in `value` (a text, a JSON value, a list, a model that does not check itself)
    that no database can store, and why (nesting deeper than MAX_JSON_DEPTH is reported at the
    value itself); None when there is none. Iterative, so any depth is safe to look at. Metric
    reports come thousands a second: the common members (floats, plain text, small ints) cost a
    class test or two each."""
    stack: list[tuple[Loc, Any]] = []
    loc: Loc = ()
    while True:
        members = value.items() if value.__class__ is dict else _members(value)
        if members is None:
            problem = _leaf_problem(value)
            if problem is not None:
                return loc, problem
        elif len(loc) >= MAX_JSON_DEPTH:
            return (), f"nests deeper than {MAX_JSON_DEPTH} levels"
        else:
            for key, item in members:
                if key.__class__ is str and ("\x00" in key or not key.isascii()) and (p := text_problem(key)):
                    return loc, f"a key {p}"
                kind = item.__class__
                if kind is float or kind is bool or item is None:
                    continue
                if kind is str:
                    if "\x00" not in item and item.isascii():
                        continue
                elif kind is int and -MAX_JSON_NUMBER <= item <= MAX_JSON_NUMBER:
                    continue
                stack.append(((*loc, key), item))
        if not stack:
            return None
        loc, value = stack.pop()


def _refuse(loc: Loc, reason: str) -> typing.NoReturn:
    # (the input is not repeated: it may be hundreds deep, too deep to print)
    raise ValidationError.from_exception_data("StrictWire", [InitErrorDetails(
        type=PydanticCustomError("unstorable", reason), loc=loc, input=None)])


def _check_text(value: str | None) -> str | None:
    if value is not None and ("\x00" in value or not value.isascii()) and (problem := text_problem(value)):
        _refuse((), problem)
    return value


def _check_value(value: Any) -> Any:
    if value is not None and (found := unstorable(value)) is not None:
        _refuse(*found)
    return value


_TEXT_CHECK = AfterValidator(_check_text)
_VALUE_CHECK = AfterValidator(_check_value)


def _carries_text(annotation: Any) -> bool:
    """Whether a field of this type can hold text or a JSON value (what `unstorable` looks at);
    numbers, booleans, dates, literals, enums and self-checking models cannot."""
    if annotation in (int, float, bool, type(None), datetime):
        return False
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return False
    if origin is typing.Annotated:
        return _carries_text(typing.get_args(annotation)[0])
    if origin in _UNION_ORIGINS or (origin in (list, tuple) and typing.get_args(annotation)):
        return any(_carries_text(a) for a in typing.get_args(annotation) if a is not Ellipsis)
    if isinstance(annotation, type) and (issubclass(annotation, enum.Enum) or issubclass(annotation, StrictWire)):
        return False
    return True


def _hardened(name: str, field: FieldInfo, cleaned: frozenset[str]) -> bool:
    """Add what `StrictWire` asks of `field` to its metadata; whether anything was added."""
    if _TEXT_CHECK in field.metadata or _VALUE_CHECK in field.metadata:
        return False  # inherited, already hardened
    added = False
    if field.annotation in (bool, Optional[bool]) and not any(isinstance(m, Strict) for m in field.metadata):
        field.metadata.append(Strict())
        added = True
    if name not in cleaned and _carries_text(field.annotation):
        field.metadata.append(_TEXT_CHECK if field.annotation in (str, Optional[str]) else _VALUE_CHECK)
        added = True
    return added


class StrictWire(Wire):
    """A request. Unknown fields are refused with their name: a typo must not be ignored. And, so
    that no request can reach the database with what it cannot store (a 500) or ask for more than
    it may, for every subclass (its fields get the checks when the class is made):

    - every field that can hold text or a JSON value is checked: text with NUL or lone
      surrogates, JSON values nested deeper than MAX_JSON_DEPTH and integers in them beyond
      float64 are a 400 naming the place (`metrics.metrics.avgMetrics.loss`). `cleaned_text` names
      fields whose text is stored cleaned instead (services/text.py: a task's log line with NUL
      is kept, as U+FFFD);
    - booleans are strict: `true`/`false` only, not "yes", 1 or "on" (as Determined's protojson);
    - floats are finite (no NaN or ±Infinity, also not as strings), unless a field allows them.
    Integers are bounded by their column (control_plane/api/wire.py: `Int32`, `Count64` ...),
    strings by theirs (`max_length`). Fields that cannot hold text (numbers, nested requests)
    cost nothing more."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", allow_inf_nan=False)

    cleaned_text: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        changed = [_hardened(name, f, cls.cleaned_text) for name, f in cls.model_fields.items()]
        if any(changed):
            cls.model_rebuild(force=True, raise_errors=False)
