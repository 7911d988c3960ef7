"""Consolidation at the cloud edge: the real autoscaler (ticked by hand on a fake clock) drives the
real AWS provider against the moto server and the real GCP provider against the GCE fake, on SQLite
and PostgreSQL. Three instances of 4 slots each run one 1-slot allocation; with
`consolidation: {enabled: true, max_moves_per_hour: 1, min_run_time: 10m}`:

* before min_run_time nothing moves, and the pool says why;
* then one instance is emptied: its agent is cordoned, its allocation asked to checkpoint and stop
  (the preemption path), the move recorded with its reason and saving and shown by the API;
* once the allocation has exited (preempted, not a failure) the instance is terminated at the cloud
  with the reason "consolidated";
* a second move within the hour is refused by the budget, with its reason; after the hour it goes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest
from sqlalchemy import select

from control_plane.core import states as st
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, ConsolidationMove, Instance, ResourcePool
from control_plane.loops.autoscaler import Autoscaler
from control_plane.loops.autoscaler.decision import claim_idle
from control_plane.master import Master
from control_plane.services import agents, allocations
from shipyard_common import clouds
from tests.control_plane.loops.conftest import (
    ELASTIC,
    FakeClock,
    add_agent,
    add_allocation,
    agent,
    allocation,
)
from tests.fakes.gce import GceFake
from tests.provisioners.test_elastic_regressions import (  # noqa: F401  (fixtures)
    REGION,
    ZONES,
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

BUDGET = {"enabled": True, "max_moves_per_hour": 1, "min_run_time": "10m"}


def three_quarter_empty_instances(master: Master, scaler: Autoscaler, clock: FakeClock) -> list[str]:
    """Three instances launched for three 4-slot trials, their agents connected; then the trials are
    gone and one 1-slot allocation runs on each instance. The agents' ids (the cloud's instance ids)."""
    for n in range(3):
        add_allocation(master, f"w{n}", slots=4)
    scaler.tick()
    launched = rows(master)
    assert len(launched) == 3 and all(r.instance_id for r in launched)
    clock.advance(seconds=5)
    ids = [str(r.instance_id) for r in launched]
    with transaction(master.sessions) as s:
        for n in range(3):
            row = s.get(Allocation, f"w{n}")
            assert row is not None
            row.state, row.end_cause, row.ended_at = st.AllocationState.TERMINATED, st.ExitCause.KILLED, clock()
    for n, iid in enumerate(ids):
        add_agent(master, iid, slots=4, instance_id=iid)
        add_allocation(master, f"t{n}", slots=1, state="running", agent_id=iid, slot_ids=["0"])
    scaler.tick()
    assert [r.state for r in rows(master)] == [InstanceState.RUNNING] * 3
    return ids


def moves(master: Master) -> list[ConsolidationMove]:
    with master.sessions() as s:
        out = list(s.scalars(select(ConsolidationMove).order_by(ConsolidationMove.id)))
        s.expunge_all()
        return out


def exit_preempted(master: Master, alloc_id: str) -> None:
    """The trial saw `should_preempt`, checkpointed and exited 0: what its agent reports."""
    with transaction(master.sessions) as s:
        row = s.get(Allocation, alloc_id)
        assert row is not None
        allocations.end_allocation(s, master, row, cause=st.ExitCause.EXITED, reason=None, exit_code=0)


def consolidate_twice(master: Master, scaler: Autoscaler, clock: FakeClock,
                      gone: Callable[[str], bool], usd_per_hour: float) -> None:
    """`usd_per_hour`: what one instance costs, so what emptying one saves."""
    ids = three_quarter_empty_instances(master, scaler, clock)
    scaler.tick()
    assert moves(master) == []
    decision = pool_api(master)["lastDecision"]["consolidation"]
    assert "min_run_time 600s" in " ".join(decision["refused"]), decision

    clock.advance(minutes=11)
    scaler.tick()
    [move] = moves(master)
    emptied = move.instance_id
    assert emptied in ids and move.allocation_id == f"t{ids.index(emptied)}"
    assert move.saving == pytest.approx(usd_per_hour) and move.saving_unit == "$/h"
    assert f"${move.saving:.2f}/h" in move.reason
    assert allocation(master, move.allocation_id).preempt_requested  # checkpoint and stop: the preemption path
    assert agent(master, emptied).enabled is False  # cordoned
    shown = pool_api(master)["consolidationMoves"]
    assert [(m["instanceId"], m["allocationId"], m["reason"]) for m in shown] == [
        (emptied, move.allocation_id, move.reason)]
    assert not gone(emptied)

    # Its work has not exited yet: the instance stays; once it has (preempted, not a failure), it goes.
    clock.advance(seconds=10)
    scaler.tick()
    assert next(r for r in rows(master) if r.instance_id == emptied).state == InstanceState.RUNNING
    exit_preempted(master, move.allocation_id)
    assert allocation(master, move.allocation_id).end_cause == st.ExitCause.PREEMPTED
    clock.advance(seconds=10)
    scaler.tick()
    row = next(r for r in rows(master) if r.instance_id == emptied)
    assert row.state in (InstanceState.STOPPING, InstanceState.TERMINATED)
    assert row.terminate_reason and row.terminate_reason.startswith("consolidated")
    assert gone(emptied)
    # The autoscaler's history (services/scaling_history.py): the move, then the emptied instance's
    # termination with its cause.
    history = pool_api(master)["scalingHistory"]
    [moved] = [e for e in history if e["kind"] == "consolidate"]
    assert moved["moves"]["allocations"] == [move.allocation_id] and moved["reasons"] == [move.reason]
    [ended] = [x for e in history for x in e["terminations"] if x["cause"] == "consolidated"]
    assert ended["id"] == row.launch_id and ended["reason"].startswith("consolidated")

    # The remaining two each run one allocation: a second move fits, but the budget is spent.
    clock.advance(minutes=20)
    scaler.tick()
    assert len(moves(master)) == 1
    refused = " ".join(pool_api(master)["lastDecision"]["consolidation"]["refused"])
    assert "disruption budget: moving 1 allocation exceeds the 0 moves left this hour (max_moves_per_hour 1)" \
        in refused, refused
    clock.advance(minutes=41)  # the first move is over an hour old
    scaler.tick()
    assert len(moves(master)) == 2, pool_api(master)["lastDecision"]


def test_aws_consolidation_empties_an_instance_under_the_budget(
        masters: Callable[..., Master], ec2_faults: Any, aws_session: boto3.Session,  # noqa: F811
        moto_image: str) -> None:  # noqa: F811
    clock = _clock()
    master = masters(aws_pool(ec2_faults, moto_image, instance_slots=4, consolidation=BUDGET), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_aws(aws_session))
    moto = ec2(aws_session, ec2_faults_upstream(ec2_faults))
    price = clouds.regional_price("aws", REGION, "p3.2xlarge")
    assert price is not None
    consolidate_twice(master, scaler, clock, lambda iid: moto_state(moto, iid) in ("shutting-down", "terminated"),
                      price.on_demand)


def test_gcp_consolidation_empties_an_instance_under_the_budget(
        masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    clock = _clock()
    master = masters(gcp_pool(gce, gpu_num=4, consolidation=BUDGET), clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    # The machine and its four attached T4s (the machine type's list price alone was taken before).
    price = clouds.gcp_vm_price(clouds.gcp_region(ZONES[0]), "n1-standard-8", "nvidia-tesla-t4", 4)
    assert price is not None and price.on_demand > clouds.on_demand_usd_per_hour("n1-standard-8")  # type: ignore[operator]
    consolidate_twice(master, scaler, clock,
                      lambda iid: not gce.has_instance(iid) or gce.instance(iid)["status"] in ("STOPPING", "TERMINATED"),
                      price.on_demand)


# ---- replacement by a cheaper machine (GCP's A2 sizes) -------------------------------------------

def a2_pool(fake: GceFake) -> dict[str, Any]:
    """A pool of two A2 sizes (1 and 4 A100s, their GPUs known from the catalogue)."""
    cfg = {k: v for k, v in gcp_pool(fake, consolidation=BUDGET).items()
           if k not in ("machine_type", "gpu_type", "gpu_num")}
    return {**cfg, "machine_types": [{"machine_type": "a2-highgpu-1g"}, {"machine_type": "a2-highgpu-4g"}]}


def a_4g_running_one_slot(masters: Callable[..., Master], gce: GceFake,  # noqa: F811
                          **over: Any) -> tuple[Master, Autoscaler, FakeClock, str]:
    """A pool of two A2 sizes where a 4-slot trial got an a2-highgpu-4g and now one 1-slot
    allocation runs there: the master, its autoscaler and clock, and that instance's id."""
    clock = _clock()
    master = masters({**a2_pool(gce), **over}, clock)
    scaler = Autoscaler(master, wrap_provider=_fast_gcp)
    add_allocation(master, "w", slots=4)
    scaler.tick()
    [row] = rows(master)
    assert row.instance_type == "a2-highgpu-4g" and row.instance_id
    iid = str(row.instance_id)
    clock.advance(seconds=5)
    with transaction(master.sessions) as s:
        w = s.get(Allocation, "w")
        assert w is not None
        w.state, w.end_cause, w.ended_at = st.AllocationState.TERMINATED, st.ExitCause.KILLED, clock()
    add_agent(master, iid, slots=4, instance_id=iid)
    add_allocation(master, "t", slots=1, state="running", agent_id=iid, slot_ids=["0"])
    with transaction(master.sessions) as s:  # running past min_run_time (10m) already: the cloud
        t = s.get(Allocation, "t")           # stamps launches with the real time, so the clock stays
        assert t is not None
        t.started_at = t.assigned_at = clock() - timedelta(minutes=11)
    return master, scaler, clock, iid


def test_gcp_consolidation_replaces_an_instance_by_a_cheaper_machine(
        masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    master, scaler, clock, old = a_4g_running_one_slot(masters, gce)

    scaler.tick()
    [move] = moves(master)
    assert move.instance_id == old and move.allocation_id == "t" and move.pending
    small, big = (clouds.regional_price("gcp", ZONES[0], t) for t in ("a2-highgpu-1g", "a2-highgpu-4g"))
    assert small is not None and big is not None
    assert move.saving == pytest.approx(big.on_demand - small.on_demand)
    assert move.reason.startswith("replacing: 1 allocation (1 slot) of instance") and "a2-highgpu-1g" in move.reason
    [shown] = pool_api(master)["consolidationMoves"]
    assert (shown["pending"], shown["replacementLaunchId"]) == (True, move.replacement_launch_id)
    assert agent(master, old).enabled is False  # cordoned while the replacement boots ...
    assert not allocation(master, "t").preempt_requested  # ... and the work keeps running meanwhile
    new = next(r for r in rows(master) if r.launch_id == move.replacement_launch_id)
    assert new.instance_type == "a2-highgpu-1g" and new.instance_id and gce.has_instance(str(new.instance_id))
    assert gce.instance(str(new.instance_id))["machineType"].endswith("/a2-highgpu-1g")

    clock.advance(seconds=30)
    scaler.tick()  # still booting: nothing moves
    assert moves(master)[0].pending and not allocation(master, "t").preempt_requested

    add_agent(master, str(new.instance_id), slots=1, instance_id=str(new.instance_id))
    clock.advance(seconds=5)
    scaler.tick()  # connected: the work is asked to checkpoint and move
    assert not moves(master)[0].pending and allocation(master, "t").preempt_requested
    # However long the checkpoint takes, the idle claim keeps the replacement for the work on its way.
    with transaction(master.sessions) as s:
        row = s.get(Instance, new.launch_id)
        assert row is not None and claim_idle(s, row) == "it replaces an instance whose allocation t is still " \
            "moving onto it"
    exit_preempted(master, "t")
    clock.advance(seconds=10)
    scaler.tick()
    row = next(r for r in rows(master) if r.instance_id == old)
    assert row.state in (InstanceState.STOPPING, InstanceState.TERMINATED)
    assert row.terminate_reason and row.terminate_reason.startswith("consolidated")
    assert not gce.has_instance(old) or gce.instance(old)["status"] in ("STOPPING", "TERMINATED")
    assert next(r for r in rows(master) if r.launch_id == new.launch_id).state == InstanceState.RUNNING
    with transaction(master.sessions) as s:  # its work has left the old instance: idle like any other
        row = s.get(Instance, new.launch_id)
        assert row is not None and claim_idle(s, row) is None


def test_gcp_a_replacement_that_never_connects_is_abandoned(
        masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    master, scaler, clock, old = a_4g_running_one_slot(masters, gce)
    scaler.tick()
    assert moves(master)[0].pending and agent(master, old).enabled is False
    clock.advance(minutes=2)  # past max_agent_starting_period (1m) without its agent
    scaler.tick()
    [move] = moves(master)
    assert not move.pending and "abandoned: the replacement ended (agent did not connect within" in move.reason
    assert agent(master, old).enabled is True and not allocation(master, "t").preempt_requested
    assert next(r for r in rows(master) if r.instance_id == old).state == InstanceState.RUNNING


def test_gcp_an_admin_disabling_the_replaced_agent_takes_it_from_consolidation(
        masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    """`det agent disable` on an instance waiting for its replacement: the move is abandoned then
    and there, so when the replacement fails the agent stays disabled (it was enabled again, over
    the admin's word), and once its drained work ends it is not terminated as "consolidated"."""
    master, scaler, clock, old = a_4g_running_one_slot(masters, gce)
    scaler.tick()
    assert moves(master)[0].pending
    with transaction(master.sessions) as s:
        agents.disable_agent(s, master, old, drain=True)
    [move] = moves(master)
    assert (move.pending, move.abandoned) == (False, True)
    assert move.reason.endswith("; abandoned: its agent was disabled by an admin"), move.reason
    clock.advance(minutes=2)  # the replacement never connects (max_agent_starting_period 1m)
    scaler.tick()
    assert agent(master, old).enabled is False and not allocation(master, "t").preempt_requested
    exit_preempted(master, "t")  # the drained work ends
    clock.advance(seconds=10)
    scaler.tick()
    row = next(r for r in rows(master) if r.instance_id == old)
    assert row.state == InstanceState.RUNNING and not row.terminate_reason, row.terminate_reason


def test_gcp_no_replacement_beyond_max_instances(masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    master, scaler, _, old = a_4g_running_one_slot(masters, gce, max_instances=1)
    scaler.tick()
    assert moves(master) == [] and agent(master, old).enabled is True and len(rows(master)) == 1
    said = pool_api(master)["lastDecision"]["consolidation"]["reason"]
    assert said == "not moving: no room for a replacement: the pool has 1 of its max_instances 1", said


def test_gcp_a_replacement_that_failed_over_to_a_dearer_machine_is_abandoned_and_terminated(
        masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    """The 1g is out of capacity in every zone: the launch fails over to the next type that fits,
    the 4g, which saves nothing. The move is abandoned once it shows (the old instance takes work
    again, the work never moved), that instance goes, and the 1g is not planned while it cools down."""
    gce.inject("insert", code="ZONE_RESOURCE_POOL_EXHAUSTED", machine_type="a2-highgpu-1g", times=None)
    master, scaler, clock, old = a_4g_running_one_slot(masters, gce)
    scaler.tick()
    [move] = moves(master)
    new = next(r for r in rows(master) if r.launch_id == move.replacement_launch_id)
    assert new.instance_type == "a2-highgpu-4g" and new.instance_id  # what the failover launched
    add_agent(master, str(new.instance_id), slots=4, instance_id=str(new.instance_id))
    clock.advance(seconds=5)
    scaler.tick()
    [move] = moves(master)
    assert move.abandoned and not move.pending
    assert "abandoned: the replacement launched as a2-highgpu-4g (on-demand), not cheaper" in move.reason
    assert agent(master, old).enabled is True and not allocation(master, "t").preempt_requested
    dearer = next(r for r in rows(master) if r.launch_id == new.launch_id)
    assert dearer.state in (InstanceState.STOPPING, InstanceState.TERMINATED)
    assert dearer.terminate_reason and "not cheaper" in dearer.terminate_reason
    clock.advance(seconds=5)
    scaler.tick()
    assert len(moves(master)) == 1  # neither the same instance again within the hour nor the 1g meanwhile


def test_gcp_no_replacement_while_the_pool_backs_off(masters: Callable[..., Master], gce: GceFake) -> None:  # noqa: F811
    master, scaler, clock, old = a_4g_running_one_slot(masters, gce)
    with transaction(master.sessions) as s:  # as a quota error leaves it
        prow = s.get(ResourcePool, ELASTIC)
        assert prow is not None
        prow.state, prow.backoff_until = PoolState.BACKOFF, clock() + timedelta(minutes=10)
    scaler.tick()
    assert moves(master) == [] and agent(master, old).enabled is True
    said = pool_api(master)["lastDecision"]["consolidation"]["reason"]
    assert said.startswith("not moving: no replacement: backing off after launch errors until"), said
