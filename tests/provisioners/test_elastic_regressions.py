"""Issue 10 regressions over HTTP, at the cloud edge: the real autoscaler (ticked by hand on a fake
clock) drives the real AWS provider against the moto server through the EC2 fault proxy, and the real
GCP provider (google-cloud-compute client) against the GCE fake, on SQLite and PostgreSQL.

1. a terminate that fails (UnauthorizedOperation, or throttled through every bounded retry) leaves
   the row `stopping`, counted under max_instances, and a later tick sends it again until the cloud
   reports the instance gone; the same for a failing GCE delete;
2. an instance missing from one list right after its launch is not closed, not killed as an orphan
   when it reappears, not relaunched: launches stay at the demand;
3. an EC2 instance stopped by hand is terminated, a GCE VM powered off (TERMINATED) is deleted, disks
   included unless the pool sets `keep_stopped_disks`;
4. an allocation placed on an idle instance's agent between the autoscaler's read and its write keeps
   the instance: no terminate reaches the cloud, and the pool's last decision says why (the
   interleaving is forced at the seam between the decision and its write, as in
   tests/control_plane/loops/test_idle_race.py);
6. once a quota error clears, a probe launch (one instance) goes out before the backoff ends, and the
   pool shows state ok with no stale error;
8. bursty arrivals (allocations created minutes apart) keep an instance idle past
   max_idle_agent_period, with the reason, and once they stop it is terminated by twice that period;
and teardown (`terminate_all`) keeps its rows `stopping` until the cloud confirms, so a failed
terminate is retried by the next tick."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from fastapi.testclient import TestClient
from google.auth.credentials import AnonymousCredentials
from sqlalchemy import select

from control_plane.api.app import create_app
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Instance
from control_plane.loops.autoscaler import Autoscaler
from control_plane.master import Master
from provisioners.aws import AwsProvider
from provisioners.base import TAG_CLUSTER, Provider
from provisioners.factory import PoolConfigError, build_provider
from provisioners.gcp import GcpProvider
from tests.conftest import login
from tests.control_plane.loops.conftest import (
    ELASTIC,
    FakeClock,
    add_agent,
    add_allocation,
    agent,
    allocation,
    make_master,
)
from tests.control_plane.loops.test_autoscaler import go_idle
from tests.control_plane.loops.test_idle_race import decide_then, place_now
from tests.fakes.gce import GceFake, running_gce_fake

if TYPE_CHECKING:
    from tests.provisioners.conftest import Ec2FaultProxy

pytestmark = pytest.mark.integration

REGION = "us-east-1"
PROJECT = "shipyard-test-1"
ZONES = ["us-central1-a", "us-central1-b"]


# -- set-up -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_image(moto_server: str, aws_session: boto3.Session) -> str:
    """One AMI of moto's built-in set whose root device is /dev/xvda (looked up once: it is slow)."""
    images = aws_session.client("ec2", region_name=REGION, endpoint_url=moto_server).describe_images()["Images"]
    return str(next(i["ImageId"] for i in images if i.get("RootDeviceName") == "/dev/xvda"))


def _clock() -> FakeClock:
    # The clouds stamp launch times with the real time: the fake clock starts there.
    return FakeClock(datetime.now(UTC).replace(microsecond=0))


def _fast_aws(session: boto3.Session) -> Callable[[str, Provider], Provider]:
    """The pool's own provider, with the bounded retries kept (3 attempts) but their sleeps short."""
    def wrap(_pool: str, p: Provider) -> Provider:
        assert isinstance(p, AwsProvider)
        return AwsProvider(p.cfg, cluster_id=p.cluster_id, pool=p.pool, master_url=p.master_url, session=session,
                           max_attempts=3, call_timeout_s=10, backoff_base_s=0.001, backoff_max_s=0.01)
    return wrap


def _fast_gcp(_pool: str, p: Provider) -> Provider:
    """The pool's own provider with anonymous credentials (the fake checks none) and short retries."""
    assert isinstance(p, GcpProvider)
    return GcpProvider(p.cfg, cluster_id=p.cluster_id, pool=p.pool, master_url=p.master_url,
                       credentials=AnonymousCredentials(), max_attempts=3, call_timeout_s=10, retry_base_s=0.001)


def aws_pool(proxy: Ec2FaultProxy, image: str, **over: Any) -> dict[str, Any]:
    return {"type": "aws", "region": REGION, "image_id": image, "instance_type": "p3.2xlarge", "instance_slots": 1,
            "root_device_name": "/dev/xvda", "endpoint_url": proxy.url, "max_instances": 3,
            "max_agent_starting_period": "1m", **over}


def gcp_pool(fake: GceFake, **over: Any) -> dict[str, Any]:
    return {"type": "gcp", "project": PROJECT, "zones": ZONES, "machine_type": "n1-standard-8",
            "gpu_type": "nvidia-tesla-t4", "gpu_num": 1, "api_endpoint": fake.endpoint,
            "boot_disk_source_image": "projects/shipyard-images/global/images/family/agent-gpu",
            "max_instances": 3, "max_agent_starting_period": "1m", **over}


@pytest.fixture
def gce() -> Iterator[GceFake]:
    with running_gce_fake() as fake:
        yield fake


@pytest.fixture
def masters(db_url: str, tmp_path: Path) -> Iterator[Callable[[dict[str, Any], FakeClock], Master]]:
    made: list[Master] = []

    def make(provider: dict[str, Any], clock: FakeClock) -> Master:
        m = make_master(db_url, tmp_path / f"state-{len(made)}", clock, provider)
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


def rows(master: Master) -> list[Instance]:
    with master.sessions() as s:
        out = list(s.scalars(select(Instance).where(Instance.pool == ELASTIC).order_by(Instance.requested_at,
                                                                                       Instance.launch_id)))
        for r in out:
            s.expunge(r)
        return out


def pool_api(master: Master) -> dict[str, Any]:
    with TestClient(create_app(master)) as client:
        resp = client.get(f"/api/v1/resource-pools/{ELASTIC}", headers=login(client))
        assert resp.status_code == 200, resp.text
        return dict(resp.json()["resourcePool"])


def ec2(session: boto3.Session, moto_url: str) -> Any:
    """A client straight to moto: set-up and inspection, not recorded by the fault proxy."""
    return session.client("ec2", region_name=REGION, endpoint_url=moto_url)


def moto_state(client: Any, instance_id: str) -> str:
    [res] = client.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(res["Instances"][0]["State"]["Name"])


def cluster_volumes(client: Any, cluster_id: str) -> list[dict[str, Any]]:
    return list(client.describe_volumes(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}])["Volumes"])


def tick_until_closed(scaler: Autoscaler, clock: FakeClock, master: Master, launch_id: str, ticks: int = 4) -> None:
    for _ in range(ticks):
        clock.advance(seconds=11)
        scaler.tick()
        if next(r for r in rows(master) if r.launch_id == launch_id).state == InstanceState.TERMINATED:
            return
    raise AssertionError(f"row {launch_id} still {[r.state for r in rows(master)]} after {ticks} ticks")


# -- 1. failed terminations are retried until the cloud says gone ------------------------------------


@pytest.mark.parametrize(("code", "times"), [("UnauthorizedOperation", 1), ("RequestLimitExceeded", 3)],
                         ids=["unauthorized", "throttled-through-retries"])
def test_aws_failed_terminate_stays_stopping_counts_and_is_retried(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
    code: str, times: int,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, max_instances=1), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    assert row.instance_id and len(ec2_faults.calls("RunInstances")) == 1

    clock.advance(minutes=2)  # no agent ever connected: the instance is to be terminated
    ec2_faults.inject("TerminateInstances", code, times=times)
    scaler.tick()
    [row] = rows(master)
    assert row.state == InstanceState.STOPPING and row.terminate_reason.startswith("agent did not connect")
    assert [c.faulted for c in ec2_faults.calls("TerminateInstances")] == [True] * times  # 3: every retry
    moto = ec2(aws_session, ec2_faults_upstream(ec2_faults))
    assert moto_state(moto, row.instance_id) == "running"
    clock.advance(seconds=2)
    scaler.tick()  # the retry is not due yet (it backs off)
    assert len(ec2_faults.calls("TerminateInstances")) == times
    # Still billed: the trial still waits, but max_instances 1 leaves no room for a second launch.
    assert len(ec2_faults.calls("RunInstances")) == 1
    [terminating] = pool_api(master)["lastDecision"]["terminating"]
    assert terminating["instance_id"] == row.instance_id and code in terminating["last_error"]

    tick_until_closed(scaler, clock, master, row.launch_id)
    assert moto_state(moto, row.instance_id) == "terminated"
    sent = ec2_faults.calls("TerminateInstances")
    assert sent[-1].status == 200 and [c.faulted for c in sent].count(False) == 1
    [closed, *_relaunched] = rows(master)
    assert closed.state == InstanceState.TERMINATED and closed.terminated_at is not None


def ec2_faults_upstream(proxy: Ec2FaultProxy) -> str:
    host, port = proxy._upstream  # noqa: SLF001 - the moto server behind the proxy
    return f"http://{host}:{port}"


def test_gcp_failed_delete_stays_stopping_and_is_retried(
    masters: Callable[..., Master], gce: GceFake,
) -> None:
    clock = _clock()
    master = masters(gcp_pool(gce, max_instances=1), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    assert row.instance_id and gce.has_instance(row.instance_id)

    clock.advance(minutes=2)
    gce.inject("delete", status=403, reason="forbidden", message="Required 'compute.instances.delete' permission")
    scaler.tick()
    [row] = rows(master)
    assert row.state == InstanceState.STOPPING and gce.has_instance(row.instance_id)
    assert len(gce.calls_to("delete")) == 1 and len(gce.calls_to("insert")) == 1

    tick_until_closed(scaler, clock, master, row.launch_id)
    assert not gce.has_instance(row.instance_id) and len(gce.calls_to("delete")) == 2
    assert row.instance_id in gce.deleted_disks  # autoDelete: the boot disk went with it


# -- 2. a list miss right after a launch is evidence, not proof -----------------------------------------


def test_aws_instance_missing_from_one_describe_is_kept(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    add_allocation(master, "a1")
    add_allocation(master, "a2")
    scaler.tick()
    first = rows(master)
    assert len(first) == 2 and all(r.state == InstanceState.STARTING for r in first)
    lagging = first[0].instance_id
    assert lagging is not None
    # The next list and the lookup by id both miss it (EC2 "does not know it yet").
    ec2_faults.hide(lagging, times=2, by_id=True)

    for _ in range(3):
        clock.advance(seconds=5)
        scaler.tick()
    assert [c.hidden for c in ec2_faults.calls("DescribeInstances") if c.hidden] == [[lagging], [lagging]]
    assert ec2_faults.calls("TerminateInstances") == []  # neither closed nor killed as an orphan
    assert len(ec2_faults.calls("RunInstances")) == 2  # nor relaunched: launches stay at the demand
    after = rows(master)
    assert [r.launch_id for r in after] == [r.launch_id for r in first]
    assert all(r.state in (InstanceState.STARTING, InstanceState.RUNNING) for r in after)


def test_gcp_instance_missing_from_one_list_is_kept(masters: Callable[..., Master], gce: GceFake) -> None:
    clock = _clock()
    master = masters(gcp_pool(gce), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    add_allocation(master, "a1")
    add_allocation(master, "a2")
    scaler.tick()
    first = rows(master)
    assert len(first) == 2 and first[0].instance_id is not None
    gce.hide_from_list(first[0].instance_id, times=1)

    for _ in range(3):
        clock.advance(seconds=5)
        scaler.tick()
    assert gce.calls_to("delete") == [] and len(gce.calls_to("insert")) == 2
    assert len(gce.instances) == 2
    assert all(r.state in (InstanceState.STARTING, InstanceState.RUNNING) for r in rows(master))


# -- 3. stopped instances are terminated, their disks too unless the pool keeps them ------------------


@pytest.mark.parametrize("keep", [False, True], ids=["disks-deleted", "keep_stopped_disks"])
def test_aws_instance_stopped_by_hand_is_terminated(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
    keep: bool,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, keep_stopped_disks=keep), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    assert row.instance_id is not None
    moto = ec2(aws_session, ec2_faults_upstream(ec2_faults))
    [volume] = cluster_volumes(moto, master.cluster_id)
    moto.stop_instances(InstanceIds=[row.instance_id])

    clock.advance(seconds=5)
    scaler.tick()
    stopped = next(r for r in rows(master) if r.launch_id == row.launch_id)
    assert stopped.state == InstanceState.STOPPING and "stopped" in (stopped.terminate_reason or "")
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("TerminateInstances")] == [row.instance_id]
    assert moto_state(moto, row.instance_id) == "terminated"
    tick_until_closed(scaler, clock, master, row.launch_id)

    left = {v["VolumeId"]: v for v in cluster_volumes(moto, master.cluster_id)}
    if keep:
        assert left[volume["VolumeId"]]["State"] == "available"  # detached, kept
        assert len(ec2_faults.calls("ModifyInstanceAttribute")) == 1
    else:
        assert volume["VolumeId"] not in left
        assert ec2_faults.calls("ModifyInstanceAttribute") == []


def test_aws_keep_stopped_disks_still_deletes_a_running_instance_s_disk(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, keep_stopped_disks=True), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    moto = ec2(aws_session, ec2_faults_upstream(ec2_faults))
    [volume] = cluster_volumes(moto, master.cluster_id)
    clock.advance(minutes=2)  # its agent never connected: terminated while running
    scaler.tick()
    tick_until_closed(scaler, clock, master, row.launch_id)
    assert volume["VolumeId"] not in {v["VolumeId"] for v in cluster_volumes(moto, master.cluster_id)}
    assert ec2_faults.calls("ModifyInstanceAttribute") == []


@pytest.mark.parametrize("keep", [False, True], ids=["disks-deleted", "keep_stopped_disks"])
def test_gcp_powered_off_vm_is_deleted(masters: Callable[..., Master], gce: GceFake, keep: bool) -> None:
    clock = _clock()
    master = masters(gcp_pool(gce, keep_stopped_disks=keep), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    assert row.instance_id is not None and gce.disks == [row.instance_id]
    gce.set_status(row.instance_id, "TERMINATED")  # the agent powered it off (lost its master)

    clock.advance(seconds=5)
    scaler.tick()
    stopped = next(r for r in rows(master) if r.launch_id == row.launch_id)
    assert stopped.state == InstanceState.STOPPING and "stopped" in (stopped.terminate_reason or "")
    assert len(gce.calls_to("delete")) == 1
    tick_until_closed(scaler, clock, master, row.launch_id)
    assert not gce.has_instance(row.instance_id)
    if keep:
        assert row.instance_id in gce.disks and gce.deleted_disks == []
        assert len(gce.calls_to("setDiskAutoDelete")) == 1
    else:
        assert gce.deleted_disks == [row.instance_id]
        assert gce.calls_to("setDiskAutoDelete") == []


# -- 6. a quota error ends with its cause, and a probe finds out early -------------------------------


def test_aws_quota_error_clears_after_a_probe_launch(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, launch_error_backoff="20m", launch_error_backoff_max="30m",
                              launch_probe_interval="5m", max_agent_starting_period="1h"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    add_allocation(master, "a1")
    add_allocation(master, "a2")
    ec2_faults.inject("RunInstances", "VcpuLimitExceeded", times=None)
    scaler.tick()
    pool = pool_api(master)
    assert pool["state"] == PoolState.BACKOFF and "VcpuLimitExceeded" in pool["error"]
    failed_calls = len(ec2_faults.calls("RunInstances"))

    ec2_faults.clear()  # the quota was raised
    clock.advance(minutes=4)
    scaler.tick()  # before the probe interval: nothing
    assert ec2_faults.calls("RunInstances") == [] and failed_calls >= 1
    clock.advance(minutes=1, seconds=1)
    scaler.tick()  # 5m after the failure, 15m before the backoff ends: one instance probes
    [probe] = ec2_faults.calls("RunInstances")
    assert (probe.params["MinCount"], probe.params["MaxCount"], probe.status) == ("1", "1", 200)
    pool = pool_api(master)
    assert (pool["state"], pool["error"]) == (PoolState.OK, None)

    clock.advance(seconds=5)
    scaler.tick()  # the backoff is over: the rest of the demand launches
    assert len(ec2_faults.calls("RunInstances")) == 2
    pool = pool_api(master)
    assert (pool["state"], pool["error"]) == (PoolState.OK, None)
    assert len([r for r in rows(master) if r.state != InstanceState.TERMINATED]) == 2


def test_gcp_quota_error_clears_after_a_probe_launch(masters: Callable[..., Master], gce: GceFake) -> None:
    clock = _clock()
    master = masters(gcp_pool(gce, launch_error_backoff="20m", launch_error_backoff_max="30m",
                              launch_probe_interval="5m", max_agent_starting_period="1h"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    add_allocation(master, "a1")
    add_allocation(master, "a2")
    quota = gce.inject("insert", code="QUOTA_EXCEEDED", times=None)
    scaler.tick()
    pool = pool_api(master)
    assert pool["state"] == PoolState.BACKOFF and "QUOTA_EXCEEDED" in pool["error"]
    assert gce.instances == []

    quota.times = quota.hits  # the quota was raised
    inserts = len(gce.calls_to("insert"))
    clock.advance(minutes=5, seconds=1)
    scaler.tick()  # one instance probes, 15m before the backoff ends
    assert len(gce.calls_to("insert")) == inserts + 1 and len(gce.instances) == 1
    pool = pool_api(master)
    assert (pool["state"], pool["error"]) == (PoolState.OK, None)
    clock.advance(seconds=5)
    scaler.tick()
    assert len(gce.instances) == 2 and pool_api(master)["error"] is None


# -- teardown: rows stay stopping until the cloud confirms ---------------------------------------------


def test_aws_teardown_whose_terminate_fails_is_retried_by_the_next_tick(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, max_agent_starting_period="1h"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    assert row.instance_id is not None

    ec2_faults.inject("TerminateInstances", "UnauthorizedOperation")
    assert scaler.terminate_all(ELASTIC) == 1
    [row] = rows(master)
    assert row.state == InstanceState.STOPPING and row.terminate_reason == "cluster or pool taken down"
    moto = ec2(aws_session, ec2_faults_upstream(ec2_faults))
    assert moto_state(moto, row.instance_id) == "running"
    assert pool_api(master)["state"] == PoolState.DISABLED

    tick_until_closed(scaler, clock, master, row.launch_id)
    assert moto_state(moto, row.instance_id) == "terminated"
    assert len(ec2_faults.calls("RunInstances")) == 1  # a torn-down pool launches nothing


# -- keep_stopped_disks: a bad value names the field ------------------------------------------------


@pytest.mark.parametrize(("provider", "field"), [
    ({"type": "aws", "region": REGION, "image_id": "ami-1", "instance_type": "p3.2xlarge", "instance_slots": 1},
     "keep_stopped_disks"),
    ({"type": "gcp", "project": PROJECT, "zones": ZONES, "machine_type": "n1-standard-8", "instance_slots": 4,
      "boot_disk_source_image": "projects/x/global/images/y"}, "keep_stopped_disks"),
])
def test_keep_stopped_disks_must_be_a_boolean(provider: dict[str, Any], field: str, tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError) as err:
        build_provider({**provider, "keep_stopped_disks": "yes"}, pool="gpu", cluster_id="c1",
                       master_url="http://m:8080", state_dir=tmp_path)
    assert f"{field}: must be true or false" in str(err.value), str(err.value)


# -- 4. a placement committed between the idle decision and its write keeps the instance -------------


def idle_instance(master: Master, scaler: Autoscaler, clock: FakeClock, idle: timedelta) -> Instance:
    """One instance launched for trial a1, its agent (named after the instance) connected, the trial
    run and finished there; then `idle` passes."""
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    assert row.instance_id is not None
    clock.advance(seconds=5)
    add_agent(master, row.instance_id, slots=1, instance_id=row.instance_id)
    scaler.tick()
    go_idle(master, "a1", row.instance_id)
    clock.advance(seconds=idle.total_seconds())
    [row] = rows(master)
    assert row.state == InstanceState.RUNNING
    return row


def test_aws_placement_between_the_idle_decision_and_its_write_keeps_the_instance(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, max_idle_agent_period="1m"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    row = idle_instance(master, scaler, clock, timedelta(seconds=61))
    agent_id = row.instance_id
    assert agent_id is not None
    decided: list[list[str]] = []

    def trial_arrives_and_is_placed(decision: Any) -> None:
        decided.append([t.id for t in decision.terminate if t.presumes_idle])
        add_allocation(master, "a2")
        place_now(master)  # commits between the autoscaler's read and its write
        assert allocation(master, "a2").agent_id == agent_id

    decide_then(monkeypatch, trial_arrives_and_is_placed)
    scaler.tick()
    monkeypatch.undo()

    assert decided == [[row.launch_id]]  # the snapshot said idle past the period
    assert ec2_faults.calls("TerminateInstances") == []
    assert moto_state(ec2(aws_session, ec2_faults_upstream(ec2_faults)), agent_id) == "running"
    [after] = rows(master)
    assert (after.state, after.terminate_reason) == (InstanceState.RUNNING, None)
    assert agent(master, agent_id).enabled
    a2 = allocation(master, "a2")
    assert (a2.state, a2.agent_id) == ("assigned", agent_id)
    decision = pool_api(master)["lastDecision"]
    assert decision["terminate"] == []
    assert (f"not terminating {row.launch_id}: its agent {agent_id} took 1 allocation since the decision"
            in decision["reasons"]), decision["reasons"]

    clock.advance(seconds=30)
    scaler.tick()  # busy now: nothing to decide about it
    assert ec2_faults.calls("TerminateInstances") == [] and rows(master)[0].state == InstanceState.RUNNING
    assert allocation(master, "a2").agent_id == agent_id


# -- 8. bursty arrivals keep an idle instance, up to twice max_idle_agent_period ---------------------


def bursty_history(master: Master, start: datetime) -> None:
    """Eight trials created 3 minutes apart in the 24 minutes before `start` (they ran and ended)."""
    for k in range(1, 9):
        add_allocation(master, f"h{k}", state="terminated", created_at=start - k * timedelta(minutes=3))


def booted_in(master: Master, row: Instance, boot: timedelta) -> None:
    """The instance's agent first connected `boot` after the launch (a GPU image's boot, not the
    fakes' seconds): the idle policy prices a relaunch with the pool's measured boots."""
    assert row.launched_at is not None and row.instance_id is not None
    with transaction(master.sessions) as s:
        agent = s.get(Agent, row.instance_id)
        assert agent is not None
        agent.registered_at = row.launched_at + boot


# The idle policy's reason for keeping it (core/scaling/idle.py): idling until the next arrival costs
# less than a relaunch after a 3-minute boot; then its numbers, and the hard bound.
KEPT_FOR_ARRIVALS = "idle for 5m1s (max_idle_agent_period 5m): the next arrival that fits is expected in "


def assert_kept_for_arrivals(master: Master, row: Instance) -> None:
    reasons = pool_api(master)["lastDecision"]["reasons"]
    kept = [r for r in reasons if r.startswith(f"keeping {row.launch_id} ")]
    assert len(kept) == 1 and KEPT_FOR_ARRIVALS in kept[0], reasons
    assert "boot 3m, median of 1 measured boot" in kept[0] and kept[0].endswith("at most 10m idle"), kept


def test_aws_bursty_arrivals_keep_an_idle_instance_until_twice_max_idle_agent_period(
    masters: Callable[..., Master], ec2_faults: Ec2FaultProxy, aws_session: boto3.Session, moto_image: str,
) -> None:
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, max_idle_agent_period="5m"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    bursty_history(master, clock())
    row = idle_instance(master, scaler, clock, timedelta(minutes=5, seconds=1))
    assert row.instance_id is not None
    booted_in(master, row, timedelta(minutes=3))
    moto = ec2(aws_session, ec2_faults_upstream(ec2_faults))

    scaler.tick()
    assert ec2_faults.calls("TerminateInstances") == []
    assert_kept_for_arrivals(master, row)

    for _ in range(4):  # no more arrivals: still kept while idle at most 10m (9m1s here)
        clock.advance(minutes=1)
        scaler.tick()
    assert ec2_faults.calls("TerminateInstances") == [] and moto_state(moto, row.instance_id) == "running"
    clock.advance(minutes=1)  # idle 10m1s: past the bound
    scaler.tick()
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("TerminateInstances")] == [row.instance_id]
    assert moto_state(moto, row.instance_id) == "terminated"
    tick_until_closed(scaler, clock, master, row.launch_id)
    [closed] = rows(master)
    assert closed.terminate_reason == "idle for 10m1s (max_idle_agent_period 5m): past the hard bound 10m"
    assert len(ec2_faults.calls("RunInstances")) == 1


def test_gcp_bursty_arrivals_keep_an_idle_vm_until_twice_max_idle_agent_period(
    masters: Callable[..., Master], gce: GceFake,
) -> None:
    clock = _clock()
    master = masters(gcp_pool(gce, max_idle_agent_period="5m"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    bursty_history(master, clock())
    row = idle_instance(master, scaler, clock, timedelta(minutes=5, seconds=1))
    assert row.instance_id is not None
    booted_in(master, row, timedelta(minutes=3))

    scaler.tick()
    assert gce.calls_to("delete") == []
    assert_kept_for_arrivals(master, row)
    clock.advance(minutes=4, seconds=59)  # idle 10m: still kept
    scaler.tick()
    assert gce.calls_to("delete") == [] and gce.has_instance(row.instance_id)
    clock.advance(seconds=1)
    scaler.tick()
    assert len(gce.calls_to("delete")) == 1
    tick_until_closed(scaler, clock, master, row.launch_id)
    assert not gce.has_instance(row.instance_id)
    [closed] = rows(master)
    assert closed.terminate_reason == "idle for 10m1s (max_idle_agent_period 5m): past the hard bound 10m"
    assert len(gce.calls_to("insert")) == 1
