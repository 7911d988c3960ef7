"""Encoding user values for the master: strict JSON, non-finite floats as strings."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from harness.core import _wire


def _strict_loads(raw: bytes) -> object:
    def refuse(token: str) -> object:
        raise ValueError(token)

    return json.loads(raw, parse_constant=refuse)


def test_non_finite_floats_become_strings() -> None:
    raw = _wire.dumps({"a": math.nan, "b": [math.inf, -math.inf, 1.0], "c": {"d": math.nan}})
    assert _strict_loads(raw) == {"a": "NaN", "b": ["Infinity", "-Infinity", 1.0], "c": {"d": "NaN"}}


def test_scalars_and_arrays_without_importing_numpy() -> None:
    class Scalar:
        def item(self) -> int:
            return 7

    class Array:
        def item(self) -> float:
            raise ValueError("only size-1 arrays can be converted")

        def tolist(self) -> list[float]:
            return [1.0, math.nan]

    assert _strict_loads(_wire.dumps({"s": Scalar(), "a": Array(), "o": object})) == {
        "s": 7, "a": [1.0, "NaN"], "o": str(object)}


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
))
def test_anything_json_like_encodes_strictly(value: object) -> None:
    decoded = _strict_loads(_wire.dumps(value))

    def same(orig: object, got: object) -> bool:
        if isinstance(orig, float) and not math.isfinite(orig):
            return got == ("NaN" if math.isnan(orig) else "Infinity" if orig > 0 else "-Infinity")
        if isinstance(orig, list):
            return isinstance(got, list) and len(orig) == len(got) and all(map(same, orig, got))
        if isinstance(orig, dict):
            return isinstance(got, dict) and orig.keys() == got.keys() and all(same(orig[k], got[k]) for k in orig)
        return orig == got and type(orig) is type(got)

    assert same(value, decoded)


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_rfc3339_matches_datetime(t: float) -> None:
    expected = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    got = _wire.rfc3339(t)
    # datetime rounds microseconds half-even, we truncate: at most one microsecond apart.
    parsed_e = datetime.strptime(expected, "%Y-%m-%dT%H:%M:%S.%fZ")
    parsed_g = datetime.strptime(got, "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs((parsed_e - parsed_g).total_seconds()) <= 1e-6
