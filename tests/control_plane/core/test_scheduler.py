"""The `priority` policy (core/scheduling/priority.py): pure, over hand-made snapshots."""

from __future__ import annotations

from control_plane.core.scheduling import AgentSlots, Part, PendingAllocation, RunningAllocation
from control_plane.core.scheduling.priority import schedule

P = PendingAllocation


def agents(*sizes: int, used: dict[str, int] | None = None) -> list[AgentSlots]:
    """Agents a0, a1, ... of the given sizes; `used`: agent -> how many of its first slots are taken."""
    used = used or {}
    return [AgentSlots(f"a{i}", tuple(str(j) for j in range(n)), frozenset(str(j) for j in range(used.get(f"a{i}", 0))))
            for i, n in enumerate(sizes)]


def run(id: str, agent: str, n: int, first: int = 0, **kw: object) -> RunningAllocation:
    return RunningAllocation.on(id, agent, [str(j) for j in range(first, first + n)], **kw)


def placed(d: object) -> dict[str, list[tuple[str, int]]]:
    return {a.allocation_id: [(p.agent_id, len(p.slot_ids)) for p in a.parts] for a in d.assignments}  # type: ignore[attr-defined]


def test_a_gang_goes_on_one_agent_when_one_holds_it_else_on_whole_agents() -> None:
    d = schedule([P("g16", 16), P("g4", 4)], [], agents(8, 8, 8))
    assert sorted(n for _, n in placed(d)["g16"]) == [8, 8]
    assert len({a for a, _ in placed(d)["g16"]}) == 2
    assert [n for _, n in placed(d)["g4"]] == [4]


def test_shapes_that_no_set_of_whole_agents_makes_are_unschedulable_with_the_reason() -> None:
    d = schedule([P("g12", 12), P("g24", 24)], [], agents(8, 8, 2, 2))
    assert d.assignments == () and set(d.unplaced) == {"g12", "g24"}
    assert d.reasons["g12"].startswith("unschedulable: needs 12 slots; the largest schedulable agent has 8")
    assert "2x8 slots, 2x2 slots" in d.reasons["g24"]
    d2 = schedule([P("g4", 4), P("g3", 3)], [], agents(2, 2))  # 4 = 2 whole agents of 2; 3 is not
    assert sorted(placed(d2)["g4"]) == [("a0", 2), ("a1", 2)]
    assert d2.reasons["g3"].startswith("unschedulable: needs 3 slots")


def test_a_gang_never_starts_partially() -> None:
    d = schedule([P("g16", 16)], [], agents(8, 8, used={"a1": 1}))
    assert d.assignments == () and d.unplaced == ("g16",)
    assert d.reasons["g16"] == "waiting for 2 whole agents of 8 slots (16 slots); 1 is free"


def test_priority_then_queue_position_then_submission_order() -> None:
    pending = [P("late-high", 2, priority=10, order=5), P("early-low", 2, priority=50, order=1),
               P("early-high", 2, priority=10, order=1), P("moved-up", 2, priority=50, order=9, queue_position=0.5)]
    d = schedule(pending, [], agents(6), preemption=False)
    assert [a.allocation_id for a in d.assignments] == ["early-high", "late-high", "moved-up"]
    assert d.unplaced == ("early-low",)


def test_best_fit_packs_and_worst_fit_spreads() -> None:
    best = schedule([P("one", 1), P("four", 4)], [], agents(4, 1))
    assert {k: v[0][0] for k, v in placed(best).items()} == {"one": "a1", "four": "a0"}
    worst = schedule([P("one", 1), P("two", 1)], [], agents(4, 4, 2), fitting="worst")
    assert {v[0][0] for v in placed(worst).values()} == {"a0", "a1"}


def test_small_work_backfills_only_slots_the_head_of_the_queue_does_not_need() -> None:
    """The 8-slot head cannot start: it reserves a1 (most free); a 2-slot job behind it backfills
    onto a0, never onto a1, so the head starts as soon as a1's running work ends."""
    ags = agents(8, 8, used={"a0": 6, "a1": 2})
    running = [run("r0", "a0", 6), run("r1", "a1", 2)]
    pending = [P("head", 8, priority=10, order=0), P("small", 2, priority=50, order=1),
               P("small2", 2, priority=50, order=2)]
    d = schedule(pending, running, ags, preemption=False)
    assert placed(d) == {"small": [("a0", 2)]}
    assert d.reasons["head"] == "waiting for 8 slots on one agent; 2 agents have at most 6 free"
    assert d.reasons["small2"] == "reserved slots for a higher-priority job"
    same = [P("head", 8, order=0), P("small", 2, order=1), P("small2", 2, order=2)]
    d2 = schedule(same, running, ags, preemption=False)
    assert placed(d2) == {"small": [("a0", 2)]}
    assert d2.reasons["small2"] == "reserved slots for a job ahead in the queue"


def test_behind_higher_priority_jobs_when_nothing_is_left_to_reserve() -> None:
    pending = [P("h1", 4, priority=1, job_id="j1"), P("h2", 4, priority=2, job_id="j2"),
               P("low", 4, priority=50, order=1, job_id="j3"), P("low2", 4, priority=50, order=2, job_id="j4")]
    d = schedule(pending, [run("r", "a0", 4), run("s", "a1", 4)], agents(4, 4, used={"a0": 4, "a1": 4}),
                 preemption=False)
    assert d.reasons["low"] == "behind 2 higher-priority jobs"
    assert d.reasons["low2"] == "behind 2 higher-priority jobs and 1 earlier of the same priority"


def test_preemption_takes_the_newest_lower_priority_work_only_as_much_as_needed() -> None:
    ags = agents(4, 4, used={"a0": 4, "a1": 4})
    running = [run("old", "a0", 2, priority=60, order=1), run("new", "a0", 2, first=2, priority=60, order=5),
               run("big", "a1", 4, priority=60, order=3)]
    d = schedule([P("high", 2, priority=10)], running, ags)
    assert d.preemptions == ("new",)
    assert d.reasons["high"] == "preempting 1 lower-priority allocation"
    # never equal or higher priority
    assert schedule([P("same", 2, priority=60)], running, ags).preemptions == ()
    # no extra evictions while an earlier victim is still stopping
    stopping = [run("old", "a0", 2, priority=60), run("new", "a0", 2, first=2, priority=60, stopping=True),
                run("big", "a1", 4, priority=60)]
    d3 = schedule([P("high", 2, priority=10)], stopping, ags)
    assert d3.preemptions == () and d3.reasons["high"] == "waiting for slots of allocations already stopping"
    assert schedule([P("high", 2, priority=10)], running, ags, preemption=False).preemptions == ()
    # non-preemptible work stays
    pinned = [run("old", "a0", 4, priority=60, preemptible=False), run("big", "a1", 4, priority=60, preemptible=False)]
    assert schedule([P("high", 2, priority=10)], pinned, ags).preemptions == ()


def test_a_gang_across_agents_preempts_whole_agents() -> None:
    ags = agents(8, 8, 8, used={"a0": 8, "a1": 8, "a2": 8})
    running = [run("low0", "a0", 8, priority=60, order=1), run("low1", "a1", 8, priority=60, order=2),
               run("keep", "a2", 8, priority=5)]
    d = schedule([P("g16", 16, priority=10)], running, ags)
    assert sorted(d.preemptions) == ["low0", "low1"]


def test_preempting_a_gang_frees_all_its_agents() -> None:
    gang = RunningAllocation("gang", (Part("a0", tuple("01234567")), Part("a1", tuple("01234567"))), priority=70)
    ags = agents(8, 8, used={"a0": 8, "a1": 8})
    d = schedule([P("x", 8, priority=10), P("y", 8, priority=10)], [gang], ags)
    assert d.preemptions == ("gang",)  # once: its two agents serve both
    assert d.reasons["y"] == "waiting for slots of allocations already stopping"


def test_max_slots_caps_what_a_job_holds_at_once() -> None:
    pending = [P(f"t{i}", 2, job_id="exp", max_slots=4, order=i) for i in range(3)]
    d = schedule(pending, [], agents(8))
    assert sorted(placed(d)) == ["t0", "t1"]
    assert d.reasons["t2"] == "its job holds 4 slots of its max_slots 4"


def test_unschedulable_agents_are_skipped() -> None:
    ag = [AgentSlots("gone", ("0", "1"), schedulable=False)]
    d = schedule([P("x", 1)], [], ag)
    assert d.assignments == () and d.reasons["x"] == "unschedulable: the pool has no schedulable agents"


def test_zero_slot_work_needs_an_agent_but_no_slot() -> None:
    d = schedule([P("cpu", 0)], [], agents(1, used={"a0": 1}))
    assert placed(d) == {"cpu": [("a0", 0)]}
