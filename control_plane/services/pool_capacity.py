"""What a pool's hosts can bring, from its config, its record and its agents: the input of the pure
fit check (core/scheduling/fit.py), used to refuse a submission no instance can host and to say
why a queued trial waits forever (a pool reconfigured to smaller instances after it was submitted).

Elastic pools: the slots one instance brings — from the provider section when it says
(`instance_slots`, `slots_per_instance`, `slots_per_host`, GCP's `gpu_num`, an AWS type's GPUs when
shipyard_common/clouds.py lists the type), else as the autoscaler recorded it on the pool (AWS reads
an unlisted type's GPUs from the cloud on the first tick). A gang across instances takes whole
ones, at most `max_instances`. Pools without a provider: the largest connected agent. A manually
joined bigger agent counts too. Unknown: no verdict."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.core import states as st
from control_plane.core.scheduling.fit import PoolCapacity, cannot_host
from control_plane.db.models import Agent, Allocation, ResourcePool
from control_plane.master import Master
from control_plane.services.pool_settings import effective_pool


def pool_capacity(s: Session, master: Master, pool: str) -> PoolCapacity | None:
    cfg = master.config.pool(pool)
    if cfg is None:
        return None
    agents = [len(a.slots or []) for a in s.scalars(select(Agent).where(Agent.pool == pool,
                                                                           Agent.state == st.AgentState.CONNECTED))]
    largest_agent = max(agents, default=None)
    sizes: dict[int, int] = {}
    for n in agents:
        sizes[n] = sizes.get(n, 0) + 1
    ep = effective_pool(cfg)
    per_instance: int | None = None
    if cfg.provider:
        per_instance = ep.instances.slots_per_instance
        if per_instance is None:
            row = s.get(ResourcePool, pool)
            recorded = (row.last_decision or {}).get("slots_per_instance") if row is not None else None
            per_instance = recorded if isinstance(recorded, int) and recorded > 0 else None
    if per_instance is not None and (largest_agent is None or per_instance >= largest_agent):
        # A gang across instances takes whole instances, at most max_instances of them.
        total = per_instance * ep.max_instances if ep.elastic is not None else None
        return PoolCapacity(pool, per_instance, "its instances", total_slots=total)
    if largest_agent is not None:
        return PoolCapacity(pool, largest_agent, "its largest connected agent",
                            agent_sizes=tuple(sorted(sizes.items(), reverse=True)))
    return None


def unservable_reason(s: Session, master: Master, pool: str, slots: int) -> str | None:
    """Why an allocation of `slots` in `pool` can never be placed, or None."""
    return cannot_host(slots, pool_capacity(s, master, pool))


class CapacityCache:
    """Pool capacities looked up once per request (serializing many trials)."""

    def __init__(self, s: Session, master: Master) -> None:
        self.s, self.master = s, master
        self._by_pool: dict[str, PoolCapacity | None] = {}

    def reason(self, pool: str, slots: int) -> str | None:
        if pool not in self._by_pool:
            self._by_pool[pool] = pool_capacity(self.s, self.master, pool)
        return cannot_host(slots, self._by_pool[pool])


def pending_reasons(s: Session, master: Master, *, trial_ids: list[int] | None = None,
                    experiment_ids: list[int] | None = None) -> dict[int, str]:
    """For trials (keyed by trial id) or experiments (keyed by experiment id, the first such trial's
    reason): why their pending allocation can never be placed. Read from the pool as it is now, so
    a pool reconfigured after submission shows on the next read, and a fix clears it."""
    q = select(Allocation).where(Allocation.state == st.AllocationState.PENDING)
    if trial_ids is not None:
        q = q.where(Allocation.trial_id.in_(trial_ids))
    if experiment_ids is not None:
        q = q.where(Allocation.experiment_id.in_(experiment_ids))
    cache = CapacityCache(s, master)
    out: dict[int, str] = {}
    for alloc in s.scalars(q.order_by(Allocation.created_at)):
        key = alloc.trial_id if trial_ids is not None else alloc.experiment_id
        if key is None or key in out:
            continue
        reason = cache.reason(alloc.pool, alloc.slots_needed)
        if reason is not None:
            out[key] = reason
    return out
