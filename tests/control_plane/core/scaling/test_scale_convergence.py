"""Convergence: with steady demand, the pool reaches a fixed point and then stops acting."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.core.scaling import PoolLimits
from tests.control_plane.core.scaling.sim import PoolSim, SimInstance

TICKS = 700  # 58 minutes of 5 s ticks: long enough for boots (<= 3 min) and idle reaping (<= 15 min)
QUIET = 200  # the last ticks, which must be free of launches and terminations


def acted(sim: PoolSim) -> list[int]:
    return [k for k, d in enumerate(sim.history) if d.launch or d.terminate]


def assert_converged(sim: PoolSim) -> None:
    for _ in range(TICKS):
        sim.step()
    actions = acted(sim)
    assert not actions or actions[-1] < TICKS - QUIET, f"still acting at ticks {actions[-10:]}"
    # The fixed point is the right one: whatever is still pending cannot be helped by launching.
    capacity = sim.limits.slots_per_instance
    schedulable = [s for s in sim.pending if s <= capacity]
    if schedulable:
        assert len(sim.instances) >= sim.limits.max_instances or sim.limits.max_launch_per_decision == 0
    else:
        assert len(sim.instances) >= sim.limits.min_instances
    # No instance is left idle past its period while the pool is above its floor.
    idle = [i for i in sim.instances.values() if not i.tasks]
    if len(sim.instances) > sim.limits.min_instances:
        assert all(sim.now - i.idle_since <= sim.limits.max_idle_agent_period for i in idle if i.idle_since)


def test_steady_demand_from_empty_pool() -> None:
    limits = PoolLimits(0, 20, 8, max_idle_agent_period=timedelta(minutes=5))
    sim = PoolSim(limits, boot_ticks=[18, 22, 15])
    sim.submit(Counter({8: 3, 4: 5, 2: 7, 1: 9}))  # 3*8 + 20 + 14 + 9 = 67 slots -> 9 instances
    assert_converged(sim)
    assert not sim.pending
    assert len(sim.instances) == 9
    assert sim.launched == 9  # no instance was launched and later reaped


def test_demand_above_max_settles_at_max() -> None:
    limits = PoolLimits(1, 4, 8, max_launch_per_decision=2)
    sim = PoolSim(limits, boot_ticks=[12])
    sim.submit(Counter({8: 10}))
    assert_converged(sim)
    assert len(sim.instances) == 4 and len(sim.pending) == 6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spi=st.sampled_from([1, 2, 4, 8]) | st.integers(1, 10),
    bounds=st.tuples(st.integers(0, 3), st.integers(0, 30)),
    idle_minutes=st.integers(1, 15),
    max_launch=st.none() | st.integers(1, 6),
    boot_ticks=st.lists(st.integers(1, 36), min_size=1, max_size=5),
    shapes=st.dictionaries(st.integers(0, 12), st.integers(1, 25), max_size=4),
    preexisting=st.integers(0, 6),
)
def test_steady_demand_converges(
    spi: int,
    bounds: tuple[int, int],
    idle_minutes: int,
    max_launch: int | None,
    boot_ticks: list[int],
    shapes: dict[int, int],
    preexisting: int,
) -> None:
    lo, extra = bounds
    limits = PoolLimits(
        min_instances=lo,
        max_instances=lo + extra,
        slots_per_instance=spi,
        max_idle_agent_period=timedelta(minutes=idle_minutes),
        max_launch_per_decision=max_launch,
    )
    sim = PoolSim(limits, boot_ticks=boot_ticks)
    # Some instances already up and idle (e.g. left over from earlier work) plus the steady demand.
    for k in range(preexisting):
        up_since = sim.now - timedelta(minutes=k)
        sim.instances[f"pre-{k}"] = SimInstance(
            f"pre-{k}", up_since, 0, state="running", connected_at=up_since, idle_since=up_since
        )
    sim.submit(Counter(shapes))
    assert_converged(sim)
