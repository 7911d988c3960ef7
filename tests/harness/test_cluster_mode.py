"""The Core API on a cluster, against the fake master: the wire contract of docs/PROTOCOL.md."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import harness.core
from harness.storage import StorageNotWritable
from tests.harness.conftest import cluster_env
from tests.harness.fake_master import FakeMaster

pytestmark = pytest.mark.integration


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def op(length: int) -> dict[str, object]:
    return {"op": {"validateAfter": {"length": length}}, "completed": False}


def test_training_flow_on_the_wire(fake_master: FakeMaster, tmp_path: Path) -> None:
    # The second answer repeats the op just completed (the master has not moved on yet): not new work.
    fake_master.searcher_ops = [op(10), op(10), op(20), {"op": None, "completed": True}]
    env = cluster_env(fake_master, tmp_path / "ckpts")
    checkpoints = []
    with harness.core.init(env=env) as ctx:
        assert not ctx.off_cluster
        info = ctx.info
        assert (info.trial_id, info.experiment_id, info.allocation_id, info.task_id) == (7, 3, "3.7.1", "3.7")
        assert (info.trial_run_id, info.trial_seed, info.slot_ids, info.agent_id) == (2, 1234, [0], "agent-1")
        assert info.hparams == {"lr": 0.1, "layers": 2} and info.latest_checkpoint is None
        assert info.experiment_config["searcher"]["metric"] == "val_loss"
        assert ctx.searcher.get_configured_units() is harness.core.Unit.BATCHES

        steps = 0
        for o in ctx.searcher.operations():
            while steps < o.length:
                steps += 1
                ctx.train.report_training_metrics(steps, {"loss": 1.0 / steps})
            o.report_progress(steps)
            ctx.train.report_validation_metrics(steps, {"val_loss": 0.5 / steps})
            with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, uuid):
                (path / "state.json").write_text(json.dumps({"steps": steps}))
            checkpoints.append(uuid)
            o.report_completed(0.5 / steps)
        assert ctx.checkpoint.get_metadata(checkpoints[0]) == {"steps_completed": 10}

    completed = fake_master.bodies("POST", r"/api/v1/trials/7/searcher/completed_operation")
    assert completed == [{"op": {"length": 10}, "searcherMetric": 0.05},
                         {"op": {"length": 20}, "searcherMetric": 0.025}]
    # Validation metrics reach the master before the operation they justify is completed.
    order = [(r.path, r.body) for r in fake_master.requests if r.method == "POST"]
    for length in (10, 20):
        i_val = next(i for i, (p, b) in enumerate(order) if p.endswith("/metrics/batch") and any(
            rep["group"] == "validation" and rep["metrics"]["stepsCompleted"] == length for rep in b["reports"]))
        i_done = next(i for i, (p, b) in enumerate(order)
                      if p.endswith("/completed_operation") and b["op"]["length"] == length)
        assert i_val < i_done
    steps_seen = [r["metrics"]["stepsCompleted"] for r in fake_master.metric_reports() if r["group"] == "training"]
    assert steps_seen == list(range(1, 21))

    body = fake_master.checkpoints[checkpoints[0]]
    assert body["taskId"] == "3.7" and body["allocationId"] == "3.7.1"
    assert body["state"] == "STATE_COMPLETED"
    assert body["training"] == {"trialId": 7, "experimentId": 3}
    assert body["metadata"] == {"steps_completed": 10}
    assert body["resources"]["state.json"] == str(len(json.dumps({"steps": 10})))
    assert "metadata.json" in body["resources"]
    assert body["reportTime"].endswith("Z")
    assert (tmp_path / "ckpts" / checkpoints[0] / "state.json").exists()

    progress = fake_master.bodies("POST", r"/api/v1/trials/7/progress")
    assert progress[-1] == {"progress": 1.0, "isRaw": False}
    assert all(r.headers.get("Authorization") == "Bearer alloc-token-1" for r in fake_master.requests)


def test_preemption_is_seen_acknowledged_and_stops_the_searcher(fake_master: FakeMaster, tmp_path: Path) -> None:
    # The searcher has nothing for this trial yet; only preemption can end the iteration.
    fake_master.searcher_ops = [{"op": None, "completed": False}]
    with harness.core.init(env=cluster_env(fake_master, tmp_path / "ckpts")) as ctx:
        assert ctx.preempt.should_preempt() is False
        wait_until(lambda: len(fake_master.bodies("GET", r"/api/v1/allocations/3\.7\.1/signals/preemption")) >= 1)
        query = [r.query for r in fake_master.requests if r.path.endswith("/signals/preemption")][0]
        assert query == {"timeoutSeconds": ["60"]}
        fake_master.preempt()
        wait_until(lambda: ctx.preempt.should_preempt())
        assert list(ctx.searcher.operations()) == []
        assert ctx.preempt.should_preempt() is True
    acks = fake_master.bodies("POST", r"/api/v1/allocations/3\.7\.1/signals/ack_preemption")
    assert len(acks) == 1


def test_best_validation_and_early_exit(fake_master: FakeMaster, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        with harness.core.init(env=cluster_env(fake_master, tmp_path / "ckpts")) as ctx:
            assert ctx.train.get_experiment_best_validation() is None
            fake_master.best_validation = 0.125
            assert ctx.train.get_experiment_best_validation() == 0.125
            raise harness.core.InvalidHP("lr too large for this batch size")
    assert exited.value.code == 0
    assert fake_master.bodies("POST", r"/api/v1/trials/7/early_exit") == [{"reason": "EXITED_REASON_INVALID_HP"}]


def test_checkpoint_needs_steps_completed_on_a_cluster(fake_master: FakeMaster, tmp_path: Path) -> None:
    with harness.core.init(env=cluster_env(fake_master, tmp_path / "ckpts")) as ctx:
        with pytest.raises(ValueError, match="steps_completed"):
            with ctx.checkpoint.store_path({"other": 1}):
                pass
    assert fake_master.checkpoints == {}


def test_unwritable_storage_fails_before_talking_to_the_master(fake_master: FakeMaster, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageNotWritable, match="is not writable"):
        harness.core.init(env=cluster_env(fake_master, blocker / "ckpts"))
    assert fake_master.requests == []


def test_metrics_survive_the_master_restarting_mid_training(fake_master: FakeMaster, tmp_path: Path) -> None:
    cfg = harness.core.ReporterConfig(backoff_initial_s=0.01, backoff_max_s=0.1)
    with harness.core.init(env=cluster_env(fake_master, tmp_path / "ckpts"), reporter_config=cfg) as ctx:
        reporter = ctx.reporter
        assert reporter is not None
        for step in range(1, 51):
            ctx.train.report_training_metrics(step, {"loss": 0.1})
        fake_master.refuse()
        for step in range(51, 101):
            ctx.train.report_training_metrics(step, {"loss": float("nan")})
        wait_until(lambda: reporter.stats.retries >= 2)
        fake_master.restore()
    reports = fake_master.metric_reports()
    assert sorted({r["metrics"]["stepsCompleted"] for r in reports}) == list(range(1, 101))
    assert reports[-1]["metrics"]["metrics"]["avgMetrics"] == {"loss": "NaN"}
