"""`det resource-pool describe` shows the subnets an AWS pool skips after capacity errors: the
autoscaler launches through the real AWS provider at the EC2 fault proxy, and the pool's API answer
carries each cooling subnet, its instance type, until when and the last error (issue 10, item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.loops.autoscaler import Autoscaler
from tests.conftest import login
from tests.control_plane.loops.conftest import ELASTIC, FakeClock, add_allocation, make_master

if TYPE_CHECKING:
    from tests.provisioners.conftest import Ec2FaultProxy

SUBNETS = ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"]


@pytest.mark.integration
def test_pool_describe_shows_the_subnets_cooling_down(db_url: str, tmp_path: Path, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", times=None)
    provider = {"type": "aws", "region": "us-east-1", "image_id": "ami-12345678", "instance_type": "p3.2xlarge",
                "instance_slots": 1, "root_device_name": "/dev/xvda", "subnet_ids": SUBNETS,
                "endpoint_url": ec2_faults.url, "max_instances": 2, "capacity_cooldown_s": 900}
    master = make_master(db_url, tmp_path / "state", FakeClock(), provider)
    try:
        add_allocation(master, "wants-one", slots=1)
        Autoscaler(master).tick()
        assert [c.params["SubnetId"] for c in ec2_faults.calls("RunInstances")] == SUBNETS

        with TestClient(create_app(master)) as client:
            pool = client.get(f"/api/v1/resource-pools/{ELASTIC}", headers=login(client)).json()["resourcePool"]
        cooling = pool["capacityCooldowns"]
        assert sorted(c["location"] for c in cooling) == SUBNETS
        assert {c["instanceType"] for c in cooling} == {"p3.2xlarge"}
        assert {c["code"] for c in cooling} == {"InsufficientInstanceCapacity"}
        assert all(c["until"] and c["failures"] == 1 for c in cooling)
        assert pool["error"].startswith("capacity (InsufficientInstanceCapacity)")
        assert pool["lastDecision"]["slots_per_instance"] == 1
    finally:
        master.stop()
