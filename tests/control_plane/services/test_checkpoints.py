"""services/checkpoints.py and services/models.py called directly, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Checkpoint, Experiment, Model, Trial
from control_plane.errors import Conflict, Invalid, PermissionDenied
from control_plane.services import checkpoints, metrics, models
from control_plane.services.checkpoints import CheckpointReport
from control_plane.services.metrics import MetricReport
from control_plane.services.models import NewModel, NewModelVersion
from tests.control_plane.services.builders import admin, create_experiment


def a_trial(master) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with master.read_sessions() as s:
        return exp_id, s.scalar(select(Trial.id).where(Trial.experiment_id == exp_id))


def report(master, trial_id: int, steps: int, ckpt_uuid: str | None = None,  # type: ignore[no-untyped-def]
           state: str = st.CheckpointState.COMPLETED) -> str:
    ckpt_uuid = ckpt_uuid or str(uuid.uuid4())
    by = Principal(kind=TokenKind.ALLOCATION, token_id=0, trial_id=trial_id, allocation_id=None)
    rpt = CheckpointReport(uuid=ckpt_uuid, state=state, resources={"model.pt": 10, "opt.pt": 5},
                           steps_completed=steps, metadata={"steps_completed": steps})
    with transaction(master.sessions) as s:
        trial, exp = checkpoints.reporting_trial(s, by, rpt)
        checkpoints.record(s, master, trial, exp, rpt, None)
    return ckpt_uuid


def latest_of(master, trial_id: int) -> str | None:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        return s.get(Trial, trial_id).latest_checkpoint_uuid


def test_report_is_idempotent_and_tracks_the_latest(master) -> None:  # type: ignore[no-untyped-def]
    _, tid = a_trial(master)
    first = report(master, tid, 10)
    assert report(master, tid, 10, first) == first  # the retry is a no-op
    second = report(master, tid, 20)
    report(master, tid, 30, state=st.CheckpointState.ACTIVE)  # not completed: never the latest
    report(master, tid, 5)  # an older step: not the latest either
    assert latest_of(master, tid) == second
    with master.read_sessions() as s:
        c = s.get(Checkpoint, first)
        assert (c.size_bytes, c.task_id, c.trial_id) == (15, s.get(Trial, tid).task_id, tid)
    _, other = a_trial(master)
    with pytest.raises(Conflict):
        report(master, other, 10, first)


def test_reports_name_one_trial(master) -> None:  # type: ignore[no-untyped-def]
    _, tid = a_trial(master)
    user = admin(master)
    with master.read_sessions() as s:
        task = s.get(Trial, tid).task_id
        rpt = CheckpointReport(uuid=str(uuid.uuid4()), state=st.CheckpointState.COMPLETED, resources={}, steps_completed=1,
                               metadata={}, task_id=task, trial_id=tid + 1)
        with pytest.raises(Invalid) as err:
            checkpoints.reporting_trial(s, user, rpt)
        assert err.value.details[0].field == "training.trialId" and "different trials" in err.value.message
        with pytest.raises(Invalid) as err:
            checkpoints.reporting_trial(s, user, CheckpointReport(str(uuid.uuid4()), st.CheckpointState.COMPLETED, {}, 1, {}))
        assert err.value.details[0].field == "training.trialId"


def test_checked_values() -> None:
    with pytest.raises(Invalid) as err:
        checkpoints.checked_resources({"../x": 1}, "resources")
    assert err.value.details[0].field == "resources['../x']"
    with pytest.raises(Invalid):
        checkpoints.canonical_uuid("../../etc", "uuid")
    with pytest.raises(Invalid):
        checkpoints.steps_of({"steps_completed": True})
    with pytest.raises(Invalid):
        checkpoints.reportable_state("STATE_DELETED")
    assert checkpoints.reportable_state("COMPLETED") == st.CheckpointState.COMPLETED


def test_deletion_refuses_registered_checkpoints_and_moves_the_latest_back(master) -> None:  # type: ignore[no-untyped-def]
    _, tid = a_trial(master)
    older, newer = report(master, tid, 10), report(master, tid, 20)
    registered = report(master, tid, 5)
    by = admin(master)
    with transaction(master.sessions) as s:
        m = models.create_model(s, master, by, NewModel("m1"))
        v = models.register_version(s, master, by, m, NewModelVersion(registered))
        assert v.version == 1

    with pytest.raises(Invalid) as err, transaction(master.sessions) as s:
        ckpts = checkpoints.owned_checkpoints(s, by, [newer, registered], "checkpointUuids")
        checkpoints.request_deletion(s, master, ckpts, by)
    assert [(d.field, registered in d.reason) for d in err.value.details] == [("checkpointUuids", True)]
    with master.read_sessions() as s:
        assert {c.state for c in s.scalars(select(Checkpoint))} == {st.CheckpointState.COMPLETED}  # nothing marked

    with transaction(master.sessions) as s:
        ckpts = checkpoints.owned_checkpoints(s, by, [newer, newer.upper()], "checkpointUuids")
        assert [c.uuid for c in ckpts] == [newer]
        assert checkpoints.request_deletion(s, master, ckpts, by) == 1
    with master.read_sessions() as s:
        assert s.get(Checkpoint, newer).state == st.CheckpointState.DELETING
    assert latest_of(master, tid) == older


def test_only_the_owner_changes_checkpoints(master) -> None:  # type: ignore[no-untyped-def]
    _, tid = a_trial(master)
    ckpt = report(master, tid, 10)
    stranger = Principal(kind=TokenKind.USER, token_id=0, user_id=999, username="x", admin=False)
    with master.read_sessions() as s:
        with pytest.raises(PermissionDenied):
            checkpoints.owned_checkpoints(s, stranger, [ckpt], "checkpointUuids")
        with pytest.raises(PermissionDenied):
            checkpoints.require_metadata_writer(s, stranger, s.get(Checkpoint, ckpt))
        other_trial = Principal(kind=TokenKind.ALLOCATION, token_id=0, trial_id=tid + 1)
        with pytest.raises(PermissionDenied):
            checkpoints.require_read(other_trial, s.get(Checkpoint, ckpt))


def test_shrinking_resources(master) -> None:  # type: ignore[no-untyped-def]
    _, tid = a_trial(master)
    ckpt = report(master, tid, 10)
    with transaction(master.sessions) as s:
        c = s.get(Checkpoint, ckpt)
        checkpoints.set_resources(c, {"model.pt": 10})
        assert (c.state, c.size_bytes) == (st.CheckpointState.PARTIALLY_DELETED, 10)
        checkpoints.set_resources(c, {})
        assert (c.state, c.resources, c.size_bytes) == (st.CheckpointState.DELETED, {}, 0)


def test_model_registry_rules(master) -> None:  # type: ignore[no-untyped-def]
    exp_id, tid = a_trial(master)
    ckpt = report(master, tid, 10)
    by = admin(master)
    stranger = Principal(kind=TokenKind.USER, token_id=0, user_id=999, username="x", admin=False)
    with transaction(master.sessions) as s:
        m = models.create_model(s, master, by, NewModel("m1", labels=["a"]))
    with pytest.raises(Conflict), transaction(master.sessions) as s:
        models.create_model(s, master, by, NewModel("m1"))
    with transaction(master.sessions) as s:
        m = models.get_model(s, "m1")
        with pytest.raises(PermissionDenied):
            models.register_version(s, master, stranger, m, NewModelVersion(ckpt))
        with pytest.raises(Invalid):
            models.register_version(s, master, by, m, NewModelVersion(str(uuid.uuid4())))
        assert [models.register_version(s, master, by, m, NewModelVersion(ckpt)).version for _ in range(2)] == [1, 2]
        s.get(Checkpoint, ckpt).state = st.CheckpointState.DELETING
        with pytest.raises(Conflict):
            models.register_version(s, master, by, m, NewModelVersion(ckpt))
    with master.read_sessions() as s:
        m = s.scalar(select(Model))
        assert models.version_count(s, m) == 2 and models.get_version(s, m, 2).checkpoint_uuid == ckpt
        assert [x.name for x in models.list_models(s, name="1")] == ["m1"] and models.list_models(s, archived=True) == []
    # GC runs on ended experiments only
    with pytest.raises(Conflict), transaction(master.sessions) as s:
        checkpoints.collect_garbage(s, master, s.get(Experiment, exp_id))


def test_lists_order_by_the_searcher_metric_best_first(master) -> None:  # type: ignore[no-untyped-def]
    _, tid = a_trial(master)  # smaller is better
    by_step = {steps: report(master, tid, steps) for steps in (10, 20, 30, 40)}
    reports = [MetricReport("validation", tid, 1, steps, {"val_loss": value, "acc": steps})
               for steps, value in ((10, 0.5), (20, 0.2), (30, "NaN"))]  # 40: no validation
    with transaction(master.sessions) as s:
        trial, exp = metrics.lock_for_reports(s, tid, {"validation"})
        metrics.store_reports(s, master, trial, exp, reports)
    with transaction(master.sessions) as s:
        s.get(Checkpoint, by_step[40]).state = st.CheckpointState.DELETING
    with master.read_sessions() as s:
        ckpts = checkpoints.of_trial(s, tid)
        ctx = checkpoints.context(s, ckpts)
        steps = [c.steps_completed for c in checkpoints.ordered(ckpts, ctx, attr="SORT_BY_SEARCHER_METRIC",
                                                                metric=None, desc=None)]
        assert steps[:2] == [20, 10] and set(steps[2:]) == {30, 40}
        by_acc = checkpoints.ordered(ckpts, ctx, attr="SORT_BY_UNSPECIFIED", metric="acc", desc=True)
        assert [c.steps_completed for c in by_acc][:3] == [30, 20, 10]
        by_batch = checkpoints.ordered(ckpts, ctx, attr="SORT_BY_BATCH_NUMBER", metric=None, desc=None)
        assert [c.steps_completed for c in by_batch] == [10, 20, 30, 40]
        gone = checkpoints.with_wire_states(ckpts, {"STATE_DELETED"})
        assert [c.uuid for c in gone] == [by_step[40]]
