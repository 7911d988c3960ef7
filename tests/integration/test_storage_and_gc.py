"""Checkpoints through a real cluster on every storage backend: written by a trial, read back
by its restart, then garbage-collected by the master to exactly what the policy keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import trial_config

pytestmark = pytest.mark.integration


def _stored_uuids(storage: dict[str, Any]) -> set[str]:
    """Checkpoint ids present in the storage itself, asked of the storage directly (TensorBoard's
    files, under <cluster_id>/tensorboard/ beside the checkpoints, are not checkpoints)."""
    if storage["type"] == "shared_fs":
        root = Path(storage["host_path"])
        return {p.name for p in root.iterdir() if not p.name.startswith(".")
                and not (p / "tensorboard").is_dir()} if root.exists() else set()
    if storage["type"] == "s3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=storage["endpoint_url"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=storage["bucket"])
                for o in page.get("Contents", [])]
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage as gcs

        client = gcs.Client(project="shipyard-test", credentials=AnonymousCredentials())
        keys = [b.name for b in client.list_blobs(storage["bucket"])]
    prefix = storage["prefix"].rstrip("/") + "/"
    return {k[len(prefix):].split("/", 1)[0] for k in keys if k.startswith(prefix)
            and not k[len(prefix):].startswith(".") and k[len(prefix):].split("/")[1:2] != ["tensorboard"]}


@pytest.mark.parametrize("backend", ["shared_fs", "s3", "gcs"])
def test_checkpoint_round_trip_and_gc(backend: str, cluster_factory, request, tmp_path, monkeypatch) -> None:
    if backend == "shared_fs":
        storage: dict[str, Any] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpts")}
    else:
        storage = dict(request.getfixturevalue("s3_bucket" if backend == "s3" else "gcs_bucket"))
    # Started after the fixtures set STORAGE_EMULATOR_HOST: master and trials see it. A shared_fs
    # storage is the cluster's own root (another host path needs allow_task_host_access).
    c = cluster_factory(agents=1, master_yaml={"checkpoint_storage": storage} if backend == "shared_fs" else None)
    policy = {"save_trial_latest": 1, "save_trial_best": 0, "save_experiment_best": 0}
    cfg = trial_config(length=30, hparams={"crash_at": 15})  # the restart must read its checkpoint back
    cfg["checkpoint_storage"] = {**storage, **policy}
    exp_id = c.submit(cfg)
    c.wait_experiment(exp_id, timeout=120)
    (trial,) = c.trials(exp_id)
    assert trial["restarts"] == 1
    assert "resumed from" in c.logs(trial["id"])
    ckpts = c.get(f"/api/v1/experiments/{exp_id}/checkpoints",
                  states=["STATE_COMPLETED", "STATE_DELETED"])["checkpoints"]
    assert sorted(ck["metadata"]["steps_completed"] for ck in ckpts) == [10, 20, 30]
    # GC keeps the latest, and the step-10 checkpoint the restart resumed from (protected)
    kept = {ck["uuid"] for ck in ckpts if ck["metadata"]["steps_completed"] in (10, 30)}
    c.wait(lambda: _stored_uuids(cfg["checkpoint_storage"]) == kept, 60, "storage to hold exactly the kept checkpoints")
    states = {ck["metadata"]["steps_completed"]: ck["state"] for ck in
              c.get(f"/api/v1/experiments/{exp_id}/checkpoints",
                    states=["STATE_COMPLETED", "STATE_DELETED"])["checkpoints"]}
    assert states == {10: "STATE_COMPLETED", 20: "STATE_DELETED", 30: "STATE_COMPLETED"}
