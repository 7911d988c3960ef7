"""A trial's summary metrics in Determined's wire format (`trial.summaryMetrics`, what `det trial
describe` prints as "Summary Metrics"): per group (`avg_metrics` for training, `validation_metrics`
for validation, the group's own name otherwise), per metric name, its count, sum, min, max and
last value, and its type ("number"; else "string", "boolean", "object" or "null", with only the
count and the last value). Pure: it folds the trial's reports, in step order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from control_plane.core.metrics import metric_number, wire_float

GROUP_KEYS = {"training": "avg_metrics", "validation": "validation_metrics"}


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict | list):
        return "object"
    return "string"


def _fold(entry: dict[str, Any] | None, value: Any) -> dict[str, Any]:
    number = metric_number(value)
    if number is None:
        return {"count": (entry or {}).get("count", 0) + 1, "last": value, "type": _type(value)}
    if entry is None or entry.get("type") != "number":
        return {"count": 1, "sum": number, "min": number, "max": number, "last": number, "type": "number"}
    return {"count": entry["count"] + 1, "sum": entry["sum"] + number, "min": min(entry["min"], number),
            "max": max(entry["max"], number), "last": number, "type": "number"}


def summarize(reports: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """`reports`: (group, its metrics as name → value), oldest step first."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for group, metrics in reports:
        summary = out.setdefault(GROUP_KEYS.get(group, group), {})
        for name, value in metrics.items():
            summary[name] = _fold(summary.get(name), value)
    for summary in out.values():
        for entry in summary.values():
            for key in ("sum", "min", "max", "last"):
                if entry.get("type") == "number" and key in entry:
                    entry[key] = wire_float(entry[key])
    return out
