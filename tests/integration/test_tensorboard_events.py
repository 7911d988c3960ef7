"""A trial's TensorBoard event files through a real cluster: the harness (no TensorFlow, torch or
tensorboard in the trial) writes every training and validation report, and syncs the files to
the checkpoint storage under <cluster_id>/tensorboard/experiment/<exp>/trial/<trial>/, where
the real TensorBoard reader finds every value the master stored, at its step and under its tag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.test_tensorboard_events import read_scalars
from tests.integration.conftest import Cluster, trial_config

pytestmark = pytest.mark.integration


def _fetch_s3(storage: dict[str, Any], prefix: str, out: Path) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=storage["endpoint_url"], aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=storage["bucket"], Prefix=prefix):
        for obj in page.get("Contents", []):
            target = out / obj["Key"][len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(storage["bucket"], obj["Key"], str(target))


def _reported(c: Cluster, trial_id: int) -> list[tuple[str, float, int]]:
    """What the master stored, as Determined's writer tags it."""
    from harness.tensorboard.events import scalars_for_report, to_float32

    out = []
    for group in ("training", "validation"):
        for row in c.metrics(trial_id, group):
            metrics = row["metrics"]
            metrics = metrics.get("avg_metrics", metrics.get("validation_metrics", metrics))
            out += [(tag, to_float32(v), s) for tag, v, s in scalars_for_report(group, row["stepsCompleted"], metrics)]
    return sorted(out)


def test_event_files_in_shared_fs_and_s3_hold_every_reported_value(cluster_factory, s3_bucket: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    storages = {"shared_fs": {"type": "shared_fs", "host_path": str(tmp_path / "ckpts")}, "s3": s3_bucket}
    c = cluster_factory(agents=1, master_yaml={"checkpoint_storage": storages["shared_fs"]})  # the cluster's root
    cluster_id = c.get("/api/v1/master")["clusterId"]
    exps = {}
    for name, storage in storages.items():
        cfg = trial_config(name, length=25)
        cfg["checkpoint_storage"] = storage
        exps[name] = c.submit(cfg)
    for name, exp_id in exps.items():
        c.wait_experiment(exp_id, timeout=120)
        (trial,) = c.trials(exp_id)
        sync = f"{cluster_id}/tensorboard/experiment/{exp_id}/trial/{trial['id']}"
        if name == "shared_fs":
            found = Path(storages[name]["host_path"]) / sync
        else:
            found = tmp_path / "from-s3"
            _fetch_s3(s3_bucket, f"{s3_bucket['prefix']}/{sync}/", found)
        want = _reported(c, trial["id"])
        assert len(want) == 25 + 3  # loss at steps 1..25, validation_loss at 10, 20, 25
        assert {tag for tag, _, _ in want} == {"Determined/loss", "Determined/validation_loss"}
        assert sorted(read_scalars(found)) == want, name
