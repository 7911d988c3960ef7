"""shipyard_common/settings.py: every problem of a section at once, each with its path, in one wording."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Optional

import pytest
from pydantic import AfterValidator, Field, model_validator

from shipyard_common.settings import (
    Duration,
    SettingsError,
    StrictSettings,
    boolean,
    check_all,
    http_url,
    integer,
    key_path,
    parse_duration,
    str_mapping,
    text,
    text_list,
    validate,
)


def _no_x(value: str) -> str | None:
    return "must not be x" if value == "x" else None


def _short(key: Any, value: Any) -> str | None:
    return None if isinstance(value, str) and len(value) < 4 else "too long"


def _not_empty(zones: tuple[str, ...]) -> tuple[str, ...]:
    if not zones:
        raise ValueError("at least one is required")
    return zones


class Section(StrictSettings):
    name: Annotated[str, text()]
    note: Annotated[Optional[str], text(optional=True)] = None
    size: Annotated[int, integer(1, 10)] = 1
    count: Annotated[Optional[int], integer(0, optional=True)] = None
    on: Annotated[bool, boolean()] = False
    url: Annotated[Optional[str], http_url(optional=True)] = None
    zones: Annotated[tuple[str, ...], text_list(item=_no_x), AfterValidator(_not_empty)] = ("a",)
    tags: Annotated[dict[str, str], str_mapping(_short)] = Field(default_factory=dict)
    period: Duration = timedelta(minutes=5)

    @model_validator(mode="after")
    def _agree(self) -> Section:
        check_all([("note", "is required when on is true")] if self.on and self.note is None else [])
        return self


def test_a_good_section_is_typed_and_lists_become_tuples() -> None:
    s = validate(Section, {"name": "n", "size": 3, "on": True, "note": "y", "zones": ["a", "b"],
                           "tags": {"k": "v"}, "period": "90s", "url": "http://h:1"})
    assert (s.size, s.on, s.zones, s.tags, s.period) == (3, True, ("a", "b"), {"k": "v"}, timedelta(seconds=90))
    assert validate(Section, {"name": "n", "tags": None}).tags == {}  # null: the empty mapping


def test_every_problem_is_reported_with_its_path() -> None:
    with pytest.raises(SettingsError) as info:
        validate(Section, {"name": "", "size": "3", "count": True, "on": "yes", "url": "h:1",
                           "zones": ["a", "", "a", "x"], "tags": {"ok": "v", "aws:k": "long value", "t": 1},
                           "period": "soon", "bogus": 1}, "pool")
    assert info.value.problems == (
        ("pool.name", "must be a non-empty string"),
        ("pool.size", "must be an integer between 1 and 10, got '3'"),
        ("pool.count", "must be an integer >= 0, got True"),
        ("pool.on", "must be true or false, not 'yes'"),
        ("pool.url", "must start with http:// or https://"),
        ("pool.zones[1]", "must be a non-empty string"),
        ("pool.zones[2]", "duplicate 'a'"),
        ("pool.zones[3]", "must not be x"),
        ("pool.tags['aws:k']", "too long"),
        ("pool.tags.t", "too long"),
        ("pool.period", "expected a duration like 300 or '5m', got 'soon'"),
        ("pool.bogus", "unknown field (known: count, name, note, on, period, size, tags, url, zones)"),
    )
    assert str(info.value).startswith("pool.name: must be a non-empty string; pool.size: ")


@pytest.mark.parametrize(("data", "problem"), [
    ({}, ("name", "is required")),
    ({"name": None}, ("name", "must not be null")),
    ({"name": "n", "zones": []}, ("zones", "at least one is required")),
    ({"name": "n", "zones": "a"}, ("zones", "must be a list of strings, got 'a'")),
    ({"name": "n", "tags": ["a"]}, ("tags", "must be a mapping of key to value, got ['a']")),
    ({"name": "n", "on": True}, ("note", "is required when on is true")),  # a model validator's own path
])
def test_single_problems(data: dict[str, Any], problem: tuple[str, str]) -> None:
    with pytest.raises(SettingsError) as info:
        validate(Section, data)
    assert info.value.problems == (problem,)


def test_a_section_that_is_not_a_mapping() -> None:
    with pytest.raises(SettingsError, match="provider: must be a mapping, got list"):
        validate(Section, [], "provider")


def test_under_prefixes_every_path() -> None:
    err = SettingsError([("zones[1]", "bad"), ("", "whole"), ("[0]", "first")]).under("provider")
    assert err.problems == (("provider.zones[1]", "bad"), ("provider", "whole"), ("provider[0]", "first"))


def test_key_paths() -> None:
    assert [key_path(k) for k in ("team", "cost-center", "aws:foo", "a.b", 1)] == [
        "team", "cost-center", "['aws:foo']", "['a.b']", "['1']"]


def test_durations() -> None:
    assert parse_duration("1.5h") == timedelta(minutes=90) and parse_duration(30) == timedelta(seconds=30)
    for bad in (-1, True, "5 parsecs"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_a_list_whose_null_is_empty() -> None:
    class Groups(StrictSettings):
        ids: Annotated[tuple[str, ...], text_list(null_is_empty=True)] = ("default",)

    assert validate(Groups, {"ids": None}).ids == ()
    assert validate(Groups, {}).ids == ("default",)
    with pytest.raises(SettingsError, match=r"ids\[0\]: must be a non-empty string"):
        validate(Groups, {"ids": [""]})
