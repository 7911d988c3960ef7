"""The job queue (control_plane/services/jobs.py) and agent enable/disable/drain
(control_plane/services/agents.py), called directly on SQLite and PostgreSQL under a fake clock:
queue order, every kind of update, permissions, refusals that leave nothing half-applied, and the
drain timeout the placement loop applies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Experiment, Instance, Trial, User
from control_plane.errors import Conflict, Invalid, NotFound, PermissionDenied
from control_plane.loops import placement
from control_plane.master import Master
from control_plane.services import agents, allocations, jobs
from control_plane.services.jobs import QueueUpdate
from tests.control_plane.loops.conftest import (
    ELASTIC,
    FakeClock,
    add_agent,
    add_allocation,
    fetch,
    make_master,
)
from tests.control_plane.services import builders

CONFIG = {
    "name": "queued",
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    "hyperparameters": {"lr": 0.1},
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def m(db_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Master]:
    master = make_master(db_url, tmp_path / "state", clock)
    yield master
    master.stop()


def submit(m: Master, clock: FakeClock, owner: Principal | None = None, **resources: object) -> Experiment:
    clock.advance(seconds=10)
    config = {**CONFIG, "resources": resources} if resources else CONFIG
    exp_id = builders.create_experiment(m, yaml.safe_dump(config), owner=owner)
    with m.sessions() as s:
        exp = s.get(Experiment, exp_id)
        assert exp is not None
        s.expunge(exp)
        return exp


def user(m: Master, name: str) -> Principal:
    with transaction(m.sessions) as s:
        u = User(username=name, password_hash="x", admin=False)
        s.add(u)
        s.flush()
        return Principal(kind=TokenKind.USER, token_id=0, user_id=u.id, username=name, admin=False)


def queue(m: Master, pool: str | None = None) -> list[jobs.JobView]:
    with m.sessions() as s:
        return jobs.list_jobs(s, m, pool=pool).jobs


def order(m: Master, pool: str = "default") -> list[str]:
    return [v.exp.job_id for v in queue(m, pool)]


def update(m: Master, p: Principal, *updates: QueueUpdate) -> None:
    with transaction(m.sessions) as s:
        jobs.update_jobs(s, m, p, list(updates))


def pending_of(m: Master, exp: Experiment) -> list[Allocation]:
    with m.sessions() as s:
        return list(s.scalars(select(Allocation).where(Allocation.experiment_id == exp.id,
                                                       Allocation.state == st.AllocationState.PENDING)))


def test_queue_order_priority_then_position_then_submission(m: Master, clock: FakeClock) -> None:
    a = submit(m, clock)
    b = submit(m, clock, priority=10)
    c = submit(m, clock)
    views = queue(m)
    assert [v.exp.job_id for v in views] == [b.job_id, a.job_id, c.job_id]
    assert [v.jobs_ahead for v in views] == [0, 1, 2]
    assert [v.priority for v in views] == [10, 42, 42]
    assert all(v.state == jobs.JOB_QUEUED and v.requested_slots == 1 and v.allocated_slots == 0 for v in views)
    assert views[0].username == "admin"
    with m.sessions() as s:
        page = jobs.list_jobs(s, m, offset=1, limit=1, descending=True)
        assert page.total == 3 and [v.exp.job_id for v in page.jobs] == [a.job_id]
        assert jobs.list_jobs(s, m, states=[jobs.JOB_SCHEDULED]).jobs == []
        assert jobs.queue_stats(s, m) == [("default", 3, 0), (ELASTIC, 0, 0)]
        with pytest.raises(Invalid):
            jobs.list_jobs(s, m, pool="nope")


def test_scheduled_job_counts_its_placed_slots(m: Master, clock: FakeClock) -> None:
    a = submit(m, clock)
    add_agent(m, "a1", pool="default", slots=2)
    placement.tick(m)
    [view] = queue(m)
    assert view.exp.job_id == a.job_id and view.state == jobs.JOB_SCHEDULED and view.allocated_slots == 1


def test_priority_and_weight_reach_the_row_the_config_and_pending_allocations(m: Master, clock: FakeClock) -> None:
    a = submit(m, clock)
    update(m, builders.admin(m), QueueUpdate(a.job_id, priority=7), QueueUpdate(a.job_id, weight=2.5))
    with m.sessions() as s:
        exp = s.get(Experiment, a.id)
        assert exp is not None and exp.priority == 7 and exp.weight == 2.5
        assert exp.config["resources"]["priority"] == 7 and exp.config["resources"]["weight"] == 2.5
    [alloc] = pending_of(m, a)
    assert (alloc.priority, alloc.weight) == (7, 2.5)


def test_ahead_of_and_behind_of_reorder_and_adopt_the_anchor_priority(m: Master, clock: FakeClock) -> None:
    a, b, c = submit(m, clock), submit(m, clock), submit(m, clock)
    admin = builders.admin(m)
    update(m, admin, QueueUpdate(c.job_id, ahead_of=a.job_id))
    assert order(m) == [c.job_id, a.job_id, b.job_id]
    update(m, admin, QueueUpdate(c.job_id, behind_of=a.job_id))
    assert order(m) == [a.job_id, c.job_id, b.job_id]
    update(m, admin, QueueUpdate(a.job_id, behind_of=b.job_id))
    assert order(m) == [c.job_id, b.job_id, a.job_id]
    # Between two neighbours, again and again: the positions stay strictly ordered.
    for _ in range(60):
        update(m, admin, QueueUpdate(a.job_id, ahead_of=b.job_id))
        update(m, admin, QueueUpdate(a.job_id, behind_of=b.job_id))
    assert order(m) == [c.job_id, b.job_id, a.job_id]
    # A higher-priority anchor: the moved job takes its priority.
    update(m, admin, QueueUpdate(b.job_id, priority=5))
    update(m, admin, QueueUpdate(a.job_id, ahead_of=b.job_id))
    assert order(m) == [a.job_id, b.job_id, c.job_id]
    assert [alloc.priority for alloc in pending_of(m, a)] == [5]


def test_resource_pool_moves_pending_allocations(m: Master, clock: FakeClock) -> None:
    a = submit(m, clock)
    update(m, builders.admin(m), QueueUpdate(a.job_id, resource_pool=ELASTIC))
    assert order(m, ELASTIC) == [a.job_id] and order(m) == []
    assert [alloc.pool for alloc in pending_of(m, a)] == [ELASTIC]
    with m.sessions() as s:
        exp = s.get(Experiment, a.id)
        assert exp is not None and exp.config["resources"]["resource_pool"] == ELASTIC


def test_owner_may_change_own_job_others_may_not(m: Master, clock: FakeClock) -> None:
    alice, bob = user(m, "alice"), user(m, "bob")
    a = submit(m, clock, owner=alice)
    update(m, alice, QueueUpdate(a.job_id, priority=30))
    with pytest.raises(PermissionDenied):
        update(m, bob, QueueUpdate(a.job_id, priority=1))
    update(m, builders.admin(m), QueueUpdate(a.job_id, priority=20))
    assert [v.priority for v in queue(m)] == [20]


BAD: list[tuple[dict[str, object], type[Exception], str]] = [
    ({"priority": 0}, Invalid, "updates[1].priority"),
    ({"priority": 100}, Invalid, "updates[1].priority"),
    ({"weight": 0.0}, Invalid, "updates[1].weight"),
    ({"weight": float("nan")}, Invalid, "updates[1].weight"),
    ({"queue_position": float("inf")}, Invalid, "updates[1].queuePosition"),
    ({"resource_pool": "nope"}, Invalid, "updates[1].resourcePool"),
    ({"ahead_of": "no-such-job"}, NotFound, "updates[1].aheadOf"),
    ({"ahead_of": "SELF"}, Invalid, "updates[1].aheadOf"),
    ({"ahead_of": "OTHER_POOL"}, Invalid, "updates[1].aheadOf"),
    ({}, Invalid, "updates[1]"),
]


def test_bad_update_refuses_the_whole_request(m: Master, clock: FakeClock) -> None:
    a, b = submit(m, clock), submit(m, clock)
    other = submit(m, clock, resource_pool=ELASTIC)
    anchors = {"SELF": b.job_id, "OTHER_POOL": other.job_id}
    for bad, error, field in BAD:
        fields = {k: anchors.get(v, v) if isinstance(v, str) else v for k, v in bad.items()}
        with pytest.raises(error) as e:
            update(m, builders.admin(m), QueueUpdate(a.job_id, priority=3), QueueUpdate(b.job_id, **fields))  # type: ignore[arg-type]
        assert [d.field for d in e.value.details] == [field], bad  # type: ignore[attr-defined]
        # The first, valid update was rolled back with the request.
        assert [v.priority for v in queue(m, "default")] == [42, 42]
        assert [alloc.priority for alloc in pending_of(m, a)] == [42]


def test_unknown_job_and_oversized_pool_move(m: Master, clock: FakeClock) -> None:
    with pytest.raises(NotFound):
        update(m, builders.admin(m), QueueUpdate("no-such-job", priority=3))
    big = submit(m, clock, slots_per_trial=3)  # the elastic pool's instances have 2 slots each
    with pytest.raises(Invalid) as e:
        update(m, builders.admin(m), QueueUpdate(big.job_id, resource_pool=ELASTIC))
    assert e.value.details[0].field == "updates[0].resourcePool"
    assert order(m) == [big.job_id]


# ------------------------------------------------------------------------------------------
# Agents: enable, disable, drain
# ------------------------------------------------------------------------------------------


def test_disable_without_drain_kills_and_the_trial_is_placed_again(m: Master, clock: FakeClock) -> None:
    a = submit(m, clock)
    add_agent(m, "a1", pool="default", slots=1)
    add_agent(m, "a2", pool="default", slots=1)
    placement.tick(m)
    with m.sessions() as s:
        [first] = s.scalars(select(Allocation).where(Allocation.experiment_id == a.id))
    with transaction(m.sessions) as s:
        view = agents.disable_agent(s, m, first.agent_id or "", drain=False)
        assert not view.agent.enabled and not agents.is_draining(view.agent)
    assert fetch(m, Allocation, first.id).kill_requested
    # The agent reports the kill's exit: an infrastructure cause, and the trial runs elsewhere.
    with transaction(m.sessions) as s:
        alloc = s.get(Allocation, first.id)
        assert alloc is not None
        allocations.end_allocation(s, m, alloc, cause=st.ExitCause.EXITED, reason="killed", exit_code=137)
    placement.tick(m)
    with m.sessions() as s:
        allocs = list(s.scalars(select(Allocation).where(Allocation.experiment_id == a.id)
                                .order_by(Allocation.created_at, Allocation.id)))
        trial_restarts = [t.restarts for t in s.scalars(select(Trial).where(Trial.experiment_id == a.id))]
    assert allocs[0].end_cause == st.ExitCause.KILLED and trial_restarts == [0]
    live = [x for x in allocs if x.state != st.AllocationState.TERMINATED]
    assert len(live) == 1 and live[0].agent_id != first.agent_id


def test_drain_lets_work_finish_then_preempts_after_the_timeout(m: Master, clock: FakeClock) -> None:
    add_agent(m, "a1", pool="default", slots=2)
    add_allocation(m, "x.1", pool="default", state="running", agent_id="a1", slot_ids=["0"])
    with transaction(m.sessions) as s:
        view = agents.disable_agent(s, m, "a1", drain=True)
        assert agents.is_draining(view.agent) and view.agent.drain_started_at == clock()
    clock.advance(seconds=m.config.agent_drain_timeout_s - 1)
    _keep_alive(m, "a1")
    placement.tick(m)
    alloc = fetch(m, Allocation, "x.1")
    assert not alloc.preempt_requested and not alloc.kill_requested
    clock.advance(seconds=2)
    _keep_alive(m, "a1")
    placement.tick(m)
    assert fetch(m, Allocation, "x.1").preempt_requested
    # Draining again does not restart the clock; enabling ends the drain.
    with transaction(m.sessions) as s:
        agents.disable_agent(s, m, "a1", drain=True)
    assert fetch(m, Agent, "a1").drain_started_at is not None
    with transaction(m.sessions) as s:
        view = agents.enable_agent(s, m, "a1")
        assert view.agent.enabled and view.agent.drain_started_at is None


def test_disabled_or_draining_agent_takes_no_new_work(m: Master, clock: FakeClock) -> None:
    add_agent(m, "a1", pool="default", slots=1)
    with transaction(m.sessions) as s:
        agents.disable_agent(s, m, "a1", drain=True)
    a = submit(m, clock)
    placement.tick(m)
    assert [x.state for x in pending_of(m, a)] == [st.AllocationState.PENDING]
    with transaction(m.sessions) as s:
        agents.enable_agent(s, m, "a1")
    placement.tick(m)
    assert pending_of(m, a) == []


def test_enable_refused_while_the_autoscaler_terminates_the_instance(m: Master, clock: FakeClock) -> None:
    add_agent(m, "a1", pool=ELASTIC, slots=2, instance_id="i-1")
    with transaction(m.sessions) as s:
        s.add(Instance(launch_id="l-1", pool=ELASTIC, provider="fake", instance_id="i-1", state="stopping",
                       terminate_reason="idle for 60s"))
        s.get(Agent, "a1").enabled = False  # type: ignore[union-attr]
    with transaction(m.sessions) as s, pytest.raises(Conflict, match="being terminated"):
        agents.enable_agent(s, m, "a1")
    assert not fetch(m, Agent, "a1").enabled
    with transaction(m.sessions) as s, pytest.raises(NotFound):
        agents.disable_agent(s, m, "nope", drain=False)


def _keep_alive(m: Master, agent_id: str) -> None:
    with transaction(m.sessions) as s:
        agent = s.get(Agent, agent_id)
        assert agent is not None
        agent.last_seen = m.clock()
