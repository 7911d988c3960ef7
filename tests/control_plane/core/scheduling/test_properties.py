"""Properties of both policies over random snapshots (hypothesis): no slot double-booked, no gang
placed partially, a reason for everything left waiting, the head of the priority queue never
delayed by backfill, fair shares within one slot of the weighted max-min share."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as hs

from control_plane.core.scheduling import (
    POLICIES,
    AgentSlots,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
)
from control_plane.core.scheduling.fair_share import weighted_max_min
from control_plane.core.scheduling.gang import shapes
from control_plane.core.scheduling.priority import schedule as priority_schedule

# The head (3 slots) waits on an agent of 4 with 2 in use; behind it, two allocations of 1 slot. Only
# one may backfill: the second would hold the slot the head needs once the running work ends.
HALF_USED = ([AgentSlots("a", ("0", "1", "2", "3"), frozenset({"0", "1"}))],
             [RunningAllocation.on("r", "a", ["0", "1"])],
             [PendingAllocation("head", 3, order=0.0), PendingAllocation("b1", 1, order=1.0),
              PendingAllocation("b2", 1, order=2.0)])


@hs.composite
def snapshots(draw: hs.DrawFn, *, with_running: bool = True) -> tuple[list[AgentSlots], list[RunningAllocation],
                                                                       list[PendingAllocation]]:
    sizes = draw(hs.lists(hs.sampled_from([0, 1, 2, 4, 8]), max_size=7))
    agents, running = [], []
    for i, n in enumerate(sizes):
        used = draw(hs.integers(0, n)) if with_running else 0
        schedulable = draw(hs.booleans()) or i % 3 != 0
        agents.append(AgentSlots(f"a{i}", tuple(str(j) for j in range(n)),
                                 frozenset(str(j) for j in range(used)), schedulable))
        if used:
            running.append(RunningAllocation.on(f"r{i}", f"a{i}", [str(j) for j in range(used)],
                                                priority=draw(hs.integers(1, 99)), stopping=draw(hs.booleans()),
                                                preemptible=draw(hs.booleans()), job_id=f"j{draw(hs.integers(0, 4))}",
                                                order=float(i)))
    pending = [PendingAllocation(f"p{i}", draw(hs.sampled_from([0, 1, 2, 3, 4, 8, 16])), draw(hs.integers(1, 99)),
                                 float(i), f"j{draw(hs.integers(0, 4))}", draw(hs.sampled_from([0.5, 1.0, 3.0])))
               for i in range(draw(hs.integers(0, 25)))]
    return agents, running, pending


def check_sound(agents: list[AgentSlots], pending: list[PendingAllocation], d: ScheduleDecision) -> None:
    by_agent = {a.agent_id: a for a in agents}
    want = {p.id: p.slots for p in pending}
    taken: set[tuple[str, str]] = set()
    for asg in d.assignments:
        sizes = [len(p.slot_ids) for p in asg.parts]
        assert sum(sizes) == want[asg.allocation_id]  # never partial
        assert len({p.agent_id for p in asg.parts}) == len(asg.parts)
        if len(asg.parts) > 1:  # across agents: equal parts, each a whole agent
            assert len(set(sizes)) == 1
            assert all(len(by_agent[p.agent_id].slot_ids) == len(p.slot_ids) for p in asg.parts)
        for part in asg.parts:
            ag = by_agent[part.agent_id]
            assert ag.schedulable
            for sl in part.slot_ids:
                assert sl in ag.slot_ids and sl not in ag.used_slot_ids  # free
                assert (part.agent_id, sl) not in taken  # not double-booked
                taken.add((part.agent_id, sl))
    placed = {a.allocation_id for a in d.assignments}
    assert placed.isdisjoint(d.unplaced) and placed | set(d.unplaced) == set(want)
    assert set(d.reasons) == set(d.unplaced)  # every waiting allocation says why
    # Those marked waiting under their job's max_slots are waiting, for that reason.
    assert set(d.capped) <= set(d.unplaced) and len(set(d.capped)) == len(d.capped)
    assert all(d.reasons[c].startswith("its job holds ") for c in d.capped)


@settings(max_examples=150, deadline=None)
@given(snap=snapshots(), preemption=hs.booleans(), fitting=hs.sampled_from(["best", "worst"]),
       policy=hs.sampled_from(sorted(POLICIES)))
def test_decisions_are_sound(snap: tuple, preemption: bool, fitting: str, policy: str) -> None:
    agents, running, pending = snap
    d = POLICIES[policy].schedule(pending, running, agents, preemption=preemption, fitting=fitting)  # type: ignore[arg-type]
    check_sound(agents, pending, d)
    victims = {r.id: r for r in running}
    for v in d.preemptions:
        assert victims[v].preemptible and not victims[v].stopping
    assert len(set(d.preemptions)) == len(d.preemptions)
    if not preemption:
        assert d.preemptions == ()
    elif policy == "priority" and d.preemptions:  # only work of strictly lower priority than a waiting one
        best_waiting = min(p.priority for p in pending if p.id in set(d.unplaced))
        assert all(victims[v].priority > best_waiting for v in d.preemptions)


@settings(max_examples=150, deadline=None)
@given(snap=snapshots(), fitting=hs.sampled_from(["best", "worst"]))
@example(snap=HALF_USED, fitting="best")
@example(snap=HALF_USED, fitting="worst")
def test_backfill_never_delays_the_head_of_the_queue(snap: tuple, fitting: str) -> None:
    """The first allocation of the queue left waiting (and placeable at all) can start once what ran
    before and what was placed ahead of it ends, even if everything backfilled behind it runs on."""
    agents, running, pending = snap
    d = priority_schedule(pending, running, agents, preemption=False, fitting=fitting)  # type: ignore[arg-type]
    sizes = Counter(len(a.slot_ids) for a in agents if a.schedulable)
    order = sorted(pending, key=lambda p: p.queue_key)
    waiting = set(d.unplaced)
    head = next((p for p in order if p.id in waiting and p.slots > 0 and shapes(p.slots, dict(sizes))), None)
    if head is None:
        return
    behind = {p.id for p in order[order.index(head) + 1:]}
    backfilled: dict[str, set[str]] = {}
    for asg in d.assignments:
        if asg.allocation_id in behind:
            for part in asg.parts:
                backfilled.setdefault(part.agent_id, set()).update(part.slot_ids)
    later = [AgentSlots(a.agent_id, a.slot_ids, frozenset(backfilled.get(a.agent_id, ())), a.schedulable)
             for a in agents]
    again = priority_schedule([head], [], later, preemption=False, fitting=fitting)  # type: ignore[arg-type]
    assert [a.allocation_id for a in again.assignments] == [head.id]


@pytest.mark.parametrize("fitting", ["best", "worst"])
def test_backfill_counts_the_slots_already_backfilled_onto_a_reserved_agent(fitting: str) -> None:
    """Backfill behind a reservation leaves `total - reserved` slots to work behind it in all, not
    that many again for each allocation placed there (both 1-slot allocations took the agent's last
    two free slots, and the head could not start once the running work ended)."""
    agents, running, pending = HALF_USED
    d = priority_schedule(pending, running, agents, preemption=False, fitting=fitting)  # type: ignore[arg-type]
    assert [(a.allocation_id, a.slot_ids) for a in d.assignments] == [("b1", ("2",))]
    assert d.unplaced == ("head", "b2")
    assert d.reasons["b2"] == "reserved slots for a job ahead in the queue"


@settings(max_examples=200, deadline=None)
@given(sizes=hs.lists(hs.integers(1, 8), min_size=1, max_size=6),
       jobs=hs.lists(hs.tuples(hs.integers(0, 30), hs.sampled_from([0.5, 1.0, 2.0, 5.0])), min_size=1, max_size=6))
def test_fair_shares_are_within_one_slot_of_the_weighted_max_min_share(sizes: list[int], jobs: list) -> None:
    agents = [AgentSlots(f"a{i}", tuple(str(j) for j in range(n))) for i, n in enumerate(sizes)]
    pending = [PendingAllocation(f"j{k}-{i}", 1, job_id=f"j{k}", weight=w, order=float(i))
               for k, (demand, w) in enumerate(jobs) for i in range(demand)]
    d = POLICIES["fair_share"].schedule(pending, [], agents)
    got = Counter(a.allocation_id.split("-")[0] for a in d.assignments)
    share = weighted_max_min(sum(sizes), {f"j{k}": (demand, w) for k, (demand, w) in enumerate(jobs)})
    for job, s in share.items():
        assert abs(got.get(job, 0) - s) < 1 + 1e-9, (job, got, share)
