"""Turning user values into strict JSON for the master.

Metrics are whatever the training loop hands us: floats that may be NaN or infinite, numpy or
torch scalars, tuples. Strict JSON has no NaN/Infinity tokens, so non-finite floats travel as the
strings "NaN", "Infinity" and "-Infinity" (the master stores them back as floats). Anything with
`.item()` (numpy/torch scalars) or `.tolist()` (arrays) is converted without importing either
library; anything else unknown is sent as its str().
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

NAN = "NaN"
POS_INF = "Infinity"
NEG_INF = "-Infinity"


def _float(x: float) -> float | str:
    if math.isfinite(x):
        return float(x)
    if x != x:
        return NAN
    return POS_INF if x > 0 else NEG_INF


def jsonable(value: Any) -> Any:
    # bool before int/float: bool is an int subclass and must stay a JSON boolean.
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    item = getattr(value, "item", None)
    if callable(item):
        try:
            # One-element numpy/torch values; multi-element ones raise and go through tolist().
            return jsonable(item())
        except Exception:
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return jsonable(tolist())
    return str(value)


_strict = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=True)


def dumps(value: Any) -> bytes:
    # Fast path in C for the common case (plain finite numbers and strings); only values the
    # strict encoder refuses (NaN, inf, numpy ints, tensors...) pay for the Python walk.
    try:
        return _strict.encode(value).encode()
    except (ValueError, TypeError):
        return _strict.encode(jsonable(value)).encode()


_second_cache: tuple[int, str] = (-1, "")


def rfc3339(epoch_s: float) -> str:
    """The timestamp shape grpc-gateway (and so Determined's API) uses: 2024-05-01T12:00:00.123456Z.
    strftime is slow and reports come thousands per second, so the per-second prefix is cached."""
    global _second_cache
    sec = int(epoch_s)
    cached_sec, prefix = _second_cache
    if sec != cached_sec:
        prefix = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second_cache = (sec, prefix)
    micros = min(999_999, int((epoch_s - sec) * 1_000_000))
    return f"{prefix}.{micros:06d}Z"
