"""Consolidation end to end on a real cluster (master, agents and trials as processes), on SQLite and
PostgreSQL: an elastic `local` pool (instances are agent processes the autoscaler launches and
terminates) of 2-slot instances, worst fit so that two 1-slot trials land on two instances, each half
used. With consolidation on, one instance is emptied: its trial checkpoints, stops, resumes on the
other instance from that checkpoint with every reported step once (none lost, none repeated), no
restart counted; the emptied instance is terminated with the reason "consolidated", and the move is
in the pool's API object with its reason and saving. The second instance then holds both trials:
nothing else moves (its work fits nowhere else), and the pool says why.

The budget's refusals (moves per hour, min_run_time) are exercised against moto and the GCE fake in
tests/provisioners/test_consolidation_elastic.py."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.integration.conftest import trial_config

pytestmark = pytest.mark.integration

POOL = {
    "name": "default",
    "provider": {"type": "local", "slots_per_instance": 2, "max_instances": 3, "max_idle_agent_period": "10m",
                 "consolidation": {"enabled": True, "max_moves_per_hour": 2, "min_run_time": "3s"}},
    "scheduler": {"fitting_policy": "worst"},
}


def _pool(c: Any) -> dict[str, Any]:
    return dict(c.get("/api/v1/resource-pools/default")["resourcePool"])


def _running_on(c: Any, trial_id: int) -> str | None:
    for t in c.get("/api/v1/tasks")["allocationIdToSummary"].values():
        if t["trialId"] == trial_id and t.get("state") == "running":
            return str(t["agentId"]) if t.get("agentId") else None
    return None


def _allocs(c: Any, trial_id: int) -> list[dict[str, Any]]:
    found = [t for t in c.get("/api/v1/tasks", includeEnded="true")["allocationIdToSummary"].values()
             if t["trialId"] == trial_id]
    return sorted(found, key=lambda t: t["registeredTime"])


def _trial(c: Any, exp_id: int) -> int:
    return int(c.wait(lambda: next((t["id"] for t in c.trials(exp_id) if t["state"] == "STATE_RUNNING"), None),
                      90, f"a trial of experiment {exp_id} running"))


def test_two_half_used_instances_become_one(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=0, master_yaml={"resource_pools": [POOL], "preemption_grace_s": 60})
    slow = {"step_sleep": 0.1}
    a = c.submit(trial_config("a", length=240, hparams=slow))
    a_trial = _trial(c, a)
    first = c.wait(lambda: _running_on(c, a_trial), 30, "trial a on an agent")
    # A 2-slot trial needs a second instance; once it is done, that instance is idle (never a destination).
    x = c.submit(trial_config("x", length=3, resources={"slots_per_trial": 2}))
    c.wait_experiment(x, timeout=120)
    assert _pool(c)["consolidationMoves"] == []
    d = c.submit(trial_config("d", length=240, hparams=slow))  # worst fit: the idle instance
    d_trial = _trial(c, d)
    second = c.wait(lambda: _running_on(c, d_trial), 30, "trial d on an agent")
    assert second != first

    moves = c.wait(lambda: _pool(c)["consolidationMoves"], 60, "a consolidation move")
    [move] = moves
    moved = a_trial if move["trialId"] == a_trial else d_trial
    assert move["trialId"] == moved and "saves 2 slot-hours per hour" in move["reason"], move
    assert move["savingUnit"] == "slot-h/h" and move["saving"] == 2

    c.wait_experiment(a, timeout=180)
    c.wait_experiment(d, timeout=180)
    gone, *rest = _allocs(c, moved)
    assert gone["endCause"] == "preempted" and rest, gone  # it checkpointed and stopped, then ran again
    # Resumed on the other instance, not on a third one launched meanwhile.
    assert {gone["agentId"], rest[0]["agentId"]} == {first, second}, (gone, rest)
    assert c.get(f"/api/v1/trials/{moved}")["trial"]["restarts"] == 0  # a move is no failure
    assert "resumed from" in c.logs(moved)
    for trial in (a_trial, d_trial):  # every step reported once: none lost, none repeated
        assert [m["stepsCompleted"] for m in c.metrics(trial, "training")] == list(range(1, 241))

    # The emptied instance is gone, for the reason "consolidated"; nothing else moved.
    def emptied_ended() -> bool:
        live = [i for i in _pool(c)["instances"] if i["launchId"] == move["launchId"]]
        return not live or str(live[0]["terminateReason"] or "").startswith("consolidated")
    c.wait(emptied_ended, 60, "the emptied instance terminated")
    pool = _pool(c)
    assert len(pool["consolidationMoves"]) == 1
    assert "consolidation" in (pool["lastDecision"] or {}), pool["lastDecision"]

    # `det resource-pool describe` and the web UI's pool view list the move with its reason and saving.
    described = _det(c, "resource-pool", "describe", "default")
    assert "Consolidation moves" in described and "2 slot-h/h" in described, described
    assert move["reason"][:60] in " ".join(described.split())
    with httpx.Client(base_url=c.url) as ui:
        csrf = re.search(r'name="csrf" value="([^"]+)"', ui.get("/login").text)
        assert csrf is not None
        password = (c.state / "admin-password").read_text().strip()
        ui.post("/login", data={"username": "admin", "password": password, "csrf": csrf.group(1), "next": "/"})
        page = ui.get("/cluster").text
    moves_table = page.split('class="grid consolidation"', 1)[1].split("</table>", 1)[0]
    assert html.escape(move["reason"]) in moves_table and "2 slot-h/h" in moves_table


def _det(c: Any, *argv: str) -> str:
    out = subprocess.run([sys.executable, "-m", "cli.main", "-m", c.url, *argv], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    return out.stdout
