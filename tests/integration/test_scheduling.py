"""Scheduling end to end on a real local cluster (master, agents and trials as processes): a
high-priority experiment preempts a low-priority one, which checkpoints, yields and resumes with
continuous steps; `det job update` reorders the queue and the new order is what runs;
`det agent disable --drain` empties an agent (its trial moves on after the drain timeout).

SQLite only: the scheduling decisions and their compare-and-sets are tested on both databases in
tests/control_plane/ (loops/test_placement.py, services/test_jobs.py); here what matters is that
processes stop, yield and resume."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.conftest import trial_config

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


def _allocs(c: Any, trial_id: int) -> list[dict[str, Any]]:
    found = [t for t in c.get("/api/v1/tasks", includeEnded="true")["allocationIdToSummary"].values()
             if t["trialId"] == trial_id]
    return sorted(found, key=lambda t: t["registeredTime"])


def _running_trial(c: Any, exp_id: int) -> int:
    return c.wait(lambda: next((t["id"] for t in c.trials(exp_id) if t["state"] == "STATE_RUNNING"), None),
                  60, f"a trial of experiment {exp_id} running")


def _validations(c: Any, trial_id: int) -> list[int]:
    return [m["stepsCompleted"] for m in c.metrics(trial_id, "validation")]


def test_a_high_priority_experiment_preempts_a_low_one_which_resumes_from_its_checkpoint(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=1)  # one slot: the pool is full with one trial
    low = c.submit(trial_config("low", length=60, hparams={"step_sleep": 0.05}, resources={"priority": 60}))
    low_trial = _running_trial(c, low)
    c.wait(lambda: _validations(c, low_trial), 60, "the low trial's first checkpoint")
    high = c.submit(trial_config("high", length=10, resources={"priority": 10}))

    c.wait_experiment(high, timeout=120)
    c.wait_experiment(low, timeout=180)
    (high_trial,) = c.trials(high)
    first, *rest = _allocs(c, low_trial)
    assert first["endCause"] == "preempted" and rest, first  # it yielded, then ran again
    assert first["endedTime"] <= _allocs(c, high_trial["id"])[0]["startedTime"]
    assert c.get(f"/api/v1/trials/{low_trial}")["trial"]["restarts"] == 0  # a preemption is no failure
    logs = c.logs(low_trial)
    assert "preempted at step" in logs and "resumed from" in logs
    assert _validations(c, low_trial) == [10, 20, 30, 40, 50, 60]  # continuous across the preemption
    steps = [m["stepsCompleted"] for m in c.metrics(low_trial, "training")]
    assert steps == list(range(1, 61))


def _det(c: Any, *argv: str) -> str:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cli.main", "-m", c.url, *argv], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_det_job_update_reorders_the_queue_and_the_new_order_runs(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=1)
    blocker = c.submit(trial_config("blocker", length=40, hparams={"step_sleep": 0.05}))
    _running_trial(c, blocker)
    a = c.submit(trial_config("queued-a", length=5))
    b = c.submit(trial_config("queued-b", length=5))
    jobs = {e: c.experiment(e)["jobId"] for e in (a, b)}

    assert f"Updated job {jobs[b]}" in _det(c, "job", "update", jobs[b], "--ahead-of", jobs[a])
    listed = [j["jobId"] for j in json.loads(_det(c, "job", "list", "--resource-pool", "default", "--json"))]
    assert listed.index(jobs[b]) < listed.index(jobs[a])

    for exp in (blocker, a, b):
        c.wait_experiment(exp, timeout=120)
    start = {e: _allocs(c, c.trials(e)[0]["id"])[0]["startedTime"] for e in (a, b)}
    assert start[b] < start[a]  # b was submitted after a, and ran first


def test_det_agent_disable_drain_empties_the_agent(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=2, master_yaml={"agent_drain_timeout_s": 2})
    exp = c.submit(trial_config("drained", length=120, hparams={"step_sleep": 0.05}))
    trial_id = _running_trial(c, exp)
    c.wait(lambda: _validations(c, trial_id), 60, "a first checkpoint")
    (alloc,) = [t for t in _allocs(c, trial_id) if t["state"] != "terminated"]
    drained = alloc["agentId"]

    assert f"Draining agent {drained}" in _det(c, "agent", "disable", "--drain", drained)
    c.wait_experiment(exp, timeout=180)
    first, *rest = _allocs(c, trial_id)
    assert (first["agentId"], first["endCause"]) == (drained, "preempted")  # moved on after the timeout
    assert rest and all(t["agentId"] != drained for t in rest)
    assert _validations(c, trial_id) == list(range(10, 121, 10))  # continuous across the move
    agent = next(a for a in c.get("/api/v1/agents")["agents"] if a["id"] == drained)
    assert agent["enabled"] is False and all(s["container"] is None for s in agent["slots"].values())
