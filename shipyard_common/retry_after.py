"""`Retry-After` as the master's clients read it: the hint a shedding master (503) or a throttle
(429) sends, in seconds, capped so that a wrong or hostile value cannot park a client for hours."""

from __future__ import annotations

import math

# A Retry-After above this is not believed: the client's own backoff takes over.
RETRY_AFTER_CAP_S = 30.0


def retry_after_seconds(value: str | None, cap: float = RETRY_AFTER_CAP_S) -> float | None:
    """The delay form only (an HTTP date is ignored: clocks differ), within [0, cap]."""
    try:
        seconds = float((value or "").strip())
    except ValueError:
        return None
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), cap)
