"""The real SDK of determined==0.38.1 (`determined.experimental.client`) against Shipyard: one
script creates an experiment, waits for it and reads it back; the answers are compared with what
the master recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.compat.conftest import MODEL_DIR, CompatCluster, write_config


def test_sdk_create_wait_and_read_back(sdk: Any, compat_cluster: CompatCluster, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "compat-sdk")
    got = sdk(f"""
        exp = client.create_experiment(config={str(cfg)!r}, model_dir={str(MODEL_DIR)!r})
        state = exp.wait(interval=0.2)
        trials = client.get_experiment(exp.id).list_trials()
        t = client.get_trial(trials[0].id)
        training = [(m.steps_completed, m.metrics) for m in t.iter_metrics("training")]
        validation = [(m.steps_completed, m.metrics) for m in t.iter_metrics("validation")]
        logs = list(t.iter_logs())
        ckpts = exp.list_checkpoints()
        completed = [c for c in ckpts if c.state == client.CheckpointState.COMPLETED]
        path = completed[0].download({str(tmp_path / "dl")!r})
        print(json.dumps({{
            "id": exp.id, "state": state.name, "trials": [x.id for x in trials],
            "training": training, "validation": validation, "logs": logs,
            "checkpoints": [c.uuid for c in ckpts], "completed": completed[0].uuid, "path": str(path),
            "experiments": [e.id for e in client.list_experiments()], "me": client.whoami().username,
        }}))
    """)
    assert got["state"] == "COMPLETED" and got["me"] == "admin"
    exp = compat_cluster.experiment(got["id"])
    assert exp["name"] == "compat-sdk" and exp["state"] == "STATE_COMPLETED"
    assert got["id"] in got["experiments"]
    trials = compat_cluster.trials(got["id"])
    assert got["trials"] == [t["id"] for t in trials]
    recorded = compat_cluster.get(f"/api/v1/trials/{trials[0]['id']}/metrics", group="training")["metrics"]
    assert [s for s, _ in got["training"]] == [m["stepsCompleted"] for m in recorded] == list(range(1, 11))
    assert got["training"][-1][1]["loss"] == recorded[-1]["metrics"]["loss"]
    assert [s for s, m in got["validation"]] == [5, 10] and "validation_loss" in got["validation"][0][1]
    assert any(f"trial {trials[0]['id']} run 1" in line for line in got["logs"])
    ckpts = compat_cluster.get(f"/api/v1/experiments/{got['id']}/checkpoints")["checkpoints"]
    # The SDK lists the COMPLETED ones (the others were deleted by the GC policy).
    assert sorted(got["checkpoints"]) == sorted(c["uuid"] for c in ckpts if c["state"] == "STATE_COMPLETED")
    assert '"steps": 10' in (Path(got["path"]) / "state.json").read_text()
