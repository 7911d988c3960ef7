"""The warm pool at the cloud edge: the real autoscaler (ticked by hand on a fake clock) drives the
real AWS provider against the moto server and the real GCP provider against the GCE fake, on SQLite
and PostgreSQL. A pool with `warm_pool_size: 1`:

* an instance idle past max_idle_agent_period is parked (stopped at the cloud, its row `parking`,
  then `parked` once the cloud says stopped), not terminated, and the pool's decision says why;
* the next pending task starts it again (no launch): the row is `starting` as if launched then, its
  agent enabled; the agent registers again with the credential it enrolled with (the bootstrap
  token of the launch's user-data), its start time is measured, and placement puts the task there;
* a start the cloud refuses for lack of capacity in its zone terminates the parked instance, and
  the next decision launches;
* a parked instance past warm_pool_max_age is terminated, and teardown terminates parked ones;
* a pool that cannot have a warm pool is refused with the field and the reason."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from control_plane import auth
from control_plane.core.states import InstanceState
from control_plane.db.engine import transaction
from control_plane.db.models import Instance
from control_plane.loops import placement
from control_plane.loops.autoscaler import Autoscaler, warm
from control_plane.master import Master
from control_plane.services import agents as agents_service
from provisioners.factory import PoolConfigError, resolve
from shipyard_common.agent_protocol import RegisterRequest, SlotInfo
from tests.control_plane.loops.conftest import ELASTIC, FakeClock, add_allocation, agent, allocation
from tests.control_plane.loops.test_autoscaler import go_idle
from tests.e2e.boot import GceFakeCloud, MotoCloud, parse_user_data
from tests.fakes.gce import GceFake
from tests.provisioners.test_elastic_regressions import (  # noqa: F401  (fixtures)
    _clock,
    _fast_aws,
    _fast_gcp,
    aws_pool,
    ec2,
    ec2_faults_upstream,
    gce,
    gcp_pool,
    masters,
    moto_image,
    moto_state,
    pool_api,
    rows,
)

pytestmark = pytest.mark.integration

WARM = {"warm_pool_size": 1, "max_idle_agent_period": "1m", "arrival_window": "0s"}


def enrol(master: Master, token: str, instance_id: str) -> str | None:
    """The agent's registration as its daemon sends it: the credential it answers with (at enrolment)."""
    with master.sessions() as s:
        p = auth.resolve_token(s, token, now=master.clock())
    assert p is not None
    with transaction(master.sessions) as s:
        resp = agents_service.register_agent(s, master, p, RegisterRequest(
            agent_id=instance_id, resource_pool=ELASTIC, slots=[SlotInfo(id="0")], instance_id=instance_id))
    return resp.agent_credential


def bootstrap_token(user_data: str) -> str:
    files = {f["path"]: f["content"] for f in parse_user_data(user_data)["write_files"]}
    return str(files["/etc/shipyard/agent-token"]).strip()


def row_of(master: Master, launch_id: str) -> Instance:
    return next(r for r in rows(master) if r.launch_id == launch_id)


def park_and_start(master: Master, scaler: Autoscaler, clock: FakeClock, cloud_state: Callable[[str], str],
                   user_data: Callable[[str], str], launches: Callable[[], int]) -> str:
    """The whole round: launched for a task, idle, parked, started again for the next task, the task
    placed there. The instance id."""
    add_allocation(master, "a1")
    scaler.tick()
    [row] = rows(master)
    iid = row.instance_id
    assert iid is not None and launches() == 1
    credential = enrol(master, bootstrap_token(user_data(iid)), iid)
    assert credential is not None
    go_idle(master, "a1", iid)

    clock.advance(minutes=2)  # idle past max_idle_agent_period (1m)
    scaler.tick()
    parking = row_of(master, row.launch_id)
    assert parking.state in (InstanceState.PARKING, InstanceState.PARKED) and parking.parked_at == clock()
    assert cloud_state(iid) in ("stopping", "stopped")
    assert agent(master, iid).enabled is False  # claimed idle: nothing lands on it meanwhile
    decision = pool_api(master)["lastDecision"]
    assert any(r.startswith(f"park {row.launch_id}: idle for 2m") and "warm pool (1 of warm_pool_size 1)" in r
               for r in decision["reasons"]), decision
    assert decision["terminate"] == []
    history = pool_api(master)["scalingHistory"]
    assert [x["cause"] for e in history for x in e["terminations"]] == [warm.CAUSE_PARK]
    assert agent(master, iid).state == "connected"  # its heartbeats have not timed out yet
    clock.advance(seconds=10)
    scaler.tick()
    assert row_of(master, row.launch_id).state == InstanceState.PARKED
    assert cloud_state(iid) == "stopped"
    assert agent(master, iid).state == "disconnected"  # powered off: no work may be placed there
    clock.advance(minutes=10)
    scaler.tick()  # parked, and no work: nothing happens, the instance stays stopped
    assert row_of(master, row.launch_id).state == InstanceState.PARKED and launches() == 1

    add_allocation(master, "a2")
    scaler.tick()
    started = row_of(master, row.launch_id)
    assert started.state in (InstanceState.STARTING, InstanceState.RUNNING) and started.resumed_at == clock()
    assert len(rows(master)) == 1 and launches() == 1  # started, not launched
    assert cloud_state(iid) in ("pending", "running")
    assert agent(master, iid).enabled is True
    assert any(r.startswith(f"start 1 parked instance from the warm pool ({row.launch_id})")
               for r in pool_api(master)["lastDecision"]["reasons"])

    clock.advance(seconds=40)
    assert enrol(master, credential, iid) is None  # back with its own credential: not enrolled again
    assert row_of(master, row.launch_id).resume_connected_at == clock()
    with master.sessions() as s:
        assert warm.start_times(s, ELASTIC) == (clock() - started.resumed_at,)
    placement.tick(master)
    assert allocation(master, "a2").agent_id == iid
    scaler.tick()
    assert row_of(master, row.launch_id).state == InstanceState.RUNNING and launches() == 1
    return iid


def aws_warm_pool(masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
                  moto_image: str,  # noqa: F811
                  **over: Any) -> tuple[FakeClock, Master, Autoscaler, str, Any]:
    """An AWS pool with a warm pool of one: its clock, master, autoscaler, moto's URL and a client to it."""
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, **WARM, **over), clock)
    upstream = ec2_faults_upstream(ec2_faults)
    return clock, master, Autoscaler(master, wrap_provider=_fast_aws(aws_session)), upstream, ec2(aws_session, upstream)


def test_aws_an_idle_instance_is_parked_and_started_again_instead_of_a_launch(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    clock, master, scaler, upstream, moto = aws_warm_pool(masters, ec2_faults, aws_session, moto_image)
    iid = park_and_start(master, scaler, clock, lambda i: moto_state(moto, i), MotoCloud(upstream).user_data,
                         lambda: len(ec2_faults.calls("RunInstances")))
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("StopInstances")] == [iid]
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("StartInstances")] == [iid]
    assert ec2_faults.calls("TerminateInstances") == []


def gce_state(fake: GceFake, name: str) -> str:
    status = fake.instance(name)["status"]
    return {"TERMINATED": "stopped", "STOPPING": "stopping", "RUNNING": "running"}.get(status, "pending")


def test_gcp_an_idle_vm_is_parked_and_started_again_instead_of_a_launch(
        masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    clock = _clock()
    master = masters(gcp_pool(gce, **WARM), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    iid = park_and_start(master, scaler, clock, lambda n: gce_state(gce, n), GceFakeCloud(gce).user_data,
                         lambda: len(gce.calls_to("insert")))
    assert len(gce.calls_to("stop")) == 1 and len(gce.calls_to("start")) == 1 and gce.calls_to("delete") == []
    assert gce.instance(iid)["status"] == "RUNNING"


def idle_past_its_period(master: Master, scaler: Autoscaler, clock: FakeClock, user_data: Callable[[str], str],
                         alloc: str = "a1") -> Instance:
    """An instance launched for a task, its agent enrolled with the user-data's token, the task
    done; then idle for 2 minutes (past max_idle_agent_period 1m) and one tick. Its row before it."""
    add_allocation(master, alloc)
    scaler.tick()
    [row] = [r for r in rows(master) if r.state in (InstanceState.STARTING, InstanceState.RUNNING)]
    assert row.instance_id is not None
    enrol(master, bootstrap_token(user_data(row.instance_id)), row.instance_id)
    go_idle(master, alloc, row.instance_id)
    clock.advance(minutes=2)
    scaler.tick()
    return row


def parked_instance(master: Master, scaler: Autoscaler, clock: FakeClock, user_data: Callable[[str], str],
                    alloc: str = "a1") -> Instance:
    """An instance launched for a task, its agent enrolled, idle, then parked."""
    row = idle_past_its_period(master, scaler, clock, user_data, alloc)
    assert row.instance_id is not None
    clock.advance(seconds=10)
    scaler.tick()
    row = row_of(master, row.launch_id)
    assert row.state == InstanceState.PARKED
    return row


def test_aws_a_start_refused_for_capacity_terminates_the_parked_instance_and_launches(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    clock, master, scaler, upstream, moto = aws_warm_pool(masters, ec2_faults, aws_session, moto_image)
    row = parked_instance(master, scaler, clock, MotoCloud(upstream).user_data)
    ec2_faults.inject("StartInstances", "InsufficientInstanceCapacity", times=1)

    add_allocation(master, "a2")
    scaler.tick()
    refused = row_of(master, row.launch_id)
    assert refused.state == InstanceState.STOPPING
    assert refused.terminate_reason and refused.terminate_reason.startswith("start from the warm pool failed: capacity")
    assert moto_state(moto, str(row.instance_id)) in ("shutting-down", "terminated")
    clock.advance(seconds=5)
    scaler.tick()  # the task still waits: a launch (elsewhere) replaces the refused start
    assert len(ec2_faults.calls("RunInstances")) == 2
    assert len([r for r in rows(master) if r.state in (InstanceState.STARTING, InstanceState.RUNNING)]) == 1


def test_aws_a_parked_instance_past_max_age_is_terminated_and_teardown_terminates_parked_ones(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    clock, master, scaler, upstream, moto = aws_warm_pool(masters, ec2_faults, aws_session, moto_image, warm_pool_max_age="1h")
    row = parked_instance(master, scaler, clock, MotoCloud(upstream).user_data)
    clock.advance(minutes=30)
    scaler.tick()
    assert row_of(master, row.launch_id).state == InstanceState.PARKED
    clock.advance(minutes=31)
    scaler.tick()
    old = row_of(master, row.launch_id)
    assert old.state in (InstanceState.STOPPING, InstanceState.TERMINATED)
    assert old.terminate_reason and "(warm_pool_max_age 1h)" in old.terminate_reason
    assert moto_state(moto, str(row.instance_id)) in ("shutting-down", "terminated")

    clock.advance(seconds=30)
    scaler.tick()
    new = parked_instance(master, scaler, clock, MotoCloud(upstream).user_data, alloc="b1")
    assert new.instance_id is not None and new.launch_id != row.launch_id
    assert scaler.terminate_all(ELASTIC) == 1
    assert row_of(master, new.launch_id).state == InstanceState.STOPPING
    assert moto_state(moto, new.instance_id) in ("shutting-down", "terminated")


@pytest.mark.parametrize(("over", "field", "reason"), [
    ({"type": "local", "warm_pool_size": 1}, "warm_pool_size", "cannot stop and start instances"),
    ({"warm_pool_size": -1}, "warm_pool_size", "greater than or equal to 0"),
    ({"warm_pool_size": 1, "keep_stopped_disks": True}, "warm_pool_size", "keep_stopped_disks"),
])
def test_a_pool_that_cannot_keep_a_warm_pool_is_refused(over: dict[str, Any], field: str, reason: str,
                                                       tmp_path: Path) -> None:
    base = {"type": "aws", "region": "us-east-1", "image_id": "ami-1", "instance_type": "p3.2xlarge"}
    if over.get("type") == "local":
        base = {"type": "local"}
    with pytest.raises(PoolConfigError) as e:
        resolve({**base, **over})
    assert any(path == field and reason in why for path, why in e.value.problems), e.value.problems


def test_parked_rows_stay_accounted_for(masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    """A parked VM deleted by hand is noticed: its row ends (the cloud says it is gone)."""
    clock = _clock()
    master = masters(gcp_pool(gce, **WARM, list_miss_grace="0s"), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    row = idle_past_its_period(master, scaler, clock, GceFakeCloud(gce).user_data)
    assert row.instance_id is not None
    clock.advance(seconds=10)
    scaler.tick()
    assert row_of(master, row.launch_id).state == InstanceState.PARKED
    gce._remove_instance(gce._find(row.instance_id))  # deleted outside the master
    clock.advance(seconds=10)
    scaler.tick()
    gone = row_of(master, row.launch_id)
    assert gone.state == InstanceState.TERMINATED and "disappeared" in (gone.terminate_reason or "")


def test_aws_a_stop_refused_for_good_terminates_the_instance_instead(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    """An instance that cannot be stopped (AWS UnsupportedOperation) does not stay `parking`, running
    and billing: it is terminated, as it would have been without a warm pool."""
    clock, master, scaler, upstream, moto = aws_warm_pool(masters, ec2_faults, aws_session, moto_image)
    ec2_faults.inject("StopInstances", "UnsupportedOperation", times=None)
    row = idle_past_its_period(master, scaler, clock, MotoCloud(upstream).user_data)
    assert row.instance_id is not None
    ended = row_of(master, row.launch_id)
    assert ended.state == InstanceState.STOPPING
    assert ended.terminate_reason and ended.terminate_reason.startswith("stop for the warm pool refused: invalid")
    assert moto_state(moto, row.instance_id) in ("shutting-down", "terminated")


def test_aws_a_stop_that_does_not_take_effect_terminates_the_instance_after_ten_minutes(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    """The master's role may not stop instances (UnauthorizedOperation): the instance must not stay
    running, billed and disabled, as `parking` until warm_pool_max_age."""
    clock, master, scaler, upstream, moto = aws_warm_pool(masters, ec2_faults, aws_session, moto_image)
    ec2_faults.inject("StopInstances", "UnauthorizedOperation", times=None)
    row = idle_past_its_period(master, scaler, clock, MotoCloud(upstream).user_data)
    assert row.instance_id is not None
    for _ in range(6):
        clock.advance(minutes=2)
        scaler.tick()
        if row_of(master, row.launch_id).state != InstanceState.PARKING:
            break
    ended = row_of(master, row.launch_id)
    assert ended.state == InstanceState.STOPPING and clock() - (ended.parked_at or clock()) > timedelta(minutes=10)
    assert ended.terminate_reason and ended.terminate_reason.startswith("stop for the warm pool not done 10m after the park")
    assert "UnauthorizedOperation" in ended.terminate_reason
    assert moto_state(moto, row.instance_id) in ("shutting-down", "terminated")


def test_aws_a_parked_instance_started_behind_the_masters_back_is_stopped_again(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    clock, master, scaler, upstream, moto = aws_warm_pool(masters, ec2_faults, aws_session, moto_image)
    row = parked_instance(master, scaler, clock, MotoCloud(upstream).user_data)
    assert row.instance_id is not None
    moto.start_instances(InstanceIds=[row.instance_id])  # by hand, in the console
    clock.advance(seconds=10)
    scaler.tick()
    again = row_of(master, row.launch_id)
    assert again.state == InstanceState.PARKING and again.parked_at == clock()  # it ran: parked anew
    assert len(ec2_faults.calls("StopInstances")) == 2 and moto_state(moto, row.instance_id) in ("stopping", "stopped")
    clock.advance(seconds=10)
    scaler.tick()
    assert row_of(master, row.launch_id).state == InstanceState.PARKED
