"""A trial that uses Determined's own `determined.core` (0.38.1) runs on a Shipyard agent's process
runtime: the agent prepares its info files per task (shipyard_common/determined_info.py), the
master answers what the Core API calls; the metrics and checkpoints appear in both CLIs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from control_plane.core import gang_run
from tests.compat.conftest import TERMINAL, CompatCluster, Det, wait_for
from tests.conftest import ADMIN_PASSWORD, ROOT

CORE_MODEL = Path(__file__).resolve().parent / "core_model"


def core_config(tmp_path: Path, python: Path, name: str, length: int, step_sleep: float = 0.0,
                storage: dict[str, Any] | None = None, **extra: Any) -> Path:
    folder = tmp_path / "checkpoints"
    folder.mkdir(exist_ok=True)
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": name, "entrypoint": [str(python), "train.py"],
        "hyperparameters": {"lr": 0.1, "step_sleep": step_sleep, "check_restore": storage is not None},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}},
        "checkpoint_storage": storage or {"type": "shared_fs", "host_path": str(folder)},
        "max_restarts": 0,
        **extra,
    }))
    return cfg


def test_determined_core_trial_runs_on_cluster(det: Det, compat_cluster: CompatCluster, compat_python: Path,
                                               tmp_path: Path) -> None:
    cfg = core_config(tmp_path, compat_python, "compat-core", 10)
    storage = tmp_path / "checkpoints"
    out = det.ok("experiment", "create", "-f", cfg, CORE_MODEL)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    assert "on cluster: trial" in out and "OFF-CLUSTER" not in out, out
    exp = compat_cluster.experiment(exp_id)
    trial = compat_cluster.trials(exp_id)[0]
    logs = det.ok("trial", "logs", trial["id"])
    assert exp["state"] == "STATE_COMPLETED", (exp["state"], logs)
    recorded = compat_cluster.get(f"/api/v1/trials/{trial['id']}/metrics", group="training")["metrics"]
    assert [m["stepsCompleted"] for m in recorded] == list(range(1, 11))
    ckpts = [c for c in compat_cluster.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
             if c["state"] == "STATE_COMPLETED"]
    # Under host_path: the shim pointed Determined's container mount (/determined_shared_fs) there.
    assert ckpts and (storage / ckpts[0]["uuid"] / "state.json").exists(), (ckpts[0]["uuid"], list(storage.rglob("*")))
    assert ckpts[0]["uuid"] in det.ok("experiment", "list-checkpoints", exp_id)
    described = det.ok("trial", "describe", trial["id"])
    assert '"validation_loss"' in described and ckpts[0]["uuid"] in described
    # Shipyard's own `det` shows the same records.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(DET_USER="admin", DET_PASS=ADMIN_PASSWORD, SHIPYARD_CLI_DIR=str(tmp_path / "cli"))
    mine = subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main(sys.argv[1:]))",
                           "-m", compat_cluster.url, "checkpoint", "list", str(exp_id)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert mine.returncode == 0, mine.stderr
    assert ckpts[0]["uuid"] in mine.stdout


def test_determined_core_trial_is_preempted_and_restores(det: Det, compat_cluster: CompatCluster,
                                                          compat_python: Path, tmp_path: Path) -> None:
    """Pause: the trial's `should_preempt()` turns true, it checkpoints and exits; activate: the next
    run restores that checkpoint (info.latest_checkpoint) and finishes."""
    out = det.ok("experiment", "create", core_config(tmp_path, compat_python, "compat-core-pause", 60, 0.05),
                 CORE_MODEL)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    wait_for(lambda: compat_cluster.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"], "a checkpoint")
    det.ok("experiment", "pause", exp_id)
    wait_for(lambda: compat_cluster.experiment(exp_id)["state"] == "STATE_PAUSED"
             and compat_cluster.trials(exp_id)[0]["state"] == "STATE_PAUSED", "paused", timeout=60)
    det.ok("experiment", "activate", exp_id)
    wait_for(lambda: compat_cluster.experiment(exp_id)["state"] in TERMINAL, "the end", timeout=90)
    trial = compat_cluster.trials(exp_id)[0]
    logs = det.ok("trial", "logs", trial["id"])
    assert compat_cluster.experiment(exp_id)["state"] == "STATE_COMPLETED", logs
    assert re.search(r"preempted at step \d+", logs) and re.search(r"restored \S+ at step \d+", logs), logs
    assert "run 2 " in logs
    steps = [m["stepsCompleted"] for m in
             compat_cluster.get(f"/api/v1/trials/{trial['id']}/metrics", group="training")["metrics"]]
    assert steps == list(range(1, 61))  # nothing lost, nothing twice


DIST_MODEL = Path(__file__).resolve().parent / "dist_model"


def test_determined_distributed_trial_spans_two_agents(det: Det, compat_cluster: CompatCluster, compat_python: Path,
                                                       compat_torch_path: Path, tmp_path: Path) -> None:
    """`slots_per_trial: 2` on two 1-slot agents, started by Determined's own launcher
    (determined.launch.torch_distributed → torch.distributed.run → pid_server/pid_client →
    wrap_rank): one part per agent, torch's gloo group across them, Determined's
    DistributedContext (its ZMQ broadcast/allgather) on the ports Shipyard gives the gang; the
    chief's metrics and a checkpoint with both ranks' shards reach the master."""
    storage = tmp_path / "checkpoints"
    storage.mkdir()
    cfg = tmp_path / "dist.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "compat-dist", "entrypoint": "python3 -m determined.launch.torch_distributed python3 train.py",
        "resources": {"slots_per_trial": 2},
        # The trial's `python3` is the compat venv's (Determined's launcher runs `python3` from PATH),
        # with this environment's torch on its path.
        "environment": {"environment_variables": [f"PATH={compat_python.parent}:{os.environ.get('PATH', '')}",
                                                  f"PYTHONPATH={compat_torch_path}"]},
        "hyperparameters": {"lr": 0.2},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 10}},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)},
        "max_restarts": 0,
    }))
    out = det.ok("experiment", "create", "-f", cfg, DIST_MODEL, timeout=180)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    trial = compat_cluster.trials(exp_id)[0]
    logs = det.ok("trial", "logs", trial["id"])
    assert compat_cluster.experiment(exp_id)["state"] == "STATE_COMPLETED", logs
    # One part on each agent, ranks 0 and 1 (wrap_rank prefixes their lines), Determined's allgather.
    assert re.search(r"rank 0 of 2: agent local-\d cross_rank 0 of 2 chief_ip 127\.0\.0\.1", logs), logs
    assert re.search(r"rank 1 of 2: agent local-\d cross_rank 1 of 2 chief_ip 127\.0\.0\.1", logs), logs
    assert "agents: ['local-0', 'local-1']" in logs, logs
    assert "OFF-CLUSTER" not in logs and "rank 1 done" in logs and "rank 0 done" in logs
    recorded = compat_cluster.get(f"/api/v1/trials/{trial['id']}/metrics", group="training")["metrics"]
    assert [m["stepsCompleted"] for m in recorded] == list(range(1, 11))  # the chief's only, once each
    # all_reduce averaged the ranks' gradients (targets 2 and 4): w went to 3.
    assert recorded[-1]["metrics"]["loss"] < 1e-3, recorded[-1]
    ckpts = [c for c in compat_cluster.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
             if c["state"] == "STATE_COMPLETED"]
    assert ckpts and ckpts[-1]["metadata"].get("steps_completed") == 10, ckpts  # (GC keeps best and latest)
    last = storage / ckpts[-1]["uuid"]
    shards = [json.loads((last / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert shards[0] == shards[1] and abs(shards[0]["w"] - 3.0) < 0.05, shards
    assert ckpts[-1]["uuid"] in det.ok("trial", "describe", trial["id"])
    # On the gang's own ZMQ ports (Determined's default 12360/12376 would collide between gangs on
    # a host), and with the launcher's pid server socket in the task's directory, not the host's /tmp.
    alloc = ckpts[-1]["allocationId"]
    port = gang_run.comm_port(alloc)
    assert f"zmq ports {port}/{port + 1}" in logs, (alloc, logs)
    assert not Path(f"/tmp/pid_server-{alloc}").exists()


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_determined_core_checkpoints_in_cloud_storage(kind: str, det: Det, compat_cluster: CompatCluster,
                                                      compat_python: Path, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    """Determined's own storage managers (boto3 with endpoint_url and keys; google-cloud-storage,
    pointed at the emulator by STORAGE_EMULATOR_HOST from the experiment's environment) store and
    restore the trial's checkpoints; the real `det checkpoint download` fetches one directly from
    the storage, and through the master."""
    storage = request.getfixturevalue("s3_bucket" if kind == "s3" else "gcs_bucket")
    extra: dict[str, Any] = {}
    if kind == "gcs":
        extra["environment"] = {"environment_variables": [f"STORAGE_EMULATOR_HOST={os.environ['STORAGE_EMULATOR_HOST']}"]}
    else:
        extra["environment"] = {"environment_variables": ["AWS_DEFAULT_REGION=us-east-1"]}
    cfg = core_config(tmp_path, compat_python, f"compat-{kind}", 5, storage=storage, **extra)
    out = det.ok("experiment", "create", "-f", cfg, CORE_MODEL)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    trial = compat_cluster.trials(exp_id)[0]
    logs = det.ok("trial", "logs", trial["id"])
    assert compat_cluster.experiment(exp_id)["state"] == "STATE_COMPLETED", logs
    ckpts = [c for c in compat_cluster.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
             if c["state"] == "STATE_COMPLETED"]
    assert ckpts, logs
    uuid = ckpts[-1]["uuid"]
    assert re.search(rf"read back {uuid} at step 5", logs), logs  # restore_path: downloaded from the bucket
    assert "state.json" in ckpts[-1]["resources"], ckpts[-1]
    for mode in ("direct", "master"):
        dest = tmp_path / f"dl-{mode}"
        det.ok("checkpoint", "download", uuid, "-o", dest, "--mode", mode)
        assert json.loads((dest / "state.json").read_text())["steps"] == 5, list(dest.rglob("*"))
