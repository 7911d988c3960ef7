"""A trial process that exits 0 before completing its searcher operation is no success (as in
Determined): with a checkpoint saved in that run it runs again from it; with none it counts as a
failure against max_restarts, ending in ERROR; the trial's logs say which. Both databases."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Checkpoint, TaskLog, Trial
from control_plane.loops import placement
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


def _run_and_exit_0(master: Any, p: Any, session: str, alloc: str, *, checkpoint: bool) -> None:
    report(master, p, session, alloc, "running")
    if checkpoint:
        with transaction(master.sessions) as s:
            row = s.get(Allocation, alloc)
            assert row is not None
            s.add(Checkpoint(uuid=str(uuid.uuid4()), trial_id=row.trial_id, experiment_id=row.experiment_id,
                             task_id=row.task_id, allocation_id=alloc, steps_completed=10))
    report(master, p, session, alloc, "exited", exit_code=0, message="exited with code 0")


def test_a_clean_exit_with_a_checkpoint_runs_again_without_counting_a_failure(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    _run_and_exit_0(master, p, session, cmd.allocation_id, checkpoint=True)

    trial = _trial(master)
    assert trial.state not in ("STATE_COMPLETED", "STATE_ERROR") and trial.restarts == 0
    (line,) = _master_lines(master)
    assert "exited with code 0 before completing its searcher operation" in line and "runs again" in line
    placement.tick(master)
    (again,) = commands(master, p, session)
    assert again.allocation_id != cmd.allocation_id  # a new run of the same trial


def test_a_clean_exit_without_progress_is_a_failure_and_ends_in_error(master) -> None:  # type: ignore[no-untyped-def]
    submit(master, ONE_RESTART)
    first = register(master, agent_principal(master))
    p, session = credential(master, first), first.session_id
    for run in (1, 2):  # the first run and its one restart
        placement.tick(master)
        (cmd,) = commands(master, p, session)
        _run_and_exit_0(master, p, session, cmd.allocation_id, checkpoint=False)
        assert _trial(master).restarts == run
    trial = _trial(master)
    assert trial.state == "STATE_ERROR"
    assert "before completing its searcher operation" in (trial.exit_reason or "")
    assert "1 restarts used up" in (trial.exit_reason or "")
    lines = _master_lines(master)
    assert len(lines) == 2 and all("saved no checkpoint in this run, so this counts as a failure" in x for x in lines)
