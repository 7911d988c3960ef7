"""Whether a pool can ever host a trial's shape (issue 10, item 5): pure."""

from __future__ import annotations

from control_plane.core.scheduling.fit import PoolCapacity, cannot_host


def test_a_shape_larger_than_the_largest_host_cannot_be_hosted_on_one_agent() -> None:
    cap = PoolCapacity("gpu", 8, "its instances", multi_agent=False)
    assert cannot_host(8, cap) is None
    assert cannot_host(0, cap) is None
    reason = cannot_host(16, cap)
    assert reason is not None and "'gpu'" in reason and "8 slots" in reason and "16 slots per trial" in reason


def test_an_unknown_capacity_refuses_nothing() -> None:
    assert cannot_host(1000, None) is None


def test_multi_agent_placement_relaxes_the_check_to_the_pool_total() -> None:
    assert cannot_host(16, PoolCapacity("gpu", 8, "its instances", multi_agent=True)) is None
    assert cannot_host(16, PoolCapacity("gpu", 8, "its instances", multi_agent=True, total_slots=32)) is None
    reason = cannot_host(40, PoolCapacity("gpu", 8, "its instances", multi_agent=True, total_slots=32))
    assert reason is not None and "32 slots" in reason


def test_across_agents_a_shape_takes_whole_agents_of_one_size() -> None:
    reason = cannot_host(12, PoolCapacity("gpu", 8, "its instances"))
    assert reason is not None and "12 is not a multiple of 8" in reason
    static = PoolCapacity("cpu", 8, "its largest connected agent", agent_sizes=((8, 1), (4, 3)))
    assert cannot_host(12, static) is None  # 3 whole agents of 4
    assert cannot_host(16, static) is not None  # one agent of 8, and 16 is more than the 4s bring
    assert "1x8 slots, 3x4 slots" in (cannot_host(16, static) or "")
