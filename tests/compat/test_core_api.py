"""A trial that uses Determined's own `determined.core` (0.38.1) runs on a Shipyard agent's process
runtime: the agent prepares its info files per task (shipyard_common/determined_info.py), the
master answers what the Core API calls; the metrics and checkpoints appear in both CLIs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.compat.conftest import TERMINAL, CompatCluster, Det, wait_for
from tests.conftest import ADMIN_PASSWORD, ROOT

CORE_MODEL = Path(__file__).resolve().parent / "core_model"


def core_config(tmp_path: Path, python: Path, name: str, length: int, step_sleep: float = 0.0) -> Path:
    storage = tmp_path / "checkpoints"
    storage.mkdir(exist_ok=True)
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": name, "entrypoint": [str(python), "train.py"],
        "hyperparameters": {"lr": 0.1, "step_sleep": step_sleep},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)},
        "max_restarts": 0,
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
