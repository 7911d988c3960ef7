"""Determined's own `determined.core` (0.38.1) with `core.init()` unchanged (TensorboardMode.AUTO)
in an interpreter with neither TensorFlow nor torch nor `tensorboard` (the compat venv): the
agent's shim gives Determined's `get_metric_writer` the harness's tfevents writer, and Determined's
own TensorboardManager syncs the files to the checkpoint storage, where the real reader finds them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import yaml

from agent_bootstrap.agent import determined_env
from harness.tensorboard.events import to_float32
from tests.compat.conftest import CompatCluster, Det
from tests.harness.test_tensorboard_events import read_scalars

AUTO_MODEL = Path(__file__).resolve().parent / "auto_tb_model"

WRITE = """
import json
from determined import tensorboard
w = tensorboard.get_metric_writer()
w.on_train_step_end(3, {"loss": 0.5, "name": "x"}, batch_metrics=[{"loss": 0.75}, {"loss": 0.5}])
w.on_validation_step_end(3, {"loss": 0.25})
print(json.dumps(str(tensorboard.get_base_path({}))))
"""


def test_get_metric_writer_without_tensorflow_or_torch(compat_python: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "PYTHON"))}
    env["DET_ALLOCATION_ID"] = f"tb-{uuid.uuid4().hex[:8]}"
    bare = subprocess.run([str(compat_python), "-c", WRITE], capture_output=True, text=True, env=env, timeout=60)
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr  # Determined's own behaviour
    info_dir = tmp_path / "info"
    info_dir.mkdir()
    env.update(SHIPYARD_DET_INFO_DIR=str(info_dir),
               PYTHONPATH=os.pathsep.join([str(determined_env.SHIM_DIR), str(determined_env.PACKAGE_ROOT)]))
    run = subprocess.run([str(compat_python), "-c", WRITE], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    base = Path(json.loads(run.stdout.strip().splitlines()[-1]))
    try:
        assert read_scalars(base) == [("Determined/loss", 0.75, 1), ("Determined/loss", 0.5, 2),
                                      ("Determined/val_loss", 0.25, 3)]
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_unchanged_core_init_trial_syncs_event_files(det: Det, compat_cluster: CompatCluster, compat_python: Path,
                                                     tmp_path: Path) -> None:
    storage = tmp_path / "checkpoints"
    storage.mkdir()
    cfg = tmp_path / "auto.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "compat-tensorboard-auto", "entrypoint": [str(compat_python), "train.py"],
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 12}},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)}, "max_restarts": 0,
    }))
    out = det.ok("experiment", "create", "-f", cfg, AUTO_MODEL)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    (trial,) = compat_cluster.trials(exp_id)
    assert compat_cluster.experiment(exp_id)["state"] == "STATE_COMPLETED", det.ok("trial", "logs", trial["id"])
    cluster_id = compat_cluster.get("/api/v1/master")["clusterId"]
    synced = storage / cluster_id / "tensorboard" / "experiment" / str(exp_id) / "trial" / str(trial["id"])
    want = []
    for group, tag in (("training", "Determined/loss"), ("validation", "Determined/validation_loss")):
        for row in compat_cluster.get(f"/api/v1/trials/{trial['id']}/metrics", group=group)["metrics"]:
            (value,) = row["metrics"].get("avg_metrics", row["metrics"].get("validation_metrics", row["metrics"])).values()
            want.append((tag, to_float32(value), row["stepsCompleted"]))
    assert len(want) == 12 + 3
    assert sorted(read_scalars(synced)) == sorted(want)
