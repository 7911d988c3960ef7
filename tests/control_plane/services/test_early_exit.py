"""A trial process that exits 0 before its searcher operation is complete (Determined 0.38.1's
rule): unasked, the trial is complete (`op.report_completed()` never reaches the master in 0.38.1;
"just exit 0"), and its logs say so; asked to stop (a preemption, a pause), it runs again without
counting a failure. Both databases."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Checkpoint, Experiment, TaskLog, Trial
from control_plane.loops import placement
from control_plane.services import lifecycle
from tests.control_plane.services.test_agents import (
    CONFIG,
    agent_principal,
    commands,
    credential,
    one_task,
    register,
    report,
    submit,
)

ONE_RESTART = {**CONFIG, "max_restarts": 1}


def _trial(master: Any) -> Trial:
    with master.sessions() as s:
        (trial,) = s.scalars(select(Trial))
        s.expunge(trial)
        return trial


def _master_lines(master: Any) -> list[str]:
    with master.sessions() as s:
        return [row.log for row in s.scalars(select(TaskLog).where(TaskLog.source == "master").order_by(TaskLog.id))]


def _run_and_exit_0(master: Any, p: Any, session: str, alloc: str, *, checkpoint: bool, asked: bool = True) -> None:
    report(master, p, session, alloc, "running")
    if asked:  # the master asked it to stop (what a pause or the scheduler's preemption does)
        with transaction(master.sessions) as s:
            row = s.get(Allocation, alloc)
            assert row is not None and lifecycle.request_preemption(row, master.clock())
    if checkpoint:
        with transaction(master.sessions) as s:
            row = s.get(Allocation, alloc)
            assert row is not None
            s.add(Checkpoint(uuid=str(uuid.uuid4()), trial_id=row.trial_id, experiment_id=row.experiment_id,
                             task_id=row.task_id, allocation_id=alloc, steps_completed=10))
    report(master, p, session, alloc, "exited", exit_code=0, message="exited with code 0")


def test_a_clean_exit_unasked_completes_the_trial_and_the_experiment(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    _run_and_exit_0(master, p, session, cmd.allocation_id, checkpoint=False, asked=False)
    placement.tick(master)
    trial = _trial(master)
    assert (trial.state, trial.restarts) == ("STATE_COMPLETED", 0)
    with master.sessions() as s:
        assert s.get(Experiment, trial.experiment_id).state == "STATE_COMPLETED"  # type: ignore[union-attr]
    (line,) = _master_lines(master)
    assert "exited with code 0: the trial is complete" in line
    assert commands(master, p, session) == []  # not run again


def test_a_clean_exit_with_a_checkpoint_completes_too(master) -> None:  # type: ignore[no-untyped-def]
    """The checkpoint changes nothing: exit 0 unasked is complete (it was a rerun before)."""
    submit(master, ONE_RESTART)
    first = register(master, agent_principal(master))
    p, session = credential(master, first), first.session_id
    placement.tick(master)
    (cmd,) = commands(master, p, session)
    _run_and_exit_0(master, p, session, cmd.allocation_id, checkpoint=True, asked=False)
    placement.tick(master)
    trial = _trial(master)
    assert (trial.state, trial.restarts) == ("STATE_COMPLETED", 0)
    assert commands(master, p, session) == []


def test_an_exit_the_master_asked_for_runs_again_without_counting_a_failure(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    _run_and_exit_0(master, p, session, cmd.allocation_id, checkpoint=True, asked=True)
    trial = _trial(master)
    assert trial.state not in ("STATE_COMPLETED", "STATE_ERROR") and trial.restarts == 0
    assert _master_lines(master) == []
    placement.tick(master)
    (again,) = commands(master, p, session)
    assert again.allocation_id != cmd.allocation_id  # a new run of the same trial
