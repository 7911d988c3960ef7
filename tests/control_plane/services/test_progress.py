"""An experiment's progress as the lifecycle keeps it (core/progress.py), both databases: a single
searcher's moves with its trial's steps, a reported progress wins, a paused experiment keeps it,
an ended one that did not complete keeps its last progress, a completed one is at 1.0."""

from __future__ import annotations

from typing import Any

from control_plane.auth import Principal, TokenKind
from control_plane.db.engine import transaction
from control_plane.db.models import Experiment, Trial
from control_plane.services import lifecycle
from control_plane.services import metrics as trial_metrics
from control_plane.services import trials as trial_service
from tests.control_plane.services.builders import RANDOM, create_experiment
from tests.control_plane.services.test_agents import commands, one_task, report


def _set_steps(master: Any, trial_id: int, steps: int) -> None:
    with transaction(master.sessions) as s:
        s.get(Trial, trial_id).steps_completed = steps  # type: ignore[union-attr]


def _progress(master: Any, exp_id: int) -> tuple[str, float]:
    with transaction(master.sessions) as s:
        exp = s.get(Experiment, exp_id)
        assert exp is not None
        lifecycle.reconcile_experiment(s, master, exp)
        return exp.state, exp.progress


def test_single_searcher_steps_reported_progress_and_pause(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)  # single, max_length 100
    with master.read_sessions() as s:
        (trial,) = trial_service.trials_of(s, exp_id)
    assert _progress(master, exp_id) == ("STATE_ACTIVE", 0.0)
    _set_steps(master, trial.id, 25)
    assert _progress(master, exp_id) == ("STATE_ACTIVE", 0.25)
    trial_metrics.report_progress(master, trial.id, lambda _s: Principal(kind=TokenKind.ALLOCATION, token_id=0,
                                                                         trial_id=trial.id), 0.6)
    assert _progress(master, exp_id) == ("STATE_ACTIVE", 0.6)
    with transaction(master.sessions) as s:
        lifecycle.set_experiment_state(s, master, s.get(Experiment, exp_id), "pause")
    assert _progress(master, exp_id) == ("STATE_PAUSED", 0.6)
    with transaction(master.sessions) as s:
        lifecycle.set_experiment_state(s, master, s.get(Experiment, exp_id), "cancel")
    for _ in range(3):
        state, progress = _progress(master, exp_id)
    assert (state, progress) == ("STATE_CANCELED", 0.6)


def test_random_searcher_sums_its_trials(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master, RANDOM)  # 3 trials of 50 batches
    with master.read_sessions() as s:
        a, b, _c = trial_service.trials_of(s, exp_id)
    _set_steps(master, a.id, 50)
    _set_steps(master, b.id, 25)
    assert _progress(master, exp_id)[1] == (1.0 + 0.5) / 3


def test_an_errored_experiment_keeps_its_last_progress(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)  # single, max_length 20, max_restarts 0 below
    with transaction(master.sessions) as s:
        (exp,) = s.query(Experiment).all()
        exp.config = {**exp.config, "max_restarts": 0}
        exp_id = exp.id
        (trial,) = s.query(Trial).all()
    report(master, p, session, cmd.allocation_id, "running")
    _set_steps(master, trial.id, 5)
    assert _progress(master, exp_id) == ("STATE_ACTIVE", 0.25)
    report(master, p, session, cmd.allocation_id, "exited", exit_code=1, message="exited with code 1")
    for _ in range(3):
        state, progress = _progress(master, exp_id)
    assert (state, progress) == ("STATE_ERROR", 0.25)
    assert commands(master, p, session) == []


def test_a_completed_experiment_is_done(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    with master.read_sessions() as s:
        (exp_id,) = [e.id for e in s.query(Experiment).all()]
    report(master, p, session, cmd.allocation_id, "running")
    report(master, p, session, cmd.allocation_id, "exited", exit_code=0, message="exited with code 0")
    for _ in range(3):
        state, progress = _progress(master, exp_id)
    assert (state, progress) == ("STATE_COMPLETED", 1.0)
