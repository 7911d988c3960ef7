"""Issue 9's and issue 27's "Done when": trials outlive a master outage of any length. A real local
cluster (master and two agents as processes, trials as processes): the master is SIGKILLed while a
trial runs on each agent, stays down longer than every retry timer of the harness and the agent,
and is restarted on the same database.

The timers are shrunk by configuration so a short outage outlasts them many times over:
SHIPYARD_RETRY_WAIT_MAX_S=1 caps every wait of the trial's harness (API calls, checkpoint records,
metrics) at 1 s, so the 30 s outage is ~60 of its attempts (the bound that killed trials was 30
attempts, ~15 s at that cap); DET_AGENT_AGENT_RECONNECT_BACKOFF_MAX=1 caps the agent's reconnects,
events, logs and model-definition fetches at 1 s (the model definition's bound was 5 attempts).
benchmarks/outage.py runs the full 10 minutes with the product's own timers.

During the outage each trial reports metrics (they go to its disk spool) and reaches a checkpoint,
whose record waits for the master. One trial's process is then SIGKILLed while the master is
still down: its exit is held by its agent and heard after the restart, so it counts in `restarts`
(1) and the trial reruns from its last recorded checkpoint. The other finishes on its first run
and allocation with restarts 0. Both have every metric step exactly once and every checkpoint
recorded once. The agents learn the master's reconnect cap (`agent_reconnect_cap_s`, 2 s here) at
registration, so they come back within a few seconds of the restart."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest

from tests.integration.conftest import pid_alive, trial_config

# On PostgreSQL (what a cluster whose master goes away runs on): the master SIGKILLed and restarted
# on SQLite is tests/integration/test_cluster.py's master_sigkill test, on both databases.
pytestmark = [pytest.mark.integration, pytest.mark.postgres,
              pytest.mark.parametrize("db_url", ["postgres"], indirect=True)]

RECONNECT_CAP_S = 2
OUTAGE_S = 30
RETRY_WAIT_MAX_S = 1  # the harness's and the agent's cap of one wait, for this test
STEP_S = 0.25
VALIDATE_EVERY = 40  # a validation and a checkpoint every 10 s
LENGTH = 120
VALIDATIONS = list(range(VALIDATE_EVERY, LENGTH + 1, VALIDATE_EVERY))


def _allocations(c: Any, trial_id: int) -> list[dict[str, Any]]:
    tasks = c.get("/api/v1/tasks", includeEnded=True)["allocationIdToSummary"].values()
    return sorted((t for t in tasks if t["trialId"] == trial_id), key=lambda t: t["registeredTime"])


def _checkpoint_steps(c: Any, trial_id: int) -> list[int]:
    ckpts = c.get(f"/api/v1/trials/{trial_id}/checkpoints")["checkpoints"]
    return sorted(int(ck["metadata"]["steps_completed"]) for ck in ckpts)


def test_trials_outlive_a_master_outage_longer_than_every_retry_timer(
        cluster_factory: Any, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agents inherit this environment, and their trials inherit theirs.
    monkeypatch.setenv("SHIPYARD_RETRY_WAIT_MAX_S", str(RETRY_WAIT_MAX_S))
    monkeypatch.setenv("DET_AGENT_AGENT_RECONNECT_BACKOFF_MAX", str(RETRY_WAIT_MAX_S))
    c = cluster_factory(agents=2, master_yaml={"agent_reconnect_cap_s": RECONNECT_CAP_S})
    searcher = {"name": "random", "metric": "validation_loss", "max_length": {"batches": LENGTH},
                "max_trials": 2, "max_concurrent_trials": 2}
    cfg = trial_config("outage", searcher=searcher, hparams={
        "lr": {"type": "double", "minval": 0.05, "maxval": 0.3}, "step_sleep": STEP_S,
        "validate_every": VALIDATE_EVERY})
    exp_id = c.submit(cfg)

    def both_past_a_checkpoint() -> list[dict[str, Any]] | None:
        trials = c.trials(exp_id)
        ok = len(trials) == 2 and all(t["state"] == "STATE_RUNNING" and
                                      (t.get("totalBatchesProcessed") or 0) > VALIDATE_EVERY for t in trials)
        return trials if ok else None

    # Each has a recorded checkpoint, and ~10 s of reports to make before its next one, in the outage.
    before = c.wait(both_past_a_checkpoint, 120, "two trials running past their first checkpoint")
    survivor, victim = sorted(before, key=lambda t: t["id"])
    allocs_before = {t["id"]: [a["allocationId"] for a in _allocations(c, t["id"])] for t in before}
    assert all(len(a) == 1 for a in allocs_before.values()), allocs_before
    on_agents = {a["agentId"] for t in before for a in _allocations(c, t["id"])}
    assert on_agents == {"local-0", "local-1"}  # one trial on each agent
    victim_pid = int(re.search(rf"trial {victim['id']} run 1 pid (\d+)", c.logs(victim["id"])).group(1))

    c.kill_master()
    time.sleep(OUTAGE_S - 10)
    os.kill(victim_pid, signal.SIGKILL)  # the trial's own process dies while the master is away
    time.sleep(10)
    # The agents kept trying all along, and the survivor kept running.
    assert all(pid_alive(a["pid"]) for a in c.data["agents"]), "an agent gave up on the master"
    c.restart_master()

    # The agents re-register within their (announced) cap; nothing was declared lost.
    c.wait(lambda: {a["id"] for a in c.get("/api/v1/agents")["agents"] if a["connected"]} == on_agents,
           60, "both agents reconnected")
    c.wait_experiment(exp_id, timeout=LENGTH * STEP_S * 2 + 120)
    trials = {t["id"]: t for t in c.trials(exp_id)}
    assert all(t["state"] == "STATE_COMPLETED" for t in trials.values()), trials

    t = trials[survivor["id"]]
    assert (t["runId"], t["restarts"]) == (survivor["runId"], 0)
    allocs = _allocations(c, t["id"])
    assert [a["allocationId"] for a in allocs] == allocs_before[t["id"]]  # never replaced
    # Its process exited 0 by itself: "preempted" when the master had already asked the finished
    # trial to stop (its searcher operation was complete), never agent_lost.
    assert allocs[0]["exitCode"] == 0 and allocs[0]["endCause"] in ("exited", "preempted"), allocs[0]
    logs = c.logs(t["id"])
    assert logs.count(f"trial {t['id']} run ") == 1 and "resumed from" not in logs
    assert "event=metrics_spool_opened" in logs  # the outage's reports went through its spool

    v = trials[victim["id"]]
    assert v["restarts"] == 1  # its exit code was heard after the restart: it counts
    allocs = _allocations(c, v["id"])
    assert len(allocs) == 2 and allocs[0]["endCause"] == "exited" and allocs[0]["exitCode"] not in (0, None), allocs
    assert "resumed from" in c.logs(v["id"])

    for tid in trials:
        steps = [m["stepsCompleted"] for m in c.metrics(tid, "training")]
        assert steps == list(range(1, LENGTH + 1))  # each step exactly once: none lost, none doubled
        assert [m["stepsCompleted"] for m in c.metrics(tid, "validation")] == VALIDATIONS
    # Every checkpoint the survivor took was recorded, once (the one in the outage after it).
    assert _checkpoint_steps(c, survivor["id"]) == VALIDATIONS
    assert all(pid_alive(a["pid"]) for a in c.data["agents"])
