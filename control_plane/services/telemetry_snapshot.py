"""What /metrics reads from the record at scrape time, per pool: slots of connected agents and slots
held by allocations on agents, the queue (pending allocations: how many, and how long the oldest has
waited), and the instances not yet terminated by state. Four grouped queries, whatever the size of
the cluster; pools named in the config appear even when empty, so their series always exist."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane.core import states as st
from control_plane.core.states import InstanceState
from control_plane.db.models import Agent, Allocation, Instance

# Instance states a gauge is kept for (terminated rows are history, not state).
INSTANCE_STATES = tuple(s.value for s in InstanceState if s != InstanceState.TERMINATED)


@dataclass(frozen=True)
class PoolSnapshot:
    pool: str
    slots_total: int = 0  # slots of the pool's connected agents
    slots_used: int = 0  # slots held by allocations placed on agents
    queue_length: int = 0  # allocations waiting for placement
    oldest_wait_s: float = 0.0  # how long the oldest of them has waited (0 with none)
    instances: dict[str, int] = field(default_factory=dict)  # state -> instances (INSTANCE_STATES)


def pool_snapshots(s: Session, pools: Sequence[str], now: datetime) -> list[PoolSnapshot]:
    """One snapshot per pool: the configured ones in order, then any other pool the record names."""
    slots: dict[str, int] = defaultdict(int)
    for pool, agent_slots in s.execute(select(Agent.pool, Agent.slots).where(Agent.state == st.AgentState.CONNECTED)):
        slots[pool] += len(agent_slots or [])
    used = {pool: int(total or 0) for pool, total in s.execute(
        select(Allocation.pool, func.sum(Allocation.slots_needed))
        .where(Allocation.state.in_(st.ALLOC_ON_AGENT)).group_by(Allocation.pool))}
    queued = {pool: (count, oldest) for pool, count, oldest in s.execute(
        select(Allocation.pool, func.count(), func.min(Allocation.created_at))
        .where(Allocation.state == st.AllocationState.PENDING).group_by(Allocation.pool))}
    instances: dict[str, dict[str, int]] = defaultdict(dict)
    for pool, state, count in s.execute(select(Instance.pool, Instance.state, func.count())
                                        .where(Instance.state != InstanceState.TERMINATED)
                                        .group_by(Instance.pool, Instance.state)):
        instances[pool][str(state)] = int(count)
    names = list(dict.fromkeys([*pools, *slots, *used, *queued, *instances]))
    out = []
    for pool in names:
        count, oldest = queued.get(pool, (0, None))
        out.append(PoolSnapshot(
            pool=pool, slots_total=slots.get(pool, 0), slots_used=used.get(pool, 0), queue_length=int(count),
            oldest_wait_s=max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0,
            instances={state: instances[pool].get(state, 0) for state in INSTANCE_STATES}))
    return out
