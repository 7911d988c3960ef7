"""The autoscaler's history: what it decided, in the database (`scaling_events`, migration 0015).

The leader's autoscaler writes (control_plane/loops/autoscaler/): a row per decision that changed
something — a launch (each instance's type and capacity), terminations (each with its reason and
cause), consolidation moves — and a run of steady ticks collapsed into one row (`ticks` of them,
`at` to `until`, the last reasons), so a pool that does nothing for a day holds one row, not one per
tick. Every API worker reads the same rows: the pool page, `det resource-pool describe` and
`GET /api/v1/resource-pools/{name}/scaling-history` show the same history whichever worker answers.
Rows older than `scaling_history_days` or beyond `scaling_history_rows` per pool are pruned when a
row is added."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from control_plane.db.models import ScalingEvent

STEADY = "steady"
LAUNCH = "launch"
TERMINATE = "terminate"
SCALE = "scale"  # launches and terminations in one decision
CONSOLIDATE = "consolidate"

# Causes of a termination, beside its reason (the decider's words).
CAUSE_IDLE = "idle"  # no work (the decider's idle policy or a shed launch)
CAUSE_DECIDER = "decider"  # the decider's health rules (an agent that never came, or left)
CAUSE_INTERRUPTION = "interruption"  # the cloud announced the instance goes
CAUSE_CONSOLIDATED = "consolidated"  # its work moved to the pool's other instances

#: Rows shown when the reader names no limit.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


@dataclass(frozen=True)
class Retention:
    max_age: timedelta
    max_rows: int


def retention_of(config: Any) -> Retention:
    """From the master config (control_plane/config.py's `scaling_history_days`/`_rows`)."""
    return Retention(timedelta(days=config.scaling_history_days), config.scaling_history_rows)


def record_decision(s: Session, pool: str, now: datetime, keep: Retention, *, launches: Sequence[tuple[str, str]],
                    terminated: Sequence[dict[str, str]], reasons: Sequence[str]) -> ScalingEvent:
    """A scale decision: a row when it launched or terminated, else the steady run extended (or begun)."""
    detail: dict[str, Any] = {"reasons": list(reasons)}
    if not launches and not terminated:
        last = s.scalar(select(ScalingEvent).where(ScalingEvent.pool == pool)
                        .order_by(ScalingEvent.id.desc()).limit(1))
        if last is not None and last.kind == STEADY:
            last.until = now
            last.ticks += 1
            last.detail = detail
            return last
        return _add(s, ScalingEvent(pool=pool, at=now, until=now, kind=STEADY, launch=0, terminate=0, ticks=1,
                                    detail=detail), keep)
    detail["launches"] = [{"instanceType": t, "capacity": c} for t, c in launches]
    detail["terminations"] = [dict(t) for t in terminated]
    kind = SCALE if launches and terminated else LAUNCH if launches else TERMINATE
    return _add(s, ScalingEvent(pool=pool, at=now, until=now, kind=kind, launch=len(launches),
                                terminate=len(terminated), ticks=1, detail=detail), keep)


def record_terminations(s: Session, pool: str, now: datetime, keep: Retention,
                        terminated: Sequence[dict[str, str]]) -> ScalingEvent | None:
    """Terminations begun outside the scale decision (consolidation's emptied instances)."""
    if not terminated:
        return None
    return _add(s, ScalingEvent(pool=pool, at=now, until=now, kind=TERMINATE, launch=0, terminate=len(terminated),
                                ticks=1, detail={"reasons": [], "launches": [],
                                                 "terminations": [dict(t) for t in terminated]}), keep)


def record_consolidation(s: Session, pool: str, now: datetime, keep: Retention, *, instance: str,
                         allocations: Sequence[str], reason: str, saving: float, unit: str) -> ScalingEvent:
    """A consolidation plan applied: the instance emptied, the allocations moved, why, and the saving."""
    return _add(s, ScalingEvent(pool=pool, at=now, until=now, kind=CONSOLIDATE, launch=0, terminate=0, ticks=1,
                                detail={"reasons": [reason], "moves": {
                                    "instance": instance, "allocations": list(allocations),
                                    "saving": saving, "unit": unit}}), keep)


def _add(s: Session, row: ScalingEvent, keep: Retention) -> ScalingEvent:
    s.add(row)
    s.flush()
    prune(s, row.pool, row.at, keep)
    return row


def prune(s: Session, pool: str, now: datetime, keep: Retention) -> None:
    """Drop the pool's rows older than the retention's age, and all but its newest `max_rows`."""
    s.execute(delete(ScalingEvent).where(ScalingEvent.pool == pool, ScalingEvent.until < now - keep.max_age))
    cutoff = s.scalar(select(ScalingEvent.id).where(ScalingEvent.pool == pool).order_by(ScalingEvent.id.desc())
                      .offset(keep.max_rows - 1).limit(1))
    if cutoff is not None:
        s.execute(delete(ScalingEvent).where(ScalingEvent.pool == pool, ScalingEvent.id < cutoff))


def recent(s: Session, pool: str, limit: int = DEFAULT_LIMIT) -> list[ScalingEvent]:
    """The pool's newest rows first."""
    return list(s.scalars(select(ScalingEvent).where(ScalingEvent.pool == pool)
                          .order_by(ScalingEvent.id.desc()).limit(limit)))
