"""The scheduling pass as it was before issue 28's indexes (commit 8c7da37), kept verbatim as the
reference the indexed pass is compared against (test_against_reference.py, benchmarks/scheduler.py):
each waiting allocation that could preempt scanned every agent."""

from __future__ import annotations

from control_plane.core.scheduling import ScheduleFunction
from tests.control_plane.core.scheduling._reference import fair_share, priority

REFERENCE: dict[str, ScheduleFunction] = {"priority": priority.schedule, "fair_share": fair_share.schedule}
