"""Whether a pool can ever host a trial's shape (issue 10, item 5): pure."""

from __future__ import annotations

from control_plane.core.scheduling.fit import PoolCapacity, cannot_host


def test_a_shape_larger_than_the_largest_host_cannot_be_hosted() -> None:
    cap = PoolCapacity("gpu", 8, "its instances")
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
