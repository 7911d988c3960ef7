"""What the real determined==0.38.1 client hit on Shipyard (issue 30), end to end: `det model create`
and `register-version` (the client sends JSON nulls), the SDK's `create_model`, `det checkpoint rm
--glob`, `det model delete`, `det e set
priority|weight|max-slots`, a `determined.core` trial that exits 0 before its searcher's length
(0.38.1's "just exit 0") completes, progress shown while running, paused and canceled, and the
trial's summary metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.storage import from_config
from tests.compat.conftest import TERMINAL, CompatCluster, Det, wait_for
from tests.compat.test_core_api import CORE_MODEL, core_config


def _config(tmp_path: Path, python: Path, name: str, length: int, sleep: float = 0.0, **hparams: Any) -> Path:
    path = core_config(tmp_path, python, name, length, sleep)
    cfg = yaml.safe_load(path.read_text())
    cfg["hyperparameters"].update(hparams)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _create(det: Det, cfg: Path, *flags: str) -> int:
    out = det.ok("experiment", "create", *flags, cfg, CORE_MODEL)
    return int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]


def _ended(cluster: CompatCluster, exp_id: int, timeout: float = 90) -> dict[str, Any]:
    return wait_for(lambda: (lambda e: e if e["state"] in TERMINAL else None)(cluster.experiment(exp_id)),
                    f"experiment {exp_id} to end", timeout=timeout)


def test_exit_0_before_max_length_completes_and_models_register(det: Det, sdk: Any, compat_cluster: CompatCluster,
                                                                compat_python: Path, tmp_path: Path) -> None:
    exp_id = _create(det, _config(tmp_path, compat_python, "compat-exit-early", 20, stop_at=12), "-f")
    exp = _ended(compat_cluster, exp_id)
    (trial,) = compat_cluster.trials(exp_id)
    logs = det.ok("trial", "logs", trial["id"])
    assert (exp["state"], trial["state"], trial["restarts"]) == ("STATE_COMPLETED", "STATE_COMPLETED", 0), logs
    assert "stopping at step 12 of 20" in logs and "the trial is complete" in logs, logs
    assert exp["progress"] == 1.0
    # Summary metrics, in Determined's format, in `det trial describe`.
    described = det.ok("trial", "describe", trial["id"])
    assert '"avg_metrics"' in described and '"validation_metrics"' in described, described
    summary = compat_cluster.get(f"/api/v1/trials/{trial['id']}")["trial"]["summaryMetrics"]
    assert summary["avg_metrics"]["loss"]["count"] == 12 and summary["validation_metrics"]["validation_loss"]["count"] == 2
    # Its checkpoint goes into the registry through the real CLI and SDK (which send nulls).
    ckpt = [c for c in compat_cluster.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
            if c["state"] == "STATE_COMPLETED"][0]["uuid"]
    # `det checkpoint rm --glob`: the matched file leaves the storage and the resources
    assert {"metadata.json", "state.json"} <= set(compat_cluster.get(f"/api/v1/checkpoints/{ckpt}")["checkpoint"][
        "resources"])
    out = det.ok("checkpoint", "rm", ckpt, "--glob", "metadata.json", "--yes")
    assert "Removal of files from checkpoints" in out, out
    got = compat_cluster.get(f"/api/v1/checkpoints/{ckpt}")["checkpoint"]
    assert (got["state"], set(got["resources"])) == ("STATE_PARTIALLY_DELETED", {"state.json"}), got
    storage = from_config(compat_cluster.experiment(exp_id)["config"]["checkpoint_storage"])
    assert set(storage.list_files(ckpt)) == {"state.json"}
    det.ok("model", "create", "compat-model")
    out = det.ok("model", "register-version", "compat-model", ckpt)
    assert ckpt in out, out
    versions = compat_cluster.get("/api/v1/models/compat-model/versions")["modelVersions"]
    assert [(v["version"], v["checkpoint"]["uuid"]) for v in versions] == [(1, ckpt)]
    got = sdk(f"""
        m = client.create_model("compat-sdk-model", description="from the SDK")
        v = m.register_version({ckpt!r})
        print(json.dumps({{"model": m.name, "description": m.description, "version": v.model_version,
                          "uuid": v.checkpoint.uuid}}))
    """)
    assert got == {"model": "compat-sdk-model", "description": "from the SDK", "version": 1, "uuid": ckpt}
    # a registered checkpoint keeps its files; `det model delete` takes the models and their versions
    refused = det("checkpoint", "rm", ckpt, "--glob", "state.json", "--yes")
    assert refused.code == 1 and ckpt in refused.err and "model registry" in refused.err, refused
    det.ok("model", "delete", "compat-model")
    det.ok("model", "delete", "compat-sdk-model")
    assert compat_cluster.get("/api/v1/models")["models"] == []
    assert compat_cluster.get(f"/api/v1/checkpoints/{ckpt}")["checkpoint"]["state"] == "STATE_PARTIALLY_DELETED"


def test_progress_while_running_paused_and_canceled_and_e_set(det: Det, compat_cluster: CompatCluster,
                                                              compat_python: Path, tmp_path: Path) -> None:
    exp_id = _create(det, _config(tmp_path, compat_python, "compat-progress", 400, 0.05, report_progress=True))
    moving = wait_for(lambda: (lambda e: e if e["state"] == "STATE_ACTIVE" and e["progress"] > 0.02 else None)(
        compat_cluster.experiment(exp_id)), "progress while running", timeout=90)
    assert 0.02 < moving["progress"] < 1.0
    listed = det.ok("experiment", "list")
    assert re.search(rf"^\s*{exp_id} \|.*ACTIVE\s+\|\s+(\d+\.\d)%", listed, re.M), listed
    # `det e set` on the running experiment: the job queue's change, the config follows.
    det.ok("experiment", "set", "priority", exp_id, 10)
    det.ok("experiment", "set", "weight", exp_id, 2)
    det.ok("experiment", "set", "max-slots", exp_id, 1)
    resources = compat_cluster.experiment(exp_id)["config"]["resources"]
    assert (resources["priority"], resources["weight"], resources["max_slots"]) == (10, 2.0, 1)
    job = [j for j in compat_cluster.get("/api/v1/job-queues-v2")["jobs"] if j["full"]["jobId"] ==
           compat_cluster.experiment(exp_id)["jobId"]][0]["full"]
    assert (job["priority"], job["weight"]) == (10, 2.0)
    bad = det("experiment", "set", "priority", exp_id, 0)
    assert bad.code != 0 and "resources.priority" in bad.err + bad.out and "Traceback" not in bad.err, bad
    det.ok("experiment", "pause", exp_id)
    wait_for(lambda: compat_cluster.experiment(exp_id)["state"] == "STATE_PAUSED"
             and compat_cluster.trials(exp_id)[0]["state"] == "STATE_PAUSED", "paused", timeout=60)
    paused = compat_cluster.experiment(exp_id)  # its trial stopped: nothing moves it now
    assert paused["progress"] >= moving["progress"]
    det.ok("experiment", "cancel", exp_id)
    canceled = _ended(compat_cluster, exp_id)
    assert canceled["state"] == "STATE_CANCELED" and canceled["progress"] == paused["progress"]
    assert f"{paused['progress']:.1%}" in det.ok("experiment", "describe", exp_id)
