"""Turning user values into strict JSON for the master.

Metrics are whatever the training loop hands us: floats that may be NaN or infinite, numpy or
torch scalars, tuples. Strict JSON has no NaN/Infinity tokens, so non-finite floats travel as the
strings "NaN", "Infinity" and "-Infinity" (the master stores them back as floats). Anything with
`.item()` (numpy/torch scalars) or `.tolist()` (arrays) is converted without importing either
library; anything else unknown is sent as its str(). The conventions themselves (those strings, the
timestamp shape) are shipyard_common.wire's, shared with the master and the agent.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from shipyard_common.wire import NAN, NEG_INF, POS_INF, encode_float
from shipyard_common.wire import rfc3339_epoch as rfc3339

__all__ = ["NAN", "NEG_INF", "POS_INF", "dumps", "jsonable", "rfc3339"]


def jsonable(value: Any) -> Any:
    # bool before int/float: bool is an int subclass and must stay a JSON boolean.
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return encode_float(value)
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
