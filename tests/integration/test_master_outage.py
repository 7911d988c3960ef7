"""Issue 9's "Done when": trials outlive a master outage. A real local cluster (master and two
agents as processes, trials as processes): the master is SIGKILLed while a trial runs on each agent,
stays down for three minutes of real time (SQLite; a shorter outage on PostgreSQL), and is
restarted on the same database. Every trial must finish in its first run, on its first allocation,
with every metric step reported exactly once.

The agents learn the master's reconnect cap (`agent_reconnect_cap_s`, 2 s here) at registration, so
they come back within a few seconds of the restart, while their own configuration would let them
wait 15 s."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.conftest import pid_alive, trial_config

pytestmark = pytest.mark.integration

RECONNECT_CAP_S = 2


def _allocations(c: Any, trial_id: int) -> list[dict[str, Any]]:
    tasks = c.get("/api/v1/tasks", includeEnded=True)["allocationIdToSummary"].values()
    return sorted((t for t in tasks if t["trialId"] == trial_id), key=lambda t: t["registeredTime"])


def test_trials_outlive_a_long_master_outage(cluster_factory, db_url: str) -> None:
    sqlite = db_url.startswith("sqlite")
    outage_s = 180 if sqlite else 45
    # One step (and one training report) per second, long enough to be running through the whole
    # outage and for a while after the restart.
    length = outage_s + 40
    c = cluster_factory(agents=2, master_yaml={"agent_reconnect_cap_s": RECONNECT_CAP_S})
    searcher = {"name": "random", "metric": "validation_loss", "max_length": {"batches": length},
                "max_trials": 2, "max_concurrent_trials": 2}
    cfg = trial_config("outage", searcher=searcher, hparams={
        "lr": {"type": "double", "minval": 0.05, "maxval": 0.3}, "step_sleep": 1.0, "validate_every": length})
    exp_id = c.submit(cfg)

    def both_running() -> list[dict[str, Any]] | None:
        trials = c.trials(exp_id)
        ok = len(trials) == 2 and all(
            t["state"] == "STATE_RUNNING" and (t.get("totalBatchesProcessed") or 0) >= 5 for t in trials)
        return trials if ok else None

    before = c.wait(both_running, 120, "two trials running and reporting")
    allocs_before = {t["id"]: [a["allocationId"] for a in _allocations(c, t["id"])] for t in before}
    assert all(len(a) == 1 for a in allocs_before.values()), allocs_before
    on_agents = {a["agentId"] for t in before for a in _allocations(c, t["id"])}
    assert on_agents == {"local-0", "local-1"}  # one trial on each agent
    runs_before = {t["id"]: (t["runId"], t["restarts"]) for t in before}

    c.kill_master()
    time.sleep(outage_s)
    # The agents kept trying all along, and their trials kept running.
    assert all(pid_alive(a["pid"]) for a in c.data["agents"]), "an agent gave up on the master"
    c.restart_master()

    # The agents re-register within their (announced) cap; nothing was declared lost.
    c.wait(lambda: {a["id"] for a in c.get("/api/v1/agents")["agents"] if a["connected"]} == on_agents,
           60, "both agents reconnected")
    c.wait_experiment(exp_id, timeout=length + 120)
    for t in c.trials(exp_id):
        assert t["state"] == "STATE_COMPLETED"
        assert (t["runId"], t["restarts"]) == runs_before[t["id"]]
        allocs = _allocations(c, t["id"])
        assert [a["allocationId"] for a in allocs] == allocs_before[t["id"]]  # never replaced
        # Its process exited 0 by itself: "preempted" when the master had already asked the
        # finished trial to stop (its searcher operation was complete), never agent_lost.
        assert allocs[0]["exitCode"] == 0 and allocs[0]["endCause"] in ("exited", "preempted"), allocs[0]
        steps = [m["stepsCompleted"] for m in c.metrics(t["id"], "training")]
        assert steps == list(range(1, length + 1))  # each step exactly once: none lost, none doubled
        assert [m["stepsCompleted"] for m in c.metrics(t["id"], "validation")] == [length]
        logs = c.logs(t["id"])
        assert logs.count(f"trial {t['id']} run ") == 1 and "resumed from" not in logs
    assert all(pid_alive(a["pid"]) for a in c.data["agents"])
