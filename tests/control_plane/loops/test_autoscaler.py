"""The autoscaler loop against an in-memory cloud (the Provider interface) and a fake clock, on
both databases: launch, adopt after a crash, orphans, vanished instances, backoff, idle scale-down,
teardown. Each test ticks the loop by hand."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from control_plane import auth
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Instance, ResourcePool, Token
from control_plane.loops import placement
from control_plane.loops.autoscaler import REQUEST_GRACE, Autoscaler
from control_plane.master import Master
from control_plane.services import scaling_history
from provisioners.base import (
    CloudInstance,
    CloudState,
    ErrorKind,
    ErrorScope,
    LaunchResult,
    LaunchSpec,
    ProviderError,
)
from tests.control_plane.loops.conftest import (
    ELASTIC,
    ELASTIC_PROVIDER,
    T0,
    FakeClock,
    FakeCloud,
    add_agent,
    add_allocation,
    agent,
    allocation,
    fetch,
    make_master,
)

#: How an idle termination's reason starts; the idle policy adds its forecast and costs (core/scaling/idle.py).
IDLE_1M1S = "idle for 1m1s (max_idle_agent_period 1m)"

def instance_rows(master: Master) -> list[Instance]:
    with master.sessions() as s:
        rows = list(s.scalars(select(Instance).order_by(Instance.requested_at, Instance.launch_id)))
        s.expunge_all()
        return rows


def pool_row(master: Master) -> ResourcePool:
    return fetch(master, ResourcePool, ELASTIC)


def scaler_for(master: Master, cloud: FakeCloud) -> Autoscaler:
    """An autoscaler whose elastic pool talks to `cloud` (the wrapper replaces the cloud edge)."""
    cloud.cluster_id = master.cluster_id
    return Autoscaler(master, wrap_provider=lambda _pool, _provider: cloud)


@pytest.fixture
def cloud(clock: FakeClock) -> FakeCloud:
    return FakeCloud(clock)


def run_on_agent(master: Master, alloc_id: str, agent_id: str) -> None:
    with transaction(master.sessions) as s:
        row = s.get(Allocation, alloc_id)
        assert row is not None
        row.state, row.agent_id, row.slot_ids, row.started_at = "running", agent_id, ["0"], master.clock()


def finish(master: Master, alloc_id: str) -> None:
    with transaction(master.sessions) as s:
        row = s.get(Allocation, alloc_id)
        assert row is not None
        row.state, row.ended_at, row.end_cause = "terminated", master.clock(), "exited"


def booted(master: Master, scaler: Autoscaler, cloud: FakeCloud, clock: FakeClock, alloc_id: str = "a1",
           ) -> CloudInstance:
    """Demand, a launch, and the instance running with its agent connected."""
    add_allocation(master, alloc_id)
    scaler.tick()
    [inst] = cloud.instances.values()
    cloud.set_state(inst.id, CloudState.RUNNING)
    clock.advance(seconds=5)
    add_agent(master, inst.id, instance_id=inst.id)
    scaler.tick()
    return cloud.instances[inst.id]


def busy_instance(master: Master, cloud: FakeCloud, clock: FakeClock) -> tuple[Autoscaler, CloudInstance]:
    """One instance running trial a1."""
    scaler = scaler_for(master, cloud)
    inst = booted(master, scaler, cloud, clock)
    run_on_agent(master, "a1", inst.id)
    return scaler, inst


# -- launch --------------------------------------------------------------------------------------


def test_launch_writes_the_row_before_the_call_then_records_the_instance(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    rows_during_call: list[list[tuple[str, str, str | None]]] = []
    cloud.before_launch = lambda specs: rows_during_call.append(
        [(r.launch_id, r.state, r.instance_id) for r in instance_rows(loop_master)])
    add_allocation(loop_master, "a1", slots=2)
    scaler = scaler_for(loop_master, cloud)

    scaler.tick()

    [[spec]] = cloud.launches
    assert rows_during_call == [[(spec.launch_id, InstanceState.REQUESTED, None)]]
    [inst] = cloud.instances.values()
    [row] = instance_rows(loop_master)
    assert (row.launch_id, row.state, row.instance_id, row.provider) == (spec.launch_id, "starting", inst.id, "local")
    assert (row.launched_at, row.location, row.instance_type) == (T0, "zone-a", "fake.large")
    # A local pool's provider takes only the bootstrap token, bound to this launch and pool.
    with loop_master.sessions() as s:
        principal = auth.resolve_token(s, spec.user_data, now=clock())
    assert principal is not None and principal.kind is auth.TokenKind.BOOTSTRAP
    assert (principal.launch_id, principal.pool) == (spec.launch_id, ELASTIC)
    pool = pool_row(loop_master)
    assert pool.state == PoolState.OK and pool.last_decision is not None and pool.last_decision["launch"] == 1

    # The next ticks see the instance booting, then running: the same demand launches nothing more.
    clock.advance(seconds=10)
    scaler.tick()
    cloud.set_state(inst.id, CloudState.RUNNING)
    scaler.tick()
    assert len(cloud.launches) == 1
    assert [r.state for r in instance_rows(loop_master)] == [InstanceState.RUNNING]


class Crash(BaseException):
    """The master dying at a given point (BaseException: no `except Exception` in the loop catches it)."""


class CrashAround:
    """Wraps the cloud: the master dies right before or right after the launch call."""

    def __init__(self, inner: FakeCloud, *, after: bool) -> None:
        self.inner, self.after = inner, after

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        if self.after:
            self.inner.launch(specs)
        raise Crash

    def list(self) -> list[CloudInstance]:
        return self.inner.list()

    def terminate(self, ids: Sequence[str]) -> None:
        self.inner.terminate(ids)


def test_a_crash_between_launch_and_record_is_adopted_without_a_second_launch(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, db_url: str, tmp_path: Path,
) -> None:
    cloud.cluster_id = loop_master.cluster_id
    add_allocation(loop_master, "a1")
    with pytest.raises(Crash):
        Autoscaler(loop_master, wrap_provider=lambda _pool, _p: CrashAround(cloud, after=True)).tick()
    [row] = instance_rows(loop_master)
    [inst] = cloud.instances.values()
    assert (row.state, row.instance_id) == (InstanceState.REQUESTED, None) and inst.launch_id == row.launch_id

    # A new master process on the same database finds the instance by its launch id tag.
    clock.advance(seconds=20)
    restarted = make_master(db_url, tmp_path / "state", clock)
    try:
        scaler_for(restarted, cloud).tick()
    finally:
        restarted.stop()
    [row] = instance_rows(loop_master)
    assert (row.state, row.instance_id, row.launched_at) == (InstanceState.STARTING, inst.id, T0)
    assert len(cloud.launches) == 1 and cloud.terminated == []


def test_a_launch_never_confirmed_is_closed_after_the_grace_and_launched_again(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    cloud.cluster_id = loop_master.cluster_id
    add_allocation(loop_master, "a1")
    with pytest.raises(Crash):  # the master dies before the call reached the cloud
        Autoscaler(loop_master, wrap_provider=lambda _pool, _p: CrashAround(cloud, after=False)).tick()
    scaler = scaler_for(loop_master, cloud)
    clock.advance(seconds=REQUEST_GRACE.total_seconds() - 1)
    scaler.tick()  # the launch may still be in flight: it holds the demand
    assert cloud.launches == [] and [r.state for r in instance_rows(loop_master)] == [InstanceState.REQUESTED]

    clock.advance(seconds=2)
    scaler.tick()
    first, second = instance_rows(loop_master)
    assert (first.state, first.terminate_reason) == (InstanceState.TERMINATED, "launch never confirmed")
    assert second.state == InstanceState.STARTING and len(cloud.launches) == 1


def test_a_task_queued_between_two_placement_passes_launches_nothing_while_there_is_room(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """The demand is the queue less what placement places now (placement.dry_run). A trial requeued
    by a consolidation move was still pending when the autoscaler ticked, before the next placement
    pass: counted as demand, it launched a third instance, the trial landed there (worst fit) and a
    second move followed (a CI failure of tests/integration/test_consolidation.py)."""
    scaler, inst = busy_instance(loop_master, cloud, clock)  # a1 on 1 of its 2 slots
    add_allocation(loop_master, "a2")  # queued; no placement pass yet
    scaler.tick()
    assert len(cloud.launches) == 1 and len(cloud.instances) == 1
    reasons = pool_row(loop_master).last_decision["reasons"]
    assert reasons[0] == ("1 pending task fits the free slots of connected instances: placement takes it, "
                          "no launch for it"), reasons
    assert not any(r.startswith("launch") for r in reasons), reasons
    with transaction(loop_master.sessions) as s:  # the pass the autoscaler counted on
        placement.place(s, loop_master, ELASTIC)
    assert (allocation(loop_master, "a2").state, allocation(loop_master, "a2").agent_id) == ("assigned", inst.id)

    add_allocation(loop_master, "a3", slots=2)  # no room for two slots: demand
    scaler.tick()
    assert len(cloud.launches) == 2, pool_row(loop_master).last_decision["reasons"]


def test_work_waiting_under_its_jobs_max_slots_launches_nothing(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """A task that waits for its own job's slots (resources.max_slots) is no demand: a new
    instance would not run it, and it would keep that instance idle for it for ever."""
    from tests.control_plane.loops.test_placement import _experiment, _of_experiment

    exp = _experiment(loop_master, resources={"max_slots": 1})
    scaler, _inst = busy_instance(loop_master, cloud, clock)
    _of_experiment(loop_master, "a1", exp)
    add_allocation(loop_master, "a2", slots=2)
    _of_experiment(loop_master, "a2", exp)
    scaler.tick()
    reasons = pool_row(loop_master).last_decision["reasons"]
    assert len(cloud.launches) == 1, reasons
    assert reasons[0] == "1 pending task waits for its job's own slots (max_slots): no launch", reasons


def test_an_agent_disabled_takes_no_demand_and_goes_once_idle(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """A connected agent that is disabled (by an admin, a drain, consolidation's cordon) is no room:
    pending work it could hold launches an instance, where before its idle instance "absorbed" it
    and was kept for it, so the work waited for ever. Idle past max_idle_agent_period, it goes,
    whatever the arrivals forecast (no arrival can use it)."""
    scaler, inst = busy_instance(loop_master, cloud, clock)
    finish(loop_master, "a1")
    with transaction(loop_master.sessions) as s:
        row = s.get(Agent, inst.id)
        assert row is not None
        row.idle_since = clock()  # what the placement loop records
        row.enabled = False  # `det agent disable`
    add_allocation(loop_master, "a2")
    scaler.tick()
    assert len(cloud.launches) == 2, pool_row(loop_master).last_decision["reasons"]

    clock.advance(seconds=61)  # a2 still waits for the new instance, which is booting
    scaler.tick()
    assert cloud.terminated == [inst.id], pool_row(loop_master).last_decision["reasons"]
    gone = next(r for r in instance_rows(loop_master) if r.instance_id == inst.id)
    assert gone.terminate_reason == IDLE_1M1S + ": its agent is disabled, no arrival can use it", gone.terminate_reason
    assert len(cloud.launches) == 2


def test_placement_passes_over_an_agent_whose_instance_is_being_terminated(loop_master: Master) -> None:
    """The scheduler is not offered an agent whose instance's termination has begun (it once was,
    and claim_agents then refused it, leaving the work pending for that pass); the autoscaler's dry
    run sees the same agents, so such an agent is no room for demand either."""
    with transaction(loop_master.sessions) as s:
        s.add(Instance(launch_id="going", pool=ELASTIC, provider="local", state=InstanceState.STOPPING,
                       requested_at=loop_master.clock(), instance_id="i-going"))
    add_agent(loop_master, "i-going", instance_id="i-going")  # still connected and enabled
    add_allocation(loop_master, "r1", state="running", agent_id="i-going", slot_ids=["0"])
    add_agent(loop_master, "other")  # two free slots: best fit would rather fill i-going's last one
    add_allocation(loop_master, "p1")
    with transaction(loop_master.sessions) as s:
        placement.place(s, loop_master, ELASTIC)
    assert allocation(loop_master, "p1").agent_id == "other"


# -- what the cloud has that the record does not, and the reverse ----------------------------------


def test_instances_with_this_clusters_tags_and_no_row_are_terminated(
    loop_master: Master, cloud: FakeCloud,
) -> None:
    scaler = scaler_for(loop_master, cloud)
    orphan = cloud.add("a-launch-id-this-master-never-recorded")
    scaler.tick()
    assert cloud.terminated == [orphan.id]
    assert instance_rows(loop_master) == []  # the sweep records nothing
    assert cloud.launches == []  # and no demand launches nothing


def test_an_instance_that_vanished_closes_its_row_and_ends_its_allocations(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler, inst = busy_instance(loop_master, cloud, clock)
    [row] = instance_rows(loop_master)
    assert row.agent_id == inst.id  # the agent was matched to its instance

    cloud.reclaim(inst.id)  # a spot reclaim, or someone deleting it in the console
    clock.advance(seconds=30)
    scaler.tick()  # missing from the list, and described as terminated: gone without waiting

    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.TERMINATED
    assert row.terminate_reason == "instance disappeared from the cloud: the cloud reports it terminated"
    assert row.terminated_at == clock()
    assert agent(loop_master, inst.id).state == "disconnected"
    ended = allocation(loop_master, "a1")
    assert (ended.state, ended.end_cause) == ("terminated", "instance_terminated")
    with loop_master.sessions() as s:
        [token] = s.scalars(select(Token).where(Token.launch_id == row.launch_id))
        assert token.revoked_at == clock()  # the instance's bootstrap token dies with it
    assert cloud.terminated == []


# -- launch errors ---------------------------------------------------------------------------------


def test_quota_errors_back_the_pool_off_exponentially_and_it_recovers(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    quota = ProviderError(ErrorKind.QUOTA, "vCPU limit reached", scope=ErrorScope.REGION, code="VcpuLimitExceeded",
                          location="us-east-1")
    cloud.errors = [quota, quota]
    scaler = scaler_for(loop_master, cloud)
    add_allocation(loop_master, "a1")

    scaler.tick()
    pool = pool_row(loop_master)
    assert (pool.state, pool.launch_failures, pool.backoff_until) == (PoolState.BACKOFF, 1, T0 + timedelta(seconds=30))
    assert pool.error is not None and "VcpuLimitExceeded" in pool.error and "region-wide quota" in pool.error
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.TERMINATED and row.terminate_reason.startswith("launch failed: quota")

    clock.advance(seconds=29)
    scaler.tick()
    assert len(cloud.launches) == 1
    decision = pool_row(loop_master).last_decision
    assert decision is not None and any(r.startswith("not launching: backing off") for r in decision["reasons"])

    clock.advance(seconds=1)
    scaler.tick()  # over: tries again, fails again, waits twice as long
    pool = pool_row(loop_master)
    assert len(cloud.launches) == 2
    assert (pool.state, pool.launch_failures, pool.backoff_until) == (PoolState.BACKOFF, 2, clock() + timedelta(seconds=60))

    clock.advance(seconds=60)
    scaler.tick()
    pool = pool_row(loop_master)
    assert len(cloud.launches) == 3 and len(cloud.instances) == 1
    assert (pool.state, pool.launch_failures, pool.backoff_until, pool.error) == (PoolState.OK, 0, None, None)


def test_capacity_out_in_one_zone_retries_soon_without_escalating(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    capacity = ProviderError(ErrorKind.CAPACITY, "no g5 in us-east-1a", scope=ErrorScope.ZONE,
                             code="InsufficientInstanceCapacity", location="subnet-1")
    cloud.errors = [capacity, capacity]
    scaler = scaler_for(loop_master, cloud)
    add_allocation(loop_master, "a1")
    scaler.tick()
    assert pool_row(loop_master).backoff_until == clock() + timedelta(seconds=15)
    clock.advance(seconds=15)
    scaler.tick()
    pool = pool_row(loop_master)
    assert (pool.launch_failures, pool.backoff_until) == (2, clock() + timedelta(seconds=15))
    assert pool.error is not None and "zone-wide capacity" in pool.error
    clock.advance(seconds=15)
    scaler.tick()
    assert len(cloud.launches) == 3 and pool_row(loop_master).state == PoolState.OK


@pytest.mark.parametrize("kind, code", [(ErrorKind.AUTH, "UnauthorizedOperation"),
                                        (ErrorKind.INVALID, "InvalidAMIID.NotFound")])
def test_auth_and_invalid_errors_stop_the_pool_until_the_longest_backoff(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, kind: ErrorKind, code: str,
) -> None:
    cloud.errors = [ProviderError(kind, "refused", scope=ErrorScope.CLOUD, code=code)]
    scaler = scaler_for(loop_master, cloud)
    add_allocation(loop_master, "a1")
    scaler.tick()
    pool = pool_row(loop_master)
    assert (pool.state, pool.backoff_until) == (PoolState.ERROR, T0 + timedelta(minutes=10))
    assert pool.error is not None and code in pool.error

    clock.advance(minutes=9)
    scaler.tick()
    assert len(cloud.launches) == 1 and pool_row(loop_master).state == PoolState.ERROR

    clock.advance(minutes=1)  # someone fixed the IAM policy: picked up without a restart
    scaler.tick()
    assert len(cloud.launches) == 2 and len(cloud.instances) == 1
    assert pool_row(loop_master).state == PoolState.OK


def test_a_pool_with_an_unusable_config_shows_the_error(
    db_url: str, tmp_path: Path, clock: FakeClock, cloud: FakeCloud,
) -> None:
    master = make_master(db_url, tmp_path / "state", clock, {**ELASTIC_PROVIDER, "slots_per_instance": 0})
    try:
        scaler_for(master, cloud).tick()
        pool = pool_row(master)
    finally:
        master.stop()
    assert pool.state == PoolState.ERROR
    assert pool.error is not None and pool.error.startswith("pool 'elastic' is not usable: slots_per_instance")
    assert cloud.launches == []


# -- scale down and teardown -----------------------------------------------------------------------


def test_an_idle_instance_is_terminated_after_max_idle_agent_period(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler = scaler_for(loop_master, cloud)
    inst = booted(loop_master, scaler, cloud, clock)
    run_on_agent(loop_master, "a1", inst.id)
    scaler.tick()
    finish(loop_master, "a1")
    with transaction(loop_master.sessions) as s:  # what the placement loop records
        row = s.get(Agent, inst.id)
        assert row is not None
        row.idle_since = clock()
    idle_from = clock()

    clock.advance(seconds=60)
    scaler.tick()
    assert cloud.terminated == []  # idle for exactly max_idle_agent_period: not past it

    clock.advance(seconds=1)
    scaler.tick()
    assert cloud.terminated == [inst.id]
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.STOPPING and row.terminate_requested_at == clock()
    assert row.terminate_reason.startswith(IDLE_1M1S)  # then the idle policy's numbers (core/scaling/idle.py)
    assert agent(loop_master, inst.id).enabled is False  # nothing new lands on it meanwhile

    clock.advance(seconds=5)
    scaler.tick()  # gone from the cloud: the row ends with the reason it was terminated for
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.TERMINATED and row.terminate_reason.startswith(IDLE_1M1S)
    assert idle_from < row.terminated_at and len(cloud.launches) == 1
    # The history every API worker reads (services/scaling_history.py): the launch, the idle
    # termination with its reason and cause, and the steady ticks between them collapsed.
    with loop_master.read_sessions() as s:
        events = scaling_history.recent(s, ELASTIC)
        kinds = [e.kind for e in reversed(events)]
        assert [k for k in kinds if k != "steady"] == ["launch", "terminate"], kinds
        assert all(not (a == b == "steady") for a, b in zip(kinds, kinds[1:], strict=False)), kinds
        (term,) = [e for e in events if e.kind == "terminate"]
        [t] = term.detail["terminations"]
        assert t["cause"] == "idle" and t["reason"].startswith(IDLE_1M1S) and t["id"] == row.launch_id
        assert sum(e.ticks for e in events if e.kind == "steady") >= 3


def test_recent_arrivals_keep_an_idle_instance_up_to_twice_max_idle_agent_period(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """The idle policy in the loop: the allocations created in the pool over the arrival window (30
    min) predict the next one, and the boots measured on the pool's instances (launch to agent first
    connected) price a relaunch; an idle instance is kept while idling until the next arrival costs
    less, but never past 2 x max_idle_agent_period. (Was the due-before-the-bound hysteresis; the
    boot is made slow here because a 5 s boot makes a relaunch cheaper than any idling.)"""
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)  # idle 61 s of 60, trial a1 at T0
    for k in range(1, 40):  # a busy half hour before: a trial every 44 s (they ran elsewhere and ended)
        add_allocation(loop_master, f"h{k}", state="terminated", created_at=T0 - k * timedelta(seconds=44))
    launched_at = instance_rows(loop_master)[0].launched_at
    assert launched_at is not None
    with transaction(loop_master.sessions) as s:  # the agent took 3 minutes to connect
        row = s.get(Agent, inst.id)
        assert row is not None
        row.registered_at = launched_at + timedelta(minutes=3)
    scaler.tick()
    assert cloud.terminate_calls == [] and instance_rows(loop_master)[0].state == InstanceState.RUNNING
    reasons = pool_row(loop_master).last_decision["reasons"]  # type: ignore[index]
    kept = [r for r in reasons if r.startswith(f"keeping {instance_rows(loop_master)[0].launch_id} idle for 1m1s")]
    assert len(kept) == 1, reasons
    assert "the next arrival that fits is expected in 45s (40 arrivals that fit in the last 30m)" in kept[0]
    assert "boot 3m, median of 1 measured boot" in kept[0] and kept[0].endswith("at most 2m idle")

    clock.advance(seconds=59)  # idle 2 min: still kept
    scaler.tick()
    assert cloud.terminate_calls == []
    clock.advance(seconds=1)  # idle 2m1s: past the bound
    scaler.tick()
    assert cloud.terminated == [inst.id]
    assert instance_rows(loop_master)[0].terminate_reason == (
        "idle for 2m1s (max_idle_agent_period 1m): past the hard bound 2m")


def test_a_fast_boot_makes_a_relaunch_cheaper_than_idling_for_the_next_arrival(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """The same arrivals with the fake cloud's own boot (seconds): idling 45 s for the next
    arrival costs more than relaunching for it, so the instance goes at max_idle_agent_period."""
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    for k in range(1, 40):
        add_allocation(loop_master, f"h{k}", state="terminated", created_at=T0 - k * timedelta(seconds=44))
    scaler.tick()
    assert cloud.terminated == [inst.id]
    reason = instance_rows(loop_master)[0].terminate_reason
    assert reason is not None and reason.startswith(IDLE_1M1S + ": the next arrival that fits is expected in 45s")
    assert " >= a relaunch " in reason and "median of 1 measured boot" in reason


def test_arrival_window_zero_turns_the_hysteresis_off(db_url: str, tmp_path: Path, clock: FakeClock,
                                                      cloud: FakeCloud) -> None:
    master = make_master(db_url, tmp_path / "state", clock, {**ELASTIC_PROVIDER, "arrival_window": 0})
    try:
        scaler, inst = idle_for_a_while(master, cloud, clock)  # idle 61 s of 60
        for k in range(1, 40):  # the same busy half hour as above: no longer a reason to keep it
            add_allocation(master, f"h{k}", state="terminated", created_at=T0 - k * timedelta(seconds=44))
        scaler.tick()
        assert cloud.terminated == [inst.id]
    finally:
        master.stop()


def test_teardown_terminates_every_instance_and_enable_launches_again(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler = scaler_for(loop_master, cloud)
    add_allocation(loop_master, "a1")
    scaler.tick()
    orphan = cloud.add("someone-elses-launch")
    [launched] = [i for i in cloud.instances.values() if i.id != orphan.id]

    assert scaler.terminate_all(ELASTIC) == 2
    assert sorted(cloud.terminated) == sorted([launched.id, orphan.id]) and cloud.instances == {}
    [row] = instance_rows(loop_master)
    # Stopping until the cloud says the instance is gone (a failed terminate is sent again).
    assert (row.state, row.terminate_reason) == (InstanceState.STOPPING, "cluster or pool taken down")
    assert pool_row(loop_master).state == PoolState.DISABLED

    clock.advance(seconds=10)
    scaler.tick()  # the trial still waits, but a torn-down pool launches nothing
    [row] = instance_rows(loop_master)
    assert (row.state, row.terminate_reason) == (InstanceState.TERMINATED, "cluster or pool taken down")
    decision = pool_row(loop_master).last_decision
    assert len(cloud.launches) == 1 and decision is not None
    assert "not launching: the pool was torn down (enable it to launch again)" in decision["reasons"]

    scaler.enable(ELASTIC)
    assert pool_row(loop_master).state == PoolState.OK
    scaler.tick()
    assert len(cloud.launches) == 2 and len(cloud.instances) == 1


def test_a_launch_that_lands_after_teardown_is_swept_as_an_orphan(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler = scaler_for(loop_master, cloud)
    cloud.before_launch = lambda specs: scaler.terminate_all(ELASTIC)  # teardown while the call is in flight
    add_allocation(loop_master, "a1")
    scaler.tick()
    [inst] = cloud.instances.values()
    [row] = instance_rows(loop_master)
    # The closed row stays closed and the pool stays disabled, whatever the late launch reports.
    assert (row.state, row.instance_id) == (InstanceState.TERMINATED, None)
    assert pool_row(loop_master).state == PoolState.DISABLED

    cloud.before_launch = None
    clock.advance(seconds=5)
    scaler.tick()
    assert cloud.terminated == [inst.id] and len(cloud.launches) == 1


# -- no instance is forgotten (issue 10: 1, 2, 3, 6) ------------------------------------------------

DENIED = ProviderError(ErrorKind.AUTH, "not authorized to perform ec2:TerminateInstances", scope=ErrorScope.CLOUD,
                       code="UnauthorizedOperation")


def go_idle(master: Master, alloc_id: str, agent_id: str) -> None:
    """A trial ran on the agent and finished: the agent is idle from now (as placement records)."""
    run_on_agent(master, alloc_id, agent_id)
    finish(master, alloc_id)
    with transaction(master.sessions) as s:
        row = s.get(Agent, agent_id)
        assert row is not None
        row.idle_since = master.clock()


def boot_all(master: Master, scaler: Autoscaler, cloud: FakeCloud, clock: FakeClock) -> list[CloudInstance]:
    """Every launched instance running with its agent connected."""
    for inst in list(cloud.instances.values()):
        cloud.set_state(inst.id, CloudState.RUNNING)
        add_agent(master, inst.id, instance_id=inst.id)
    clock.advance(seconds=5)
    scaler.tick()
    return list(cloud.instances.values())


def idle_for_a_while(master: Master, cloud: FakeCloud, clock: FakeClock) -> tuple[Autoscaler, CloudInstance]:
    """One instance booted, ran a trial and has been idle past max_idle_agent_period (61 s of 60)."""
    scaler = scaler_for(master, cloud)
    inst = booted(master, scaler, cloud, clock)
    go_idle(master, "a1", inst.id)
    clock.advance(seconds=61)
    return scaler, inst


class NoDescribe:
    """The cloud behind a provider that can only list (no lookup by id)."""

    def __init__(self, inner: FakeCloud) -> None:
        self.inner = inner

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        return self.inner.launch(specs)

    def list(self) -> list[CloudInstance]:
        return self.inner.list()

    def terminate(self, ids: Sequence[str]) -> None:
        self.inner.terminate(ids)


class CrashOnTerminate(NoDescribe):
    """The master dies after committing `stopping`, before the terminate call reaches the cloud."""

    def terminate(self, ids: Sequence[str]) -> None:
        raise Crash


def test_a_failed_terminate_is_retried_with_a_growing_interval_until_the_cloud_says_gone(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, caplog: pytest.LogCaptureFixture,
) -> None:
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    cloud.terminate_errors = [DENIED, DENIED, DENIED]
    reaped_at = clock()
    caplog.set_level("INFO", logger="shipyard.autoscaler")

    scaler.tick()  # decided, committed as stopping, the call refused
    for _ in range(80):  # 4 minutes of ticks, every 3 s
        clock.advance(seconds=3)
        scaler.tick()
        if not cloud.instances and instance_rows(loop_master)[0].state == InstanceState.TERMINATED:
            break

    calls = [when for when, ids in cloud.terminate_calls if ids == (inst.id,)]
    gaps = [(b - a).total_seconds() for a, b in zip(calls, calls[1:], strict=False)]
    assert calls[0] == reaped_at and len(calls) == 4
    assert gaps == [12, 21, 42]  # 10 s, 20 s, 40 s after each failure, on the next tick
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.TERMINATED and row.terminate_reason.startswith(IDLE_1M1S)
    assert cloud.terminated == [inst.id] and len(cloud.launches) == 1
    failures = [r.getMessage() for r in caplog.records if "event=terminate_failed" in r.getMessage()]
    assert len(failures) == 3 and all("UnauthorizedOperation" in m for m in failures)
    assert [f"attempt={n}" in m for n, m in enumerate(failures, 1)] == [True] * 3
    sent = [r.getMessage() for r in caplog.records if "event=terminate_sent" in r.getMessage()]
    assert len(sent) == 4 and all("idle for 1m1s" in m for m in sent)


def test_the_pool_shows_the_terminations_still_waiting_on_the_cloud(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    cloud.terminate_errors = [DENIED] * 1000
    scaler.tick()
    for _ in range(220):  # 11 minutes: past the deadline of a termination
        clock.advance(seconds=3)
        scaler.tick()
    decision = pool_row(loop_master).last_decision
    assert decision is not None and decision["stopping"] == 1
    [waiting] = decision["terminating"]
    assert waiting["instance_id"] == inst.id and waiting["overdue"] is True
    assert 6 <= waiting["attempts"] <= 10  # bounded interval: 10, 20, 40, 80, 160 s, then every 5 minutes
    assert "UnauthorizedOperation" in waiting["last_error"]
    assert inst.id in cloud.instances  # still billing, still being retried
    assert [r.state for r in instance_rows(loop_master)] == [InstanceState.STOPPING]


def test_a_crash_between_committing_stopping_and_the_terminate_call_is_healed_after_restart(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, db_url: str, tmp_path: Path,
) -> None:
    _scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    with pytest.raises(Crash):
        Autoscaler(loop_master, wrap_provider=lambda _pool, _p: CrashOnTerminate(cloud)).tick()
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.STOPPING and inst.id in cloud.instances and cloud.terminate_calls == []

    clock.advance(seconds=20)
    restarted = make_master(db_url, tmp_path / "state", clock)
    try:
        again = scaler_for(restarted, cloud)
        again.tick()  # the row is stopping and the cloud still has the instance: terminate again
        assert cloud.terminated == [inst.id]
        clock.advance(seconds=3)
        again.tick()
    finally:
        restarted.stop()
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.TERMINATED and row.terminate_reason.startswith(IDLE_1M1S)


def test_instances_being_stopped_count_toward_max_instances_until_the_cloud_says_gone(
    db_url: str, tmp_path: Path, clock: FakeClock, cloud: FakeCloud,
) -> None:
    master = make_master(db_url, tmp_path / "state", clock, {**ELASTIC_PROVIDER, "max_instances": 2})
    try:
        scaler = scaler_for(master, cloud)
        add_allocation(master, "a1", slots=2)
        add_allocation(master, "a2", slots=2)
        scaler.tick()
        first = boot_all(master, scaler, cloud, clock)
        for n, inst in enumerate(first, 1):
            go_idle(master, f"a{n}", inst.id)
        cloud.terminate_errors = [DENIED] * 1000  # the account may not terminate any more
        clock.advance(seconds=61)
        scaler.tick()
        assert [r.state for r in instance_rows(master)] == [InstanceState.STOPPING] * 2

        # New work arrives while both instances are still billed.
        add_allocation(master, "b1", slots=2)
        add_allocation(master, "b2", slots=2)
        most_billed = 0
        for _ in range(100):  # 5 minutes
            clock.advance(seconds=3)
            scaler.tick()
            most_billed = max(most_billed, cloud.billed())
        assert most_billed == 2 and len(cloud.launches) == 1
        decision = pool_row(master).last_decision
        assert decision is not None
        assert any("capped by max_instances 2 with 0 live and 2 stopping" in r for r in decision["reasons"])

        cloud.terminate_errors = []  # the IAM policy is fixed: the next retry goes through
        for _ in range(120):
            clock.advance(seconds=3)
            scaler.tick()
            most_billed = max(most_billed, cloud.billed())
        assert most_billed == 2
        assert sorted(cloud.terminated) == sorted(i.id for i in first)
        assert len(cloud.launches) == 2 and len(cloud.launches[1]) == 2  # the new work got its instances
    finally:
        master.stop()


@pytest.mark.parametrize("lookup", ["describe", "list only"])
def test_a_stale_list_causes_no_churn(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, lookup: str,
) -> None:
    """Issue 10, case 2: each new instance is missing from the first list after its launch (EC2 and
    GCE lists are eventually consistent). Before: 12 launches and 10 orphan terminations in 6 ticks
    for a demand of 2. Now: 2 launches, nothing terminated."""
    cloud.cluster_id = loop_master.cluster_id
    scaler = Autoscaler(loop_master, wrap_provider=lambda _pool, _p: cloud if lookup == "describe"
                        else NoDescribe(cloud))
    cloud.lag_new_instances = 1
    add_allocation(loop_master, "a1", slots=2)
    add_allocation(loop_master, "a2", slots=2)
    for _ in range(6):
        scaler.tick()
        clock.advance(seconds=3)
    launched = sum(len(batch) for batch in cloud.launches)
    assert (launched, len(cloud.terminated)) == (2, 0)
    assert [r.state for r in instance_rows(loop_master)] == [InstanceState.STARTING] * 2


def test_an_instance_missing_from_lists_is_declared_gone_only_after_the_grace_window(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    cloud.cluster_id = loop_master.cluster_id
    scaler = Autoscaler(loop_master, wrap_provider=lambda _pool, _p: NoDescribe(cloud))
    inst = booted(loop_master, scaler, cloud, clock)
    run_on_agent(loop_master, "a1", inst.id)
    cloud.reclaim(inst.id)  # gone for real, but this provider can only list
    scaler.tick()
    missed_at = clock()
    clock.advance(seconds=119)
    scaler.tick()
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.RUNNING and allocation(loop_master, "a1").state == "running"

    clock.advance(seconds=1)
    scaler.tick()
    [row] = instance_rows(loop_master)
    assert (row.state, row.terminated_at) == (InstanceState.TERMINATED, missed_at + timedelta(minutes=2))
    assert row.terminate_reason == ("instance disappeared from the cloud: missing from the cloud's lists for "
                                    "2m00s (list_miss_grace 2m00s)")
    assert allocation(loop_master, "a1").end_cause == "instance_terminated"


def test_a_lookup_that_does_not_find_a_young_instance_is_not_proof(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """EC2 answers InvalidInstanceID.NotFound for a moment after RunInstances: not found right after
    the launch only counts toward the grace window."""
    scaler = scaler_for(loop_master, cloud)
    add_allocation(loop_master, "a1")
    scaler.tick()
    [inst] = cloud.instances.values()
    hidden = cloud.instances.pop(inst.id)  # neither listed nor described, for now
    clock.advance(seconds=30)
    scaler.tick()
    cloud.instances[inst.id] = hidden  # consistent again
    clock.advance(seconds=3)
    scaler.tick()
    assert [r.state for r in instance_rows(loop_master)] == [InstanceState.STARTING]
    assert cloud.terminated == [] and len(cloud.launches) == 1


def test_a_stopped_instance_is_terminated_and_its_row_ends_when_the_cloud_says_gone(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler, inst = busy_instance(loop_master, cloud, clock)
    cloud.set_state(inst.id, CloudState.STOPPED)  # powered off by hand, or by the agent losing the master
    stopped_orphan = cloud.add("a-launch-id-this-master-never-recorded", CloudState.STOPPED)

    clock.advance(seconds=3)
    scaler.tick()
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.STOPPING and row.terminate_requested_at == clock()
    assert row.terminate_reason is not None and row.terminate_reason.startswith("the cloud reports it stopped")
    assert sorted(cloud.terminated) == sorted([inst.id, stopped_orphan.id])
    assert agent(loop_master, inst.id).enabled is False

    clock.advance(seconds=3)
    scaler.tick()
    [row] = instance_rows(loop_master)
    assert row.state == InstanceState.TERMINATED and cloud.billed() == 0
    assert allocation(loop_master, "a1").end_cause == "instance_terminated"


def test_a_pool_error_ends_with_its_backoff_even_without_a_launch(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """Issue 10, case 6: after the backoff the pool showed state ok with the old quota error."""
    cloud.errors = [ProviderError(ErrorKind.QUOTA, "vCPU limit reached", code="VcpuLimitExceeded")]
    scaler = scaler_for(loop_master, cloud)
    add_allocation(loop_master, "a1")
    scaler.tick()
    assert pool_row(loop_master).state == PoolState.BACKOFF
    finish(loop_master, "a1")  # the user gave up on the trial: no launch will come
    clock.advance(seconds=30)
    scaler.tick()
    pool = pool_row(loop_master)
    assert (pool.state, pool.error, pool.backoff_until) == (PoolState.OK, None, T0 + timedelta(seconds=30))
    assert pool.last_decision is not None and "VcpuLimitExceeded" in pool.last_decision["previous_error"]
    assert pool.last_decision["backoff"] is None


class ListFails(NoDescribe):
    def __init__(self, inner: FakeCloud) -> None:
        super().__init__(inner)
        self.failures = 1

    def list(self) -> list[CloudInstance]:
        if self.failures:
            self.failures -= 1
            raise ProviderError(ErrorKind.THROTTLED, "Rate exceeded", code="RequestLimitExceeded")
        return self.inner.list()


def test_a_list_error_ends_when_the_list_works_again(loop_master: Master, cloud: FakeCloud) -> None:
    cloud.cluster_id = loop_master.cluster_id
    scaler = Autoscaler(loop_master, wrap_provider=lambda _pool, _p: ListFails(cloud))
    scaler.tick()
    assert (pool_row(loop_master).error or "").startswith("cannot list instances: throttled (RequestLimitExceeded)")
    scaler.tick()
    assert (pool_row(loop_master).state, pool_row(loop_master).error) == (PoolState.OK, None)


def test_during_a_long_quota_backoff_one_instance_probes_and_ends_it_early(
    db_url: str, tmp_path: Path, clock: FakeClock, cloud: FakeCloud,
) -> None:
    master = make_master(db_url, tmp_path / "state", clock, {
        **ELASTIC_PROVIDER, "launch_error_backoff": "10m", "launch_error_backoff_max": "30m",
        "launch_probe_interval": "2m"})
    try:
        quota = ProviderError(ErrorKind.QUOTA, "vCPU limit reached", code="VcpuLimitExceeded", location="us-east-1")
        cloud.errors = [quota, quota, quota]
        scaler = scaler_for(master, cloud)
        add_allocation(master, "a1", slots=2)
        add_allocation(master, "a2", slots=2)
        scaler.tick()
        assert pool_row(master).backoff_until == T0 + timedelta(minutes=10)

        clock.advance(seconds=119)
        scaler.tick()
        decision = pool_row(master).last_decision
        assert decision is not None and len(cloud.launches) == 1
        assert decision["backoff"] == {"until": (T0 + timedelta(minutes=10)).isoformat(), "failures": 1,
                                       "probe": False, "next_probe_at": (T0 + timedelta(minutes=2)).isoformat()}
        assert any(r.startswith("not launching: backing off") and "one instance probes at" in r
                   for r in decision["reasons"])
        for _ in range(3):  # two probes fail (the quota holds), the third gets its instance
            clock.advance(minutes=2)
            scaler.tick()
        assert [len(batch) for batch in cloud.launches] == [2, 1, 1, 1]
        pool = pool_row(master)
        assert (pool.state, pool.error, pool.launch_failures) == (PoolState.OK, None, 0)
        clock.advance(seconds=3)
        scaler.tick()  # recovered: the rest of the demand launches at once
        assert [len(batch) for batch in cloud.launches] == [2, 1, 1, 1, 1] and cloud.billed() == 2
        # Without the probe the pool would have waited 10 + 20 + 30 minutes; it recovered before the
        # first backoff was even over.
        assert clock() < T0 + timedelta(minutes=10)
    finally:
        master.stop()


def test_a_gang_larger_than_an_instance_is_demand_for_that_many_whole_instances(
    loop_master: Master, cloud: FakeCloud,
) -> None:
    add_allocation(loop_master, "gang", slots=4)  # 2 slots per instance: two whole instances
    add_allocation(loop_master, "odd", slots=3)  # not whole instances: never placed, launches nothing
    scaler = scaler_for(loop_master, cloud)

    scaler.tick()

    assert sum(len(batch) for batch in cloud.launches) == 2


# -- gangs across instances (issue 28) -------------------------------------------------------------


def two_booted(master: Master, scaler: Autoscaler, cloud: FakeCloud, clock: FakeClock) -> list[str]:
    """The pending demand launches two instances; both run and their agents connect. Their ids."""
    scaler.tick()
    ids = sorted(cloud.instances)
    assert len(ids) == 2
    for iid in ids:
        cloud.set_state(iid, CloudState.RUNNING)
    clock.advance(seconds=5)
    for iid in ids:
        add_agent(master, iid, instance_id=iid)
    scaler.tick()
    return ids


def gang_on_two_instances(master: Master, cloud: FakeCloud, clock: FakeClock) -> tuple[Autoscaler, list[str]]:
    """A 4-slot trial placed by the placement loop across two whole 2-slot instances (chief first)."""
    scaler = scaler_for(master, cloud)
    add_allocation(master, "gang", slots=4)
    ids = two_booted(master, scaler, cloud, clock)
    with transaction(master.sessions) as s:
        placement.place(s, master, ELASTIC)
    gang = allocation(master, "gang")
    assert gang.state == "assigned" and [p["agent"] for p in gang.placement or ()] == ids
    return scaler, ids


def test_every_instance_of_a_trial_across_instances_is_busy_for_the_demand(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """Issue 28: the gang's second instance was taken for idle ("1 idle instance absorbs 1 pending
    task"), so nothing was launched and the pending trial waited for the gang to end."""
    scaler, _ids = gang_on_two_instances(loop_master, cloud, clock)
    add_allocation(loop_master, "b", slots=2)
    clock.advance(seconds=5)
    scaler.tick()
    assert sum(len(batch) for batch in cloud.launches) == 3
    reasons = pool_row(loop_master).last_decision["reasons"]  # type: ignore[index]
    assert not any("idle instance" in r for r in reasons), reasons


def test_lowering_max_instances_never_sheds_an_instance_of_a_running_gang(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, db_url: str, tmp_path: Path,
) -> None:
    """Issue 28: after max_instances was lowered and the master restarted, the gang's second
    instance was terminated as "shedding newest idle instance"."""
    _scaler, ids = gang_on_two_instances(loop_master, cloud, clock)
    clock.advance(seconds=5)
    restarted = make_master(db_url, tmp_path / "state", clock, {**ELASTIC_PROVIDER, "max_instances": 1})
    try:
        scaler_for(restarted, cloud).tick()
        assert cloud.terminate_calls == [] and sorted(cloud.instances) == ids
        reasons = pool_row(restarted).last_decision["reasons"]  # type: ignore[index]
        assert "1 busy instance above max_instances 1; shedding once idle" in reasons
    finally:
        restarted.stop()


def test_a_gang_wider_than_max_instances_launches_nothing_and_keeps_no_idle_instance(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    """Issue 28: a gang needing more whole instances than max_instances (a pool shrunk after the
    trial was queued) held paid instances forever ("keeping ... idle instances for pending demand")."""
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    add_allocation(loop_master, "wide", slots=8)  # 4 whole 2-slot instances; max_instances is 3
    scaler.tick()
    assert cloud.terminated == [inst.id] and len(cloud.launches) == 1
    reasons = pool_row(loop_master).last_decision["reasons"]  # type: ignore[index]
    assert ("unschedulable: 1 task need 4 whole instances of 2 slots at once (8 slots) but max_instances is 3; "
            "not launching or keeping instances for them") in reasons
    clock.advance(seconds=60)
    scaler.tick()  # and nothing is launched for it later either
    assert len(cloud.launches) == 1 and cloud.billed() == 0


def test_a_preempted_tasks_return_is_not_an_arrival(loop_master: Master, clock: FakeClock) -> None:
    """The idle policy's arrivals (decision.arrivals_of): a trial moved by consolidation, a spot
    notice or a higher priority comes back as a new allocation of the same task; that is demand the
    master made, not demand arriving, so it does not keep instances idle for more."""
    from control_plane.core.states import ExitCause
    from control_plane.loops.autoscaler.decision import arrivals_of

    for k in range(3):
        add_allocation(loop_master, f"new{k}", slots=2, state="terminated", created_at=T0 - timedelta(minutes=k + 1))
    add_allocation(loop_master, "moved-1", state="terminated", created_at=T0 - timedelta(minutes=10))
    add_allocation(loop_master, "crashed-1", state="terminated", created_at=T0 - timedelta(minutes=10))
    with transaction(loop_master.sessions) as s:
        for first, cause in (("moved-1", ExitCause.PREEMPTED), ("crashed-1", ExitCause.EXITED)):
            row = s.get(Allocation, first)
            assert row is not None
            row.end_cause, row.run_id = cause, 1
            s.add(Allocation(id=first.replace("-1", "-2"), task_id=row.task_id, pool=ELASTIC, slots_needed=1, run_id=2,
                             state="terminated", end_cause=ExitCause.EXITED, created_at=T0 - timedelta(minutes=5)))
        # The moved trial then crashed: its third run is a restart, which counts.
        s.add(Allocation(id="moved-3", task_id="task-moved-1", pool=ELASTIC, slots_needed=1, run_id=3, state="pending",
                         created_at=T0 - timedelta(minutes=4)))
    with loop_master.read_sessions() as s:
        got = sorted((a.slots, (T0 - a.at).total_seconds()) for a in arrivals_of(s, ELASTIC, T0 - timedelta(minutes=30)))
    # The three new ones, both first runs, the crashed trial's restart and the moved one's restart
    # after its crash; not the moved one's second run.
    assert got == [(1, 240.0), (1, 300.0), (1, 600.0), (1, 600.0), (2, 60.0), (2, 120.0), (2, 180.0)]
