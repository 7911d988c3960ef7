"""The one way Shipyard checks a settings section: collect every problem, report each with its path.

Every settings model (the master's `master.yaml`, a pool's elastic settings, each provider's own
section) is a pydantic model validated through `validate()`. A bad section raises `SettingsError`,
which lists every problem as a (path, reason) pair — `provider.max_instances: must be an integer
>= 0` — rather than stopping at the first one, so a user fixes a file in one pass.

`Duration` is the type of every period in a settings file: seconds as a number, or a string like
"90s", "5m", "1h".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

Problem = tuple[str, str]  # (path, reason)
M = TypeVar("M", bound=BaseModel)


class SettingsError(ValueError):
    """A settings section is unusable. `problems` holds every (path, reason) pair found."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("; ".join(f"{path}: {reason}" if path else reason for path, reason in self.problems))

    def under(self, prefix: str) -> SettingsError:
        """The same problems with their paths prefixed (`max_instances` → `provider.max_instances`)."""
        return SettingsError((join_path(prefix, path), reason) for path, reason in self.problems)


class StrictSettings(BaseModel):
    """A settings model: unknown keys are problems, and values are not coerced across types (`"5"`
    is not an integer, `"yes"` not a boolean). A sequence field that takes a YAML list as a tuple
    says so with `Field(strict=False)`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def join_path(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def _loc_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _FUNCTION_LOC.match(str(part)):  # pydantic names validators in the location
            out = join_path(out, str(part))
    return out


_FUNCTION_LOC = re.compile(r"^(function-|json-or-python|lax-or-strict|constrained-)")


def _reason(err: Mapping[str, Any], known: Iterable[str]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"unknown field (known: {', '.join(sorted(known))})"
    if kind == "missing":
        return "is required"
    msg = str(err.get("msg", "is invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    elif msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be "):]
    if kind not in ("value_error", "assertion_error") and "input" in err and not isinstance(err["input"], Mapping):
        msg = f"{msg}, got {err['input']!r}"
    return msg


def problems_of(error: ValidationError, model: type[BaseModel], prefix: str = "") -> list[Problem]:
    """pydantic's errors as (path, reason) pairs, paths dotted (`zones[1]`)."""
    known = list(model.model_fields)
    out: list[Problem] = []
    for e in error.errors():
        path = join_path(prefix, _loc_path(e["loc"]))
        inner = (e.get("ctx") or {}).get("error")
        if isinstance(inner, SettingsError):  # a validator that found several problems, or names a sub-path
            out.extend((join_path(path, p), r) for p, r in inner.problems)
        else:
            out.append((path, _reason(e, known)))
    return out


def validate(model: type[M], data: Any, path: str = "") -> M:
    """`model` built from `data`; SettingsError naming every problem (paths under `path`)."""
    if not isinstance(data, Mapping):
        raise SettingsError([(path, f"must be a mapping, got {type(data).__name__}")])
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise SettingsError(problems_of(e, model, path)) from None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any) -> timedelta:
    """Seconds as a number, or a string like "90s", "5m", "1h"; ValueError otherwise."""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 300 or '5m', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("must not be negative")
        return timedelta(seconds=value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"expected a duration like 300 or '5m', got {value!r}")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


# -- field checks every settings model shares, worded once ------------------------------------------
# Each is a `BeforeValidator` for `Annotated[...]` (`region: Annotated[str, text()]`): it sees the raw
# value, so a wrong type and a wrong value get one message; a validator that finds several problems
# raises SettingsError with paths relative to its field (`[1]`, `team`, `['aws:foo']`).

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def key_path(key: Any) -> str:
    """The path step of a mapping key: `team` (→ `labels.team`), or `['aws:foo']` (→ `tags['aws:foo']`)
    for a key that is not a plain name."""
    text = str(key)
    return text if _PLAIN_KEY.match(text) else f"[{text!r}]"


def _checked(check: Callable[[Any], Any], optional: bool) -> BeforeValidator:
    def run(value: Any) -> Any:
        if value is None:
            if optional:
                return None
            raise ValueError("must not be null")
        return check(value)

    return BeforeValidator(run)


def _non_empty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string" + ("" if isinstance(value, str) else f", got {value!r}"))
    return value


def text(*, optional: bool = False) -> BeforeValidator:
    """A non-empty string (None allowed when `optional`)."""
    return _checked(_non_empty_text, optional)


def http_url(*, optional: bool = False) -> BeforeValidator:
    """A non-empty string starting with http:// or https://."""

    def check(value: Any) -> str:
        if not _non_empty_text(value).startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    return _checked(check, optional)


def boolean() -> BeforeValidator:
    """true or false, nothing else (not "yes", not 1)."""

    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {value!r}")
        return value

    return _checked(check, False)


def integer(lo: int, hi: int | None = None, *, optional: bool = False) -> BeforeValidator:
    """An integer (not a bool, not "5") in [lo, hi]; one message for a wrong type and a wrong value."""
    wanted = f"must be an integer >= {lo}" if hi is None else f"must be an integer between {lo} and {hi}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ValueError(f"{wanted}, got {value!r}")
        return value

    return _checked(check, optional)


def text_list(*, optional: bool = False, null_is_empty: bool = False,
              item: Callable[[str], str | None] | None = None) -> BeforeValidator:
    """A YAML list of non-empty strings, each once, as a tuple. `item(value)` may return one more
    problem of an item (e.g. "is not a zone name"); every item's problem is reported, at `[i]`.
    None is allowed when `optional`, and read as the empty tuple with `null_is_empty`."""

    def check(value: Any) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"must be a list of strings, got {value!r}")
        problems: list[Problem] = []
        seen: set[Any] = set()
        for i, v in enumerate(value):
            reason = None
            if not isinstance(v, str) or not v.strip():
                reason = "must be a non-empty string"
            elif v in seen:
                reason = f"duplicate {v!r}"
            elif item is not None:
                reason = item(v)
            if reason:
                problems.append((f"[{i}]", reason))
            if isinstance(v, str):
                seen.add(v)
        if problems:
            raise SettingsError(problems)
        return tuple(value)

    if null_is_empty:
        return BeforeValidator(lambda value: () if value is None else check(value))
    return _checked(check, optional)


def str_mapping(check_item: Callable[[str, str], str | None], *, what: str = "key to value") -> BeforeValidator:
    """A mapping of strings to strings; `check_item(key, value)` returns the problem of one entry or
    None. Every entry's problem is reported, at its key (`labels.team`, `tags['aws:foo']`). None is
    the empty mapping."""

    def check(value: Any) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"must be a mapping of {what}, got {value!r}")
        problems = [(key_path(k), reason) for k, v in value.items() if (reason := check_item(k, v))]
        if problems:
            raise SettingsError(problems)
        return dict(value)

    return BeforeValidator(check)


def check_all(problems: Iterable[Problem]) -> None:
    """Raise SettingsError when `problems` is not empty (a model validator's cross-field checks)."""
    found = list(problems)
    if found:
        raise SettingsError(found)
