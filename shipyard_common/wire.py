"""JSON conventions every party on the wire follows (stdlib only: the harness imports this inside
the user's training process).

  * Timestamps are RFC 3339 in UTC with microseconds and a Z (`2024-05-01T12:00:00.123456Z`), the
    shape grpc-gateway, and so Determined's API, renders.
  * Strict JSON has no NaN/Infinity tokens, so non-finite floats travel as the strings "NaN",
    "Infinity" and "-Infinity" (Determined's client encodes them the same way); the master stores
    them as those strings and decodes them back to floats where it computes with them.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

NAN = "NaN"
POS_INF = "Infinity"
NEG_INF = "-Infinity"

# What a non-finite number may arrive as: ours, plus the spellings Python and other clients print.
NONFINITE_STRINGS: dict[str, float] = {
    NAN: math.nan, "Nan": math.nan, "nan": math.nan,
    POS_INF: math.inf, NEG_INF: -math.inf, "inf": math.inf, "-inf": -math.inf,
}

_RFC3339 = "%Y-%m-%dT%H:%M:%S.%fZ"


def encode_float(x: float) -> float | str:
    """A float as strict JSON can carry it: finite as is, non-finite as its string."""
    if math.isfinite(x):
        return float(x)
    if math.isnan(x):
        return NAN
    return POS_INF if x > 0 else NEG_INF


def rfc3339(t: datetime) -> str:
    """An aware datetime in UTC; a naive one is taken to be UTC already (the database's convention)."""
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc)
    return t.strftime(_RFC3339)


_second_cache: tuple[int, str] = (-1, "")


def rfc3339_epoch(epoch_s: float) -> str:
    """`rfc3339` for seconds since the epoch. strftime is slow and metric reports come thousands per
    second, so the per-second prefix is cached (microseconds are truncated, not rounded)."""
    global _second_cache
    sec = int(epoch_s)
    cached_sec, prefix = _second_cache
    if sec != cached_sec:
        prefix = datetime.fromtimestamp(sec, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _second_cache = (sec, prefix)
    micros = min(999_999, int((epoch_s - sec) * 1_000_000))
    return f"{prefix}.{micros:06d}Z"
