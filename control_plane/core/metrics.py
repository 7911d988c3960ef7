"""Metric values: non-finite numbers and the searcher metric's order.

Metrics may contain NaN and ±Infinity (Determined allows them, and its client already encodes them
as the strings "NaN", "Infinity", "-Infinity" because JSON has no such numbers). Shipyard stores and
returns them as those same strings, so every stored row is plain JSON on SQLite and PostgreSQL alike
and every response can be encoded. Python-side code (the searcher hook) gets them back as floats
through `decode_nonfinite`."""

from __future__ import annotations

import math
from typing import Any

from shipyard_common.wire import NONFINITE_STRINGS as _NONFINITE_IN
from shipyard_common.wire import encode_float


def json_safe(value: Any) -> Any:
    """Non-finite floats become Determined's strings so the value is plain JSON."""
    if isinstance(value, float):
        return encode_float(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value

def decode_nonfinite(value: Any) -> Any:
    """The inverse of `json_safe` for the values a metric dict may hold."""
    if isinstance(value, str):
        return _NONFINITE_IN.get(value, value)
    if isinstance(value, dict):
        return {k: decode_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_nonfinite(v) for v in value]
    return value

def metric_number(value: Any) -> float | None:
    """A metric value as a float (NaN/±inf included), or None if it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE_IN:
        return _NONFINITE_IN[value]
    return None

def wire_float(value: float | None) -> float | str | None:
    if value is None:
        return None
    return json_safe(float(value))

def better(a: float, b: float | None, smaller_is_better: bool) -> bool:
    """Is `a` a better searcher metric than `b`? NaN is never better than anything."""
    if math.isnan(a):
        return False
    if b is None or math.isnan(b):
        return True
    return a < b if smaller_is_better else a > b
