"""Servers the harness tests talk to over real HTTP: a fake master, moto (S3), gcp-storage-emulator."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fake_master import FakeMaster, free_port


@pytest.fixture
def fake_master() -> Iterator[FakeMaster]:
    m = FakeMaster().start()
    yield m
    m.stop()


def cluster_env(master: FakeMaster, storage_dir: Path, **extra: Any) -> dict[str, str]:
    """The TaskSpec environment an agent would give a trial process."""
    config = {
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage_dir)},
        "searcher": {"name": "single", "metric": "val_loss", "smaller_is_better": True,
                     "max_length": {"batches": 20}},
    }
    env = {
        "DET_MASTER": master.url,
        "DET_SESSION_TOKEN": "alloc-token-1",
        "DET_CLUSTER_ID": "cluster-1",
        "DET_TRIAL_ID": "7",
        "DET_EXPERIMENT_ID": "3",
        "DET_ALLOCATION_ID": "3.7.1",
        "DET_TASK_ID": "3.7",
        "DET_TASK_TYPE": "TRIAL",
        "DET_TRIAL_RUN_ID": "2",
        "DET_TRIAL_SEED": "1234",
        "DET_HPARAMS": json.dumps({"lr": 0.1, "layers": 2}),
        "DET_EXPERIMENT_CONFIG": json.dumps(config),
        "DET_LATEST_CHECKPOINT": "",
        "DET_SLOT_IDS": "[0]",
        "DET_AGENT_ID": "agent-1",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A fresh bucket on the moto server, and the checkpoint_storage config pointing at it."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    s3.create_bucket(Bucket=name)
    return {"type": "s3", "bucket": name, "prefix": "shipyard/exp", "access_key": "testing",
            "secret_key": "testing", "endpoint_url": moto_endpoint}


@pytest.fixture(scope="session")
def gcs_emulator_host() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator_host: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import uuid

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator_host)
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    client = storage.Client(project="shipyard-test", credentials=AnonymousCredentials())
    client.create_bucket(name)
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs_emulator_host
    return {"type": "gcs", "bucket": name, "prefix": "shipyard/exp"}
