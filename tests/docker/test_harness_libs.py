"""`container_harness_libs`: a trial in an image that has Python but none of the harness's libraries
(no requests, tenacity or boto3) checkpoints to an S3 bucket (moto's server): the agent binds the
harness into the container and, for the image's Python (asked in the image), installs the libraries
at the agent constraints' pins with its own pip into a directory the task's sitecustomize appends
to sys.path (agent_bootstrap/agent/runtime/harness_libs.py).

The image is the test image with this machine's interpreter bound in, and an empty directory bound
over its site-packages, so the image's Python has the standard library only. The master runs on
SQLite only: what is proven here is the container's environment, not the database."""

from __future__ import annotations

import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.agent_bootstrap.test_agent_integration import AgentProcess, agent_token, wait_for
from tests.conftest import LiveMaster
from tests.docker.conftest import Engine
from tests.docker.test_docker_agent import Api
from tests.pg import free_port

pytestmark = pytest.mark.integration

TRAIN = """\
from harness import core

print("boto3 from", __import__("boto3").__file__, flush=True)
with core.init() as ctx:
    for op in ctx.searcher.operations():
        with ctx.checkpoint.store_path({"steps_completed": op.length}) as (path, uuid):
            (path / "model.txt").write_text("trained in an image without boto3\\n")
        ctx.train.report_validation_metrics(op.length, {"loss": 0.5})
        op.report_completed(0.5)
"""


@pytest.fixture
def moto() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_a_trial_in_an_image_without_boto3_checkpoints_to_the_bucket(
        docker_engine: Engine, tmp_path: Path, moto: str) -> None:
    s3 = boto3.client("s3", endpoint_url=moto, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    master = LiveMaster(f"sqlite:///{tmp_path / 'shipyard.db'}", tmp_path / "master-state")
    master.start(timeout=120)
    empty = tmp_path / "no-site-packages"
    empty.mkdir()
    base = str(Path(sys.base_prefix).resolve())
    purelib = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"]
    mounts = [base, f"{empty}:{Path(purelib).resolve()}"]
    agent = AgentProcess(master.url, agent_token(master), tmp_path / "work", "--runtime", "docker",
                         "--docker-host", docker_engine.socket_url, "--container-mounts", ",".join(mounts),
                         "--container-harness-libs", agent_id="libs-agent")
    try:
        api = Api(master)
        config = {"name": "no-boto3", "entrypoint": ["python3", "train.py"], "max_restarts": 0,
                  "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
                  "resources": {"slots_per_trial": 1},
                  "environment": {"image": docker_engine.image,
                                  "environment_variables": [f"PATH={Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin"]},
                  "checkpoint_storage": {"type": "s3", "bucket": bucket, "prefix": "ckpts", "access_key": "testing",
                                         "secret_key": "testing", "endpoint_url": moto}}
        trial = api.submit(config, {"train.py": TRAIN})["trialIds"][0]
        wait_for(lambda: api.trial(trial)["state"] in ("STATE_COMPLETED", "STATE_ERROR"), timeout=240,
                 what="trial ended")
        logs = api.logs(trial)
        assert api.trial(trial)["state"] == "STATE_COMPLETED", logs[-3000:] + agent.stderr[-3000:]
        # The image's Python has no boto3 (nor requests); the trial's came from the agent's directory.
        bare = docker_engine.client.containers.run(
            docker_engine.image, ["python3", "-c", "import importlib.util as u; print(u.find_spec('boto3'), "
                                  "u.find_spec('requests'))"], remove=True, network_mode="none",
            environment={"PATH": f"{Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin"},
            volumes={h: {"bind": c or h, "mode": "ro"} for h, _, c in (m.partition(":") for m in mounts)})
        assert bare.decode().split() == ["None", "None"]
        assert "installed boto3" in logs and f"for Python {sys.version_info[0]}.{sys.version_info[1]}" in logs, logs[-3000:]
        assert "boto3 from /opt/shipyard-harness-libs/boto3/__init__.py" in logs, logs[-3000:]
        [ckpt] = api.get(f"/api/v1/trials/{trial}/checkpoints")["checkpoints"]
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        assert f"ckpts/{ckpt['uuid']}/model.txt" in keys, keys
        assert "event=harness_libs" in agent.stderr and "built=True" in agent.stderr
    finally:
        agent.stop()
        master.stop()
