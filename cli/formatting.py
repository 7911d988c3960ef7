"""The master's values as the CLI's tables and key-value lists show them."""

from __future__ import annotations

import json
from typing import Any


def short_state(state: str | None) -> str:
    return (state or "").removeprefix("STATE_")


def fmt_time(value: str | None) -> str:
    """RFC 3339 from the master → `2026-01-02 03:04:05Z` (UTC, to the second)."""
    if not value:
        return ""
    return value.replace("T", " ")[:19] + "Z"


def fmt_metric(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def fmt_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str) if value else ""


def fmt_size(n: Any) -> str:
    try:
        size = float(n)
    except (TypeError, ValueError):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""
