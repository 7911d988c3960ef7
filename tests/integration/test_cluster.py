"""End to end on a real local cluster: master and agents as processes, trials as processes, on
SQLite and on a throwaway PostgreSQL."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import kill9, pid_alive, trial_config

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def product_default_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """These clusters run the master as shipped: a control process and one API worker per core."""
    monkeypatch.setenv("SHIPYARD_API_WORKERS", "0")


def _pids(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"pid (\d+)", text)]


def test_trial_runs_with_metrics_logs_checkpoints(cluster_factory) -> None:
    c = cluster_factory(agents=1)
    exp_id = c.submit(trial_config(length=30))
    c.wait_experiment(exp_id)
    (trial,) = c.trials(exp_id)
    assert trial["state"] == "STATE_COMPLETED"
    training = c.metrics(trial["id"], "training")
    validation = c.metrics(trial["id"], "validation")
    assert [m["stepsCompleted"] for m in training] == list(range(1, 31))
    assert [m["stepsCompleted"] for m in validation] == [10, 20, 30]
    ckpts = c.get(f"/api/v1/trials/{trial['id']}/checkpoints")["checkpoints"]
    assert {ck["metadata"]["steps_completed"] for ck in ckpts} >= {30}
    assert f"trial {trial['id']} run 1" in c.logs(trial["id"])
    # the slot is free again
    agents = c.get("/api/v1/agents")["agents"]
    assert all(s["container"] is None for a in agents for s in a["slots"].values())


def test_missing_entrypoint_fails_with_a_clear_log_line(cluster_factory) -> None:
    c = cluster_factory(agents=1)
    cfg = trial_config(length=5, max_restarts=0)
    cfg["entrypoint"] = ["does-not-exist-binary", "--flag"]
    exp_id = c.submit(cfg)
    c.wait_experiment(exp_id, states=("STATE_ERROR",), timeout=60)
    (trial,) = c.trials(exp_id)
    assert "does-not-exist-binary" in c.logs(trial["id"])


def test_kill_stops_the_process_within_the_grace_period(cluster_factory) -> None:
    c = cluster_factory(agents=1)
    exp_id = c.submit(trial_config(length=100000, hparams={"step_sleep": 0.05}))
    trial_id = c.wait(lambda: next((t["id"] for t in c.trials(exp_id) if t["state"] == "STATE_RUNNING"), None),
                      60, "trial running")
    pid = c.wait(lambda: (_pids(c.logs(trial_id)) or [None])[0], 30, "trial pid in logs")
    assert pid_alive(pid)
    t0 = time.monotonic()
    c.post(f"/api/v1/experiments/{exp_id}/kill")
    c.wait(lambda: not pid_alive(pid), 3 + 10, "trial process gone")
    killed_after = time.monotonic() - t0
    c.wait_experiment(exp_id, states=("STATE_CANCELED",), timeout=30)
    assert killed_after < 3 + 10  # grace (3 s) + the agent's poll interval


def test_agent_sigkill_frees_slots_and_the_trial_restarts_elsewhere(cluster_factory) -> None:
    c = cluster_factory(agents=1)
    exp_id = c.submit(trial_config(length=60, hparams={"step_sleep": 0.1}))
    trial_id = c.wait(lambda: next((t["id"] for t in c.trials(exp_id) if t["state"] == "STATE_RUNNING"), None),
                      60, "trial running")
    pid = c.wait(lambda: (_pids(c.logs(trial_id)) or [None])[0], 30, "trial pid")
    agent = c.data["agents"][0]
    kill9(agent["pid"])
    # the agent's trial process does not outlive it
    c.wait(lambda: not pid_alive(pid), 15, "orphaned trial process gone")
    # the master notices (heartbeat timeout 8 s), ends the allocation and frees the slot
    tasks = c.wait(lambda: (lambda ts: ts if ts and all(t["endCause"] == "agent_lost" for t in ts) else None)(
        [t for t in c.get("/api/v1/tasks", includeEnded=True)["allocationIdToSummary"].values()
         if t["trialId"] == trial_id and t["state"] == "terminated"]), 75, "allocation ended as agent_lost")
    assert tasks
    assert c.wait(lambda: [a for a in c.get("/api/v1/agents")["agents"] if not a["connected"]], 10, "agent disconnected")
    trial = c.get(f"/api/v1/trials/{trial_id}")["trial"]
    assert trial["restarts"] == 0  # an infrastructure failure is not the trial's fault
    # a new agent takes the trial over; it resumes from its checkpoint and completes
    log = Path(agent["log"]).with_name("replacement.log")
    token_file = Path(c.data["state_dir"]) / "agent-token"
    proc = subprocess.Popen([sys.executable, "-m", "agent_bootstrap.agent", "--master-url", c.url, "--agent-id",
                             "replacement", "--token-file", str(token_file), "--work-dir",
                             str(Path(c.data["state_dir"]) / "replacement")],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        c.wait_experiment(exp_id, timeout=120)
        steps = [m["stepsCompleted"] for m in c.metrics(trial_id, "training")]
        assert steps == list(range(1, 61))  # continuous, nothing duplicated
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_failed_trial_restarts_from_its_checkpoint(cluster_factory) -> None:
    c = cluster_factory(agents=1)
    exp_id = c.submit(trial_config(length=40, hparams={"crash_at": 25}))
    c.wait_experiment(exp_id)
    (trial,) = c.trials(exp_id)
    assert trial["restarts"] == 1
    logs = c.logs(trial["id"])
    assert "crashing on purpose at step 25" in logs and "at step 20" in logs  # resumed from the step-20 checkpoint
    steps = [m["stepsCompleted"] for m in c.metrics(trial["id"], "training")]
    assert steps == list(range(1, 41))


def test_trial_errors_after_max_restarts(cluster_factory) -> None:
    c = cluster_factory(agents=1)
    cfg = trial_config(length=10, max_restarts=1)
    cfg["entrypoint"] = "python3 -c 'import sys; sys.exit(3)'"
    exp_id = c.submit(cfg)
    c.wait_experiment(exp_id, states=("STATE_ERROR",), timeout=60)
    (trial,) = c.trials(exp_id)
    assert trial["state"] == "STATE_ERROR" and trial["restarts"] == 2


def test_adaptive_asha_completes_with_early_stopped_trials(cluster_factory) -> None:
    c = cluster_factory(agents=2)
    searcher = {"name": "adaptive_asha", "metric": "validation_loss", "max_length": {"batches": 40},
                "max_trials": 6, "max_concurrent_trials": 2, "divisor": 2, "max_rungs": 3, "mode": "aggressive"}
    cfg = trial_config(searcher=searcher, hparams={"lr": {"type": "log", "base": 10, "minval": -2, "maxval": -0.3},
                                                    "validate_every": 5})
    cfg["reproducibility"] = {"experiment_seed": 11}
    exp_id = c.submit(cfg)
    c.wait_experiment(exp_id, timeout=240)
    trials = c.trials(exp_id)
    assert len(trials) == 6
    assert all(t["state"] == "STATE_COMPLETED" for t in trials)
    lengths = sorted(max([m["stepsCompleted"] for m in c.metrics(t["id"], "validation")] or [0]) for t in trials)
    assert lengths[0] < 40 and lengths[-1] == 40  # some stopped early, the best trained fully


def test_master_sigkill_mid_experiment_loses_nothing(cluster_factory) -> None:
    c = cluster_factory(agents=2)
    searcher = {"name": "random", "metric": "validation_loss", "max_length": {"batches": 40}, "max_trials": 4,
                "max_concurrent_trials": 2}
    cfg = trial_config(searcher=searcher, hparams={"lr": {"type": "double", "minval": 0.05, "maxval": 0.3},
                                                    "step_sleep": 0.05})
    cfg["checkpoint_storage"] = {"save_trial_latest": 100, "save_trial_best": 0, "save_experiment_best": 0}
    exp_id = c.submit(cfg)

    def mid_flight() -> bool:
        trials = c.trials(exp_id)
        return any(t["state"] == "STATE_RUNNING" and (t.get("totalBatchesProcessed") or 0) >= 12 for t in trials)

    c.wait(mid_flight, 90, "a trial mid-way")
    c.kill_master()
    time.sleep(3)  # trials keep running and buffer their reports meanwhile
    c.restart_master()
    c.wait_experiment(exp_id, timeout=240)
    trials = c.trials(exp_id)
    assert len(trials) == 4 and len({t["id"] for t in trials}) == 4  # no duplicate trial
    for t in trials:
        assert t["state"] == "STATE_COMPLETED"
        assert [m["stepsCompleted"] for m in c.metrics(t["id"], "training")] == list(range(1, 41))
        assert [m["stepsCompleted"] for m in c.metrics(t["id"], "validation")] == [10, 20, 30, 40]
        ckpts = c.get(f"/api/v1/trials/{t['id']}/checkpoints")["checkpoints"]
        assert sorted(ck["metadata"]["steps_completed"] for ck in ckpts) == [10, 20, 30, 40]
