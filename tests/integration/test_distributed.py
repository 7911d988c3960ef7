"""Distributed trials end to end on a real local cluster: a trial of 2 slots on two 1-slot agents
runs as one process group per agent under `python -m harness.launch.torch_distributed`, rendezvous
from the master, torch.distributed on gloo (the CPU path of the same code that runs NCCL on GPUs).

SQLite only: what is distributed here is the processes, not the database (the gang's records are
tested on both databases in tests/control_plane/services/test_gangs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import model_files, pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spirals"
DDP_MODEL = Path(__file__).parent / "model_ddp"


def _tasks(c, exp_id: int) -> list[dict]:  # type: ignore[no-untyped-def]
    return [t for t in c.get("/api/v1/tasks", includeEnded="true")["allocationIdToSummary"].values()
            if t["experimentId"] == exp_id]


def test_the_example_trains_data_parallel_across_two_agents_and_only_the_chief_reports(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=2)
    cfg = yaml.safe_load((EXAMPLE / "distributed.yaml").read_text())
    cfg["hyperparameters"].update(hidden=16, validate_every=30)
    cfg["searcher"]["max_length"] = {"batches": 60}
    exp_id = c.submit(cfg, model_files(EXAMPLE))
    c.wait_experiment(exp_id, timeout=240)

    (trial,) = c.trials(exp_id)
    logs = c.logs(trial["id"])
    for rank in (0, 1):  # one process group per agent, each told its rank by the rendezvous
        assert f"--nnodes=2 --node_rank={rank} --nproc_per_node=1" in logs
        assert f"rank {rank} of 2: all_reduce sum=3" in logs
    (alloc,) = _tasks(c, exp_id)
    assert alloc["slotsNeeded"] == 2 and alloc["exitCode"] == 0
    groups = alloc["processGroups"]
    assert len({g["agentId"] for g in groups}) == 2 and [len(g["slotIds"]) for g in groups] == [1, 1]
    assert [(g["state"], g["exitCode"]) for g in groups] == [("exited", 0), ("exited", 0)]
    training = [m["stepsCompleted"] for m in c.metrics(trial["id"], "training")]
    assert training == [25, 50]  # the chief's reports, once each
    assert [m["stepsCompleted"] for m in c.metrics(trial["id"], "validation")] == [30, 60]
    ckpts = c.get(f"/api/v1/trials/{trial['id']}/checkpoints")["checkpoints"]
    assert sorted(ck["metadata"]["steps_completed"] for ck in ckpts) == [30, 60]


def test_a_crashed_rank_ends_the_whole_gang_and_it_restarts_from_the_checkpoint(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=2)
    cfg = {
        "name": "ddp-crash",
        "entrypoint": "python3 -m harness.launch.torch_distributed train.py",
        "hyperparameters": {"crash_rank": 1, "crash_at": 15, "validate_every": 10, "step_sleep": 0.05},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 30}},
        "resources": {"slots_per_trial": 2},
        "max_restarts": 1,
    }
    exp_id = c.submit(cfg, model_files(DDP_MODEL))
    c.wait_experiment(exp_id, timeout=240)

    (trial,) = c.trials(exp_id)
    assert trial["restarts"] == 1
    logs = c.logs(trial["id"])
    assert "rank 1: crashing on purpose at step 15" in logs
    assert "rank 0: resumed from" in logs and "rank 1: resumed from" in logs and "at step 10" in logs
    first, second = sorted(_tasks(c, exp_id), key=lambda t: t["registeredTime"])
    assert first["endCause"] == "exited" and first["exitCode"] not in (0, None)  # torchrun's exit: 1
    # The first failure reported: rank 1's, or rank 0's when its broken collective failed it first.
    assert re.match(r"rank [01] \(agent [^)]+\): exited with code", first["exitReason"] or ""), first["exitReason"]
    assert second["exitCode"] == 0
    # The chief of the first run (on the other agent) was stopped, not left waiting on its peer.
    first_pids = [int(p) for p in re.findall(r"rank 0 of 2 trial \d+ run 1 pid (\d+)", logs)]
    assert first_pids and not any(pid_alive(p) for p in first_pids)
    validation = [m["stepsCompleted"] for m in c.metrics(trial["id"], "validation")]
    assert validation == [10, 20, 30]  # continuous across the restart
