"""What the record says of a pool's consolidation moves (loops/autoscaler/consolidate.py writes them):
the recent ones, for `det resource-pool describe` (through the API) and the web UI's pool view."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import ConsolidationMove

#: How many of a pool's latest moves are shown.
SHOWN_MOVES = 20


@dataclass(frozen=True)
class MoveView:
    at: datetime
    launch_id: str
    instance_id: str | None
    allocation_id: str
    trial_id: int | None
    reason: str
    saving: float
    saving_unit: str
    replacement_launch_id: str | None = None  # moved onto this new, cheaper instance
    pending: bool = False  # waiting for that replacement's agent to connect


def recent_moves(s: Session, pool: str, limit: int = SHOWN_MOVES) -> list[MoveView]:
    """The pool's latest moves, newest first."""
    return [MoveView(m.at, m.launch_id, m.instance_id, m.allocation_id, m.trial_id, m.reason, m.saving, m.saving_unit,
                     m.replacement_launch_id, m.pending)
            for m in s.scalars(select(ConsolidationMove).where(ConsolidationMove.pool == pool)
                               .order_by(ConsolidationMove.at.desc(), ConsolidationMove.id.desc()).limit(limit))]
