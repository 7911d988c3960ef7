"""The `fair_share` policy (core/scheduling/fair_share.py): weighted max-min shares across jobs."""

from __future__ import annotations

from collections import Counter

import pytest

from control_plane.core.scheduling import AgentSlots, PendingAllocation, RunningAllocation
from control_plane.core.scheduling.fair_share import schedule, weighted_max_min

P = PendingAllocation


def agents(*sizes: int, used: dict[str, int] | None = None) -> list[AgentSlots]:
    used = used or {}
    return [AgentSlots(f"a{i}", tuple(str(j) for j in range(n)), frozenset(str(j) for j in range(used.get(f"a{i}", 0))))
            for i, n in enumerate(sizes)]


def test_water_filling_gives_what_small_demands_ask_and_splits_the_rest_by_weight() -> None:
    shares = weighted_max_min(12, {"small": (2, 1.0), "a": (100, 1.0), "b": (100, 4.0)})
    assert shares == pytest.approx({"small": 2, "a": 2, "b": 8})
    assert weighted_max_min(10, {"x": (3, 1.0), "y": (4, 1.0)}) == {"x": 3, "y": 4}  # all demand served
    assert weighted_max_min(0, {"x": (3, 1.0)}) == {"x": 0}


def test_slots_go_by_weight_and_max_slots_caps_the_demand() -> None:
    pending = [P(f"{job}-{i}", 1, job_id=job, weight=w, order=i, max_slots=cap)
               for job, w, cap in (("light", 1.0, None), ("heavy", 3.0, None), ("capped", 10.0, 2)) for i in range(20)]
    d = schedule(pending, [], agents(8, 8))
    got = Counter(a.allocation_id.split("-")[0] for a in d.assignments)
    assert got == {"capped": 2, "heavy": 10, "light": 4}  # 16 slots: capped takes 2, then 3:1 of 14 ~ 10.5:3.5
    assert all(r.startswith(("its job holds 2 slots of its max_slots 2", "waiting for 1 slot", "waiting behind"))
               for r in d.reasons.values())
    # Those waiting under their own cap are marked so (the autoscaler launches nothing for them).
    assert sorted(d.capped) == sorted(f"capped-{i}" for i in range(2, 20))
    assert set(d.capped) <= set(d.unplaced)


def test_a_job_below_its_share_has_jobs_above_theirs_yield_newest_first() -> None:
    running = [RunningAllocation.on(f"hog-{i}", "a0", [str(i)], job_id="hog", order=float(i)) for i in range(4)]
    pending = [P(f"new-{i}", 1, job_id="new", order=10 + i) for i in range(2)]
    d = schedule(pending, running, agents(4, used={"a0": 4}))
    assert d.preemptions == ("hog-3",)  # one per pass per waiting job, the newest first
    assert d.reasons["new-0"].startswith("preempting 1 allocation")
    assert d.reasons["new-1"] == "waiting behind new-0 of the same job"
    assert schedule(pending, running, agents(4, used={"a0": 4}), preemption=False).preemptions == ()


def test_a_job_at_its_share_is_not_preempted() -> None:
    running = [RunningAllocation.on(f"{j}-{i}", "a0", [str(2 * k + i)], job_id=j, order=float(i))
               for k, j in enumerate(("x", "y")) for i in range(2)]
    d = schedule([P("y-more", 1, job_id="y")], running, agents(4, used={"a0": 4}))
    assert d.preemptions == () and d.unplaced == ("y-more",)
