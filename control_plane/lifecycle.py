"""Experiment and trial lifecycle: searcher operations → trials → allocations, and agent/harness
reports → state changes. Shell code: reads state, calls the pure searcher, writes the result in
the same transaction. (Being written by the lead; the API imports these entry points.)"""

from __future__ import annotations

from sqlalchemy.orm import Session

from control_plane.db.models import Experiment
from control_plane.master import Master


def on_experiment_created(s: Session, master: Master, exp: Experiment) -> None:
    """Called in the creating transaction after the Experiment row is flushed (state ACTIVE or
    PAUSED). Runs the searcher's initial operations: creates trials and their allocations."""


def set_experiment_state(s: Session, master: Master, exp: Experiment, target: str) -> None:
    """target in ACTIVE, PAUSED, STOPPING_CANCELED, STOPPING_KILLED (from activate/pause/cancel/kill).
    Raises control_plane.api.errors.APIError(409) for impossible transitions."""
    exp.state = target
