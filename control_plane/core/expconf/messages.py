"""Pydantic's validation errors as ``FieldError``s: the dotted path in the user's document (union
tags dropped), and a reason in plain words with a "did you mean" hint for a misspelt field."""

import difflib
from collections.abc import Mapping
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError
from typing_extensions import TypeAliasType

from control_plane.core.expconf.describe import join_path, show, yaml_type
from control_plane.core.expconf.errors import FieldError
from control_plane.core.expconf.models.base import LENGTH_UNITS, Length
from control_plane.core.expconf.models.hyperparameters import HYPERPARAMETER_TYPES, Hyperparameter
from control_plane.core.expconf.models.searcher import SEARCHER_NAMES
from control_plane.core.expconf.models.storage import STORAGE_TYPES

__all__ = ["field_errors"]

_UNION_TAGS = frozenset(
    [f"hp={t}" for t in (*HYPERPARAMETER_TYPES, "nested")]
    + [f"searcher={n}" for n in SEARCHER_NAMES]
    + [f"storage={t}" for t in STORAGE_TYPES]
)

_TYPE_NAMES = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean (true or false)",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}

# Error kind → (the bound's key in the error's context, how the reason states it).
_BOUNDS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}

# Error kind of a union told apart by a field → (that field, how an unknown value is named, choices).
_TAGGED_BY = {
    "searcher_name": ("name", "unknown searcher", SEARCHER_NAMES),
    "storage_type": ("type", "unsupported checkpoint storage type", STORAGE_TYPES),
}


def _members(tp: Any, tag: str | None = None) -> list[tuple[str | None, Any]]:
    """Flatten aliases, Annotated and unions into (union tag, type) leaves."""
    if isinstance(tp, TypeAliasType):
        return _members(tp.__value__, tag)
    if isinstance(tp, str):  # the forward reference inside the recursive Hyperparameter alias
        return _members(Hyperparameter, tag)
    if get_origin(tp) is Annotated:
        inner, *meta = get_args(tp)
        own = next((m.tag for m in meta if isinstance(m, Tag)), tag)
        return _members(inner, own)
    if get_origin(tp) in (Union, UnionType):
        return [leaf for arg in get_args(tp) for leaf in _members(arg, tag)]
    return [(tag, tp)]


def _fields_at(schema: type[BaseModel], loc: tuple[str | int, ...]) -> set[str]:
    """Field names the schema allows at ``loc`` (for "did you mean" hints)."""
    candidates: list[tuple[str | None, Any]] = [(None, schema)]
    for part in loc:
        if isinstance(part, str) and part in _UNION_TAGS:
            candidates = [(t, tp) for t, tp in candidates if t == part] or candidates
            continue
        following: list[tuple[str | None, Any]] = []
        for _, tp in candidates:
            if isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
                following += _members(tp.model_fields[part].annotation)
            elif get_origin(tp) is dict and isinstance(part, str):
                following += _members(get_args(tp)[1])
            elif get_origin(tp) is list and isinstance(part, int):
                following += _members(get_args(tp)[0])
        candidates = following
    names: set[str] = set()
    for _, tp in candidates:
        if isinstance(tp, type) and issubclass(tp, Length):
            names.update(LENGTH_UNITS)
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            names.update(tp.model_fields)
    return names


def _resolve_loc(raw: Any, loc: tuple[str | int, ...]) -> tuple[str, Any, Any]:
    """Walk ``loc`` through the raw document, dropping union tags; returns (path, node, parent)."""
    path, node, parent = "", raw, None
    for part in loc:
        if isinstance(part, str) and part in _UNION_TAGS and not (isinstance(node, dict) and part in node):
            continue
        if isinstance(node, dict) and part in node:
            parent, node = node, node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parent, node = node, node[part]
        else:
            parent, node = node, None
        path = join_path(path, part)
    return path, node, parent


def _bound(ctx: dict[str, Any], key: str) -> Any:
    value = ctx.get(key)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _union_reason(kind: str, path: str, node: Any) -> tuple[str, str]:
    """A value no member of a tagged union (hyperparameter, searcher, storage) takes."""
    if kind == "hp_type":
        if not isinstance(node, dict):
            return path, f"must be a hyperparameter mapping (got {yaml_type(node)})"
        return join_path(path, "type"), (
            f"unknown hyperparameter type {show(node.get('type'))}; "
            f"expected one of {', '.join(HYPERPARAMETER_TYPES)}"
        )
    key, what, choices = _TAGGED_BY[kind]
    if not isinstance(node, dict):
        return path, f"must be a mapping (got {yaml_type(node)})"
    if key not in node:
        return join_path(path, key), "required field is missing"
    return join_path(path, key), f"{what} {show(node[key])}; expected one of {', '.join(choices)}"


def _reason(schema: type[BaseModel], err: Mapping[str, Any], path: str, node: Any) -> tuple[str, str]:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    field = path.rsplit(".", 1)[-1]
    if kind == "missing":
        if path == "checkpoint_storage":
            return path, (
                "no checkpoint storage configured: set checkpoint_storage in the experiment config "
                "or a default checkpoint_storage in the master config"
            )
        return path, "required field is missing"
    if kind == "extra_forbidden":
        allowed = _fields_at(schema, tuple(err["loc"])[:-1])
        hint = difflib.get_close_matches(field, allowed, n=1, cutoff=0.75)
        return path, "unknown field" + (f" (did you mean {hint[0]!r}?)" if hint else "")
    if kind in ("hp_type", "searcher_name", "storage_type"):
        return _union_reason(kind, path, node)
    if kind in _TYPE_NAMES:
        return path, f"must be {_TYPE_NAMES[kind]} (got {yaml_type(got)})"
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        return path, f"must be {op} {_bound(ctx, key)} (got {show(got)})"
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return path, "must not be empty"
        return path, f"must have at least {ctx.get('min_length')} items"
    if kind == "string_too_short":
        return path, "must not be empty"
    if kind == "finite_number":
        return path, "must be a finite number"
    if kind == "literal_error":
        return path, f"must be one of {ctx.get('expected')} (got {show(got)})"
    message = str(err.get("msg", "is invalid"))
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    return path, message


def field_errors(schema: type[BaseModel], raw: Any, exc: ValidationError) -> list[FieldError]:
    """Every error of validating ``raw`` as ``schema`` (the experiment config), as FieldErrors."""
    out: list[FieldError] = []
    for err in exc.errors(include_url=False):
        path, node, _ = _resolve_loc(raw, tuple(err["loc"]))
        out.append(FieldError(*_reason(schema, err, path, node)))
    return out
