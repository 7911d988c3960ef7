"""What happens when an experiment ends (checkpoint GC is queued here)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from control_plane.db.models import Experiment
from control_plane.master import Master


def on_experiment_ended(s: Session, master: Master, exp: Experiment) -> None:
    master.notify()
