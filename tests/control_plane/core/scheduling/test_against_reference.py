"""The indexed scheduling pass decides exactly what the scan it replaced decided (issue 28).

`_reference/` keeps the policies and gang.py as they were before the indexes of free slots and of
preemptible work (commit 8c7da37): every agent scanned for each waiting allocation. Over random
clusters (agents of mixed sizes, partly used by running work of mixed priorities, jobs, ages, some
already stopping or not preemptible, some gangs across whole agents) and random queues, both
policies, preemption on and off, best and worst fit, the decision — assignments, preemptions, the
waiting list and every reason — is the same."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as hs

from benchmarks.scheduler import full_pool, make_queue
from control_plane.core.scheduling import POLICIES, AgentSlots, Part, PendingAllocation, RunningAllocation
from control_plane.core.scheduling.policy import ScheduleDecision
from tests.control_plane.core.scheduling._reference import REFERENCE

PRIORITIES = (10, 42, 42, 60, 99)


@hs.composite
def clusters(draw: hs.DrawFn) -> tuple[list[AgentSlots], list[RunningAllocation], list[PendingAllocation]]:
    sizes = draw(hs.lists(hs.sampled_from([0, 1, 2, 4, 4, 8, 8, 8]), min_size=1, max_size=12))
    used: list[int] = [0] * len(sizes)
    running: list[RunningAllocation] = []
    n = 0

    def attrs() -> dict:
        return {"priority": draw(hs.sampled_from(PRIORITIES)), "preemptible": draw(hs.integers(0, 5)) > 0,
                "stopping": draw(hs.integers(0, 5)) == 0, "job_id": draw(hs.sampled_from(["", "j0", "j0", "j0", "j1", "j2"])),
                "order": float(draw(hs.integers(0, 6))), "weight": draw(hs.sampled_from([0.5, 1.0, 3.0]))}

    # Gangs across whole agents of one size.
    for _ in range(draw(hs.integers(0, 3))):
        t = draw(hs.sampled_from([2, 4, 8]))
        idle = [i for i, s in enumerate(sizes) if s == t and used[i] == 0]
        if len(idle) >= 2:
            take = idle[:draw(hs.integers(2, len(idle)))]
            parts = tuple(Part(f"a{i}", tuple(str(s) for s in range(t))) for i in take)
            running.append(RunningAllocation(f"r{n}", parts, **attrs()))
            n += 1
            for i in take:
                used[i] = t
    # Work on one agent each, and now and then slots in use by nothing the master knows of.
    for i, size in enumerate(sizes):
        while used[i] < size and draw(hs.integers(0, 9)) > 0:
            k = draw(hs.integers(1, size - used[i]))
            ids = tuple(str(s) for s in range(used[i], used[i] + k))
            used[i] += k
            if draw(hs.integers(0, 9)) > 0:
                running.append(RunningAllocation(f"r{n}", (Part(f"a{i}", ids),), **attrs()))
                n += 1
    agents = [AgentSlots(f"a{i}", tuple(str(s) for s in range(size)), frozenset(str(s) for s in range(used[i])),
                         schedulable=draw(hs.integers(0, 7)) > 0) for i, size in enumerate(sizes)]
    draw(hs.randoms(use_true_random=False)).shuffle(running)
    pending = [PendingAllocation(f"p{i}", draw(hs.sampled_from([0, 1, 1, 2, 3, 4, 4, 8, 8, 16, 24])),
                                 draw(hs.sampled_from(PRIORITIES)), float(draw(hs.integers(0, 9))),
                                 draw(hs.sampled_from(["", "j0", "j1", "j2", "j3"])),
                                 draw(hs.sampled_from([0.5, 1.0, 3.0])),
                                 queue_position=draw(hs.none() | hs.floats(0, 9)),
                                 max_slots=draw(hs.sampled_from([None, None, None, None, None, 2, 8, 16])))
               for i in range(draw(hs.integers(0, 40)))]
    return agents, running, pending


@settings(max_examples=400, deadline=None)
@given(cluster=clusters(), policy=hs.sampled_from(sorted(POLICIES)), preemption=hs.booleans(),
       fitting=hs.sampled_from(["best", "worst"]))
def test_same_decision_as_the_scan(cluster: tuple, policy: str, preemption: bool, fitting: str) -> None:
    agents, running, pending = cluster
    new = POLICIES[policy].schedule(pending, running, agents, preemption=preemption, fitting=fitting)  # type: ignore[arg-type]
    old = REFERENCE[policy](pending, running, agents, preemption=preemption, fitting=fitting)
    assert _sans_capped(new) == old
    # The reference does not mark them: exactly those waiting under their job's max_slots are.
    assert set(new.capped) == {i for i in new.unplaced if new.reasons[i].startswith("its job holds ")}


def _sans_capped(d: ScheduleDecision) -> ScheduleDecision:
    return dataclasses.replace(d, capped=())


def test_same_decision_on_a_large_full_pool() -> None:
    """The benchmark's full pool (gangs running across agents, mixed priorities) at a tenth of its size:
    hundreds of preemptions, most agents reserved, the index's heaps long."""
    agents, running = full_pool(100, random.Random(8))
    pending = make_queue(1000, random.Random(7))
    for policy in sorted(POLICIES):
        for preemption in (True, False):
            new = POLICIES[policy].schedule(pending, running, agents, preemption=preemption)
            assert _sans_capped(new) == REFERENCE[policy](pending, running, agents, preemption=preemption), (
                policy, preemption)
            if preemption:
                assert new.preemptions


def test_work_of_a_job_placed_above_its_share_may_yield_later_in_the_pass() -> None:
    """Fair share: M preempts first (the index of preemptible work starts), J is then placed past its
    share, so K, next, has J's newest allocation yield: the index re-reads J's work after J's placement."""
    s = tuple(str(i) for i in range(8))
    agents = [AgentSlots("a2", s, frozenset(s)), AgentSlots("b0", s[:4])]
    agents += [AgentSlots(f"a{i}", s, frozenset(s)) for i in (3, 4, 5)]
    running = [RunningAllocation.on("j1", "a2", ["0"], job_id="J", order=1, weight=0.25),
               RunningAllocation.on("j2", "a2", ["1"], job_id="J", order=2, weight=0.25),
               RunningAllocation.on("l", "a2", s[2:], job_id="L", preemptible=False)]
    running += [RunningAllocation.on(f"h{i}{h}", f"a{i}", s[4 * h:4 * h + 4], job_id="H", order=3 + i + h)
                for i in (3, 4, 5) for h in (0, 1)]
    pending = [PendingAllocation("m", 8, job_id="M", order=0), PendingAllocation("pj", 4, job_id="J", order=1),
               PendingAllocation("pk", 1, job_id="K", order=2)]
    d = POLICIES["fair_share"].schedule(pending, running, agents)
    assert _sans_capped(d) == REFERENCE["fair_share"](pending, running, agents)
    assert d.preemptions == ("h31", "h30", "j2") and d.assignments[0].allocation_id == "pj"
