"""The cluster-wide message's rules (Determined's SetClusterMessage / GetClusterMessage). Pure: the
caller passes `now`.

A message has a start and an optional end (given, or start + a Go duration string such as
`1h30m`); at most 250 characters; its end after its start and after now. Setting one expires the
previous. The cluster's message is the newest one that has not ended (it may not have started:
Determined's `get` shows a scheduled one too); it is *shown* (the web UI's banner) only between
its start and its end."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

MAX_LENGTH = 250  # Determined's ClusterMessageMaxLength, in characters

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> timedelta:
    """Go's time.ParseDuration (`300ms`, `1.5h`, `2h45m`, `-1h`; no days or weeks); ValueError."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return timedelta(0)
    seconds, pos = 0.0, 0
    for m in _GO_PART.finditer(body):
        if m.start() != pos:
            break
        seconds += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"{text!r} is not a Go duration (e.g. 30m, 24h, 1h30m; units ns, us, ms, s, m, h)")
    return timedelta(seconds=sign * seconds)


@dataclass(frozen=True)
class Problem:
    field: str
    reason: str


def checked_window(message: str, start: datetime, end: datetime | None, duration: str | None,
                   now: datetime) -> tuple[datetime | None, list[Problem]]:
    """The message's end (None: indefinite), or the problems with the request (field, reason)."""
    problems: list[Problem] = []
    if len(message) > MAX_LENGTH:
        problems.append(Problem("message", f"must be at most {MAX_LENGTH} characters; got {len(message)}"))
    if end is not None and duration is not None:
        problems.append(Problem("duration", "endTime and duration are mutually exclusive"))
        return None, problems
    if duration is not None:
        try:
            span = parse_go_duration(duration)
        except ValueError as e:
            return None, [*problems, Problem("duration", str(e))]
        if span < timedelta(0):
            return None, [*problems, Problem("duration", "must be a Go duration with a positive value")]
        end = start + span
    if end is not None and end < start:
        problems.append(Problem("endTime", "end time must be after start time"))
    elif end is not None and end < now:
        problems.append(Problem("endTime", "end time must be after current time"))
    return end, problems


def current(newest_end: datetime | None, now: datetime) -> bool:
    """Whether the newest message (whose end this is) is still the cluster's."""
    return newest_end is None or newest_end > now


def shown(start: datetime, end: datetime | None, now: datetime) -> bool:
    """Whether a banner shows it now."""
    return start <= now and (end is None or end > now)
