"""An elastic pool's instance whose agent reported its cloud's interruption notice is going away: the
autoscaler counts it as no capacity (pending work launches a replacement even though the
instance is idle), its allocations are asked to checkpoint and stop, and once its work has left,
it is terminated with the notice as its reason. Against the cloud edges the providers talk to:
a moto server (EC2) and the GCE fake driven by the real google-cloud-compute client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from sqlalchemy import select

from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Instance, TaskLog
from control_plane.loops.autoscaler import Autoscaler
from control_plane.master import Master
from control_plane.services import interruptions
from shipyard_common.agent_protocol import InterruptionRequest
from tests.control_plane.loops.conftest import ELASTIC, FakeClock, add_agent, add_allocation, make_master
from tests.e2e.gce_fake_master import anonymous
from tests.fakes.gce import GceFake, gce_fake  # noqa: F401
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401

pytestmark = pytest.mark.integration

REGION = "us-east-1"


@dataclass
class Pool:
    master: Master
    scaler: Autoscaler
    clock: FakeClock
    cloud: str
    live: Any  # () -> set of the cloud's instance ids not terminated

    def tick(self, seconds: float = 5) -> None:
        self.clock.advance(seconds=seconds)
        self.scaler.tick()

    def rows(self) -> list[Instance]:
        with self.master.sessions() as s:
            rows = list(s.scalars(select(Instance).where(Instance.pool == ELASTIC).order_by(Instance.requested_at)))
            s.expunge_all()
            return rows


def aws_provider(moto_url: str, session: boto3.Session) -> dict[str, Any]:
    ec2 = session.client("ec2", region_name=REGION, endpoint_url=moto_url)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    subnet = sorted(ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"],
                    key=lambda s: s["AvailabilityZone"])[0]["SubnetId"]
    return {"type": "aws", "region": REGION, "image_id": image, "instance_type": "g4dn.xlarge",  # 1 slot
            "endpoint_url": moto_url, "subnet_ids": [subnet], "min_instances": 0, "max_instances": 3,
            "max_idle_agent_period": "10m", "spot": True}


def gcp_provider(fake: GceFake) -> dict[str, Any]:
    return {"type": "gcp", "project": "shipyard-spot", "zones": ["us-central1-a"], "machine_type": "e2-standard-4",
            "instance_slots": 1, "boot_disk_source_image": "projects/debian-cloud/global/images/family/debian-12",
            "api_endpoint": fake.endpoint, "min_instances": 0, "max_instances": 3, "max_idle_agent_period": "10m",
            "preemptible": True}


@pytest.fixture(params=["aws", "gcp"])
def pool(request: pytest.FixtureRequest, db_url: str, tmp_path: Path) -> Iterator[Pool]:
    clock = FakeClock(datetime.now(UTC))
    if request.param == "aws":
        moto_url = request.getfixturevalue("moto_reset")
        session = request.getfixturevalue("aws_session")
        master = make_master(db_url, tmp_path / "state", clock, aws_provider(moto_url, session))
        ec2 = session.client("ec2", region_name=REGION, endpoint_url=moto_url)

        def live() -> set[str]:
            found = ec2.describe_instances()["Reservations"]
            return {i["InstanceId"] for r in found for i in r["Instances"] if i["State"]["Name"] != "terminated"}

        scaler = Autoscaler(master)
    else:
        fake: GceFake = request.getfixturevalue("gce_fake")
        master = make_master(db_url, tmp_path / "state", clock, gcp_provider(fake))

        def live() -> set[str]:
            return {i["name"] for i in fake.instances if i.get("status") not in ("TERMINATED", "STOPPING")}

        scaler = Autoscaler(master, wrap_provider=anonymous)
    yield Pool(master, scaler, clock, request.param, live)
    master.stop()


def running_instance(pool: Pool, alloc_id: str) -> str:
    """Demand for one slot, a launch, the instance running with its agent (named after it)."""
    add_allocation(pool.master, alloc_id)
    before = pool.live()
    pool.tick()
    for _ in range(20):
        new = pool.live() - before
        if new:
            break
        pool.tick()
    [iid] = new
    add_agent(pool.master, iid, instance_id=iid, slots=1)
    pool.tick()
    with transaction(pool.master.sessions) as s:
        a = s.get(Allocation, alloc_id)
        assert a is not None
        a.state, a.agent_id, a.slot_ids, a.started_at = "running", iid, ["0"], pool.clock()
    return iid


def notice(pool: Pool, agent_id: str) -> None:
    """What POST /api/v1/agents/{id}/interruption does once the agent's session is checked."""
    with transaction(pool.master.sessions) as s:
        agent = s.get(Agent, agent_id)
        assert agent is not None
        action = "terminate" if pool.cloud == "aws" else "preempt"
        interruptions.record(s, pool.master, agent, InterruptionRequest(
            session_id=agent.session_id, cloud=pool.cloud, action=action,
            deadline=pool.clock() + timedelta(seconds=120 if pool.cloud == "aws" else 30)))


def test_an_interrupted_instance_is_no_capacity_and_is_replaced_then_terminated(pool: Pool) -> None:
    iid = running_instance(pool, "a1")
    assert pool.live() == {iid}
    notice(pool, iid)
    with pool.master.sessions() as s:
        a1 = s.get(Allocation, "a1")
        agent = s.get(Agent, iid)
        assert a1 is not None and a1.preempt_requested and not a1.kill_requested
        assert agent is not None and agent.enabled is False and agent.drain_started_at is not None
        lines = [t.log for t in s.scalars(select(TaskLog).where(TaskLog.allocation_id == "a1"))]
        assert any(interruptions.TRIAL_LINE in line for line in lines), lines
        row = s.scalar(select(Instance).where(Instance.instance_id == iid))
        assert row is not None and "spot interruption notice" in (row.terminate_reason or "")
    # The trial checkpointed and exited; its next run is pending. The interrupted instance is idle
    # now, but it is going away: the pending run launches a replacement, not a wait for it.
    with transaction(pool.master.sessions) as s:
        a1 = s.get(Allocation, "a1")
        assert a1 is not None
        a1.state, a1.ended_at, a1.end_cause = "terminated", pool.clock(), "preempted"
    add_allocation(pool.master, "a2")
    pool.tick()
    decision = pool.rows()
    replacement = [r for r in decision if r.instance_id != iid]
    assert len(replacement) == 1, [(r.instance_id, r.state) for r in decision]
    # And the emptied instance is terminated with the notice as its reason.
    gone = next(r for r in decision if r.instance_id == iid)
    assert gone.state in ("stopping", "terminated") and "spot interruption notice" in (gone.terminate_reason or "")
    for _ in range(10):
        if iid not in pool.live():
            break
        pool.tick()
    assert iid not in pool.live()


def test_a_busy_interrupted_instance_is_kept_until_its_work_has_left(pool: Pool) -> None:
    """While its trial is still checkpointing, the interrupted instance is not terminated (that
    would lose the checkpoint), and new demand gets an instance of its own."""
    iid = running_instance(pool, "a1")
    notice(pool, iid)
    add_allocation(pool.master, "b1")
    pool.tick()
    rows = pool.rows()
    assert len([r for r in rows if r.instance_id != iid]) == 1  # b1 gets an instance of its own
    assert next(r for r in rows if r.instance_id == iid).state == "running"  # still working: not terminated
