"""Records for service tests, made through the services themselves (no HTTP)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from control_plane.auth import Principal, TokenKind
from control_plane.db.engine import transaction
from control_plane.db.models import User
from control_plane.services import experiments
from control_plane.services.experiments import NewExperiment
from tests.control_plane.api.test_experiments import CONFIG, v1file

__all__ = ["CONFIG", "RANDOM", "TRAIN_PY", "admin", "create_experiment"]

TRAIN_PY = v1file("train.py")

# Three trials at once (the single searcher of CONFIG makes one).
RANDOM = """
entrypoint: python3 train.py
hyperparameters:
  lr: {type: double, minval: 0.01, maxval: 0.1}
searcher: {name: random, metric: val_loss, max_trials: 3, max_length: {batches: 50}}
"""


def admin(master: Any) -> Principal:
    with master.read_sessions() as s:
        uid = s.scalar(select(User.id).where(User.username == "admin"))
    return Principal(kind=TokenKind.USER, token_id=0, user_id=uid, username="admin", admin=True)


def create_experiment(master: Any, config: str = CONFIG, owner: Principal | None = None) -> int:
    with transaction(master.sessions) as s:
        exp, _ = experiments.create(s, master, owner or admin(master), NewExperiment(config, [TRAIN_PY]))
        return exp.id
