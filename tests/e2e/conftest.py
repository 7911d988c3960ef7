"""End-to-end fixtures: a real master process (LiveMaster) with elastic pools pointed at the cloud
fakes, and the emulated boot (tests/e2e/boot.py) that turns the instances it launches into agents.

The cloud-edge fixtures are the ones the provisioner tests use (moto server + EC2 fault proxy, the
GCE fake); importing them here makes them available to this directory."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import yaml

from shipyard_common.processes import stop_process_group
from tests.conftest import LiveMaster
from tests.e2e.boot import BootHarness, Cloud
from tests.fakes.gce import gce_fake  # noqa: F401
from tests.provisioners.conftest import (  # noqa: F401
    _ec2_fault_proxy,
    aws_session,
    ec2_faults,
    moto_reset,
    moto_server,
)

REGION = "us-east-1"

# The trial: the Core API end to end (searcher op in, one validation metric out).
TRAIN_PY = """\
from harness import core

with core.init() as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_validation_metrics(op.length, {"loss": 0.125})
        op.report_completed(0.125)
print("e2e trial done", flush=True)
"""

# Agent options for emulated instances: CPU slots (no GPU here), and quick reconnects so that an
# agent rides out a master restart within a test's time.
AGENT_OPTIONS = {
    "slot_type": "cpu",
    "slots": 1,
    "agent_reconnect_attempts": 120,
    "agent_reconnect_backoff": 0.5,
    "agent_reconnect_backoff_max": 1,
    "poll_timeout": 5,
}


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class E2E:
    """One test's master, boot harnesses and helpers; torn down harnesses first (agents die with
    their instances), then the master."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.master: LiveMaster | None = None
        self.harnesses: list[BootHarness] = []
        self._headers: dict[str, str] | None = None

    # -- master ------------------------------------------------------------------------------------
    @property
    def db_path(self) -> Path:
        return self.tmp / "shipyard.db"

    def start_master(self, pools: list[dict[str, Any]], default_pool: str, env: dict[str, str] | None = None,
                     module: str = "control_plane") -> LiveMaster:
        """`module`: the master's entry point (tests/e2e/crash_after_launch.py wraps its providers)."""
        cfg = self.tmp / "master.yaml"
        cfg.write_text(yaml.safe_dump({"resource_pools": pools, "default_resource_pool": default_pool,
                                       "log_level": "info"}, sort_keys=False))
        # The local provider's agents and their trials run `python3` from PATH: the test's Python.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.master = LiveMaster(f"sqlite:///{self.db_path}", self.tmp / "master-state",
                                 extra_env={"PATH": path, **(env or {})}, config_path=cfg, module=module)
        self.master.start()
        return self.master

    @property
    def m(self) -> LiveMaster:
        assert self.master is not None
        return self.master

    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = {"Authorization": f"Bearer {self.m.token()}"}
        return self._headers

    def get(self, path: str) -> Any:
        r = httpx.get(self.m.url + path, headers=self.headers(), timeout=30)
        r.raise_for_status()
        return r.json()

    def cluster_id(self) -> str:
        return httpx.get(self.m.url + "/info", timeout=10).json()["clusterId"]

    def create_experiment(self, pool: str, train_py: str = TRAIN_PY) -> dict[str, Any]:
        config = {
            "name": f"e2e-{pool}",
            "entrypoint": "python3 train.py",
            "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True,
                         "max_length": {"batches": 2}},
            "resources": {"slots_per_trial": 1, "resource_pool": pool},
            "max_restarts": 0,
        }
        files = [{"path": "train.py", "type": 48, "content": base64.b64encode(train_py.encode()).decode(),
                  "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0}]
        r = httpx.post(self.m.url + "/api/v1/experiments", headers=self.headers(), timeout=30,
                       json={"config": yaml.safe_dump(config), "modelDefinition": files, "activate": True})
        assert r.status_code == 200, r.text
        return r.json()["experiment"]

    def trial(self, trial_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/trials/{trial_id}")["trial"]

    def pool(self, name: str) -> dict[str, Any]:
        return next(p for p in self.get("/api/v1/resource-pools")["resourcePools"] if p["name"] == name)

    def wait_trial_completed(self, trial_id: int, timeout: float, harness: BootHarness | None = None) -> None:
        def done() -> bool:
            state = self.trial(trial_id)["state"]
            if state in ("STATE_ERROR", "STATE_CANCELED"):
                logs = "".join(i.agent_log[-2000:] for i in (harness.instances.values() if harness else []))
                raise AssertionError(f"trial {trial_id} ended {state}\n{logs}\n{self.master_log()[-3000:]}")
            return state == "STATE_COMPLETED"

        wait_for(done, timeout, f"trial {trial_id} completed")

    def instance_rows(self, pool: str) -> list[dict[str, Any]]:
        """The master's Instance rows, read from its SQLite database."""
        with sqlite3.connect(self.db_path, timeout=10) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM instances WHERE pool = ? ORDER BY requested_at", (pool,))
            return [dict(r) for r in rows]

    def master_log(self) -> str:
        return self.m.log_path.read_text(errors="replace") if self.master else ""

    # -- instances ---------------------------------------------------------------------------------
    def boot(self, cloud: Cloud) -> BootHarness:
        harness = BootHarness(cloud, self.tmp / f"instances-{len(self.harnesses)}").start()
        self.harnesses.append(harness)
        return harness

    def close(self) -> None:
        for h in self.harnesses:
            h.stop()
        if self.master is not None:
            self.master.stop()
        # A local pool's instances are processes of their own (like cloud instances, they outlive
        # the master): end those a test's master left running.
        for rec in self.tmp.rglob("local-instances/local-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                stop_process_group(int(json.loads(rec.read_text())["pid"]), 2)


@pytest.fixture
def e2e(tmp_path: Path) -> Iterator[E2E]:
    env = E2E(tmp_path)
    yield env
    env.close()


@pytest.fixture(scope="session")
def moto_image(moto_server: str, aws_session: boto3.Session) -> str:  # noqa: F811 (imported fixtures)
    """One of moto's built-in AMIs (they survive resets)."""
    ec2 = aws_session.client("ec2", region_name=REGION, endpoint_url=moto_server)
    return ec2.describe_images()["Images"][0]["ImageId"]


def default_subnet(moto_url: str, session: boto3.Session) -> str:
    ec2 = session.client("ec2", region_name=REGION, endpoint_url=moto_url)
    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return sorted(subnets, key=lambda s: s["AvailabilityZone"])[0]["SubnetId"]


def aws_pool(name: str, endpoint_url: str, image_id: str, subnet: str, **overrides: Any) -> dict[str, Any]:
    provider: dict[str, Any] = {
        "type": "aws",
        "region": REGION,
        "image_id": image_id,
        "instance_type": "g4dn.xlarge",  # 1 GPU in moto's catalogue: 1 slot per instance
        "endpoint_url": endpoint_url,
        "subnet_ids": [subnet],
        "min_instances": 0,
        "max_instances": 2,
        "max_idle_agent_period": "3s",
        "agent": dict(AGENT_OPTIONS),
    }
    provider.update(overrides)
    return {"name": name, "provider": provider}
