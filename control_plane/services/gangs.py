"""Allocations placed across several agents (gangs): their parts' progress, the agents owed a start
or a kill, and the rendezvous of the parts. (A part's exit, and the end of the whole gang, are in
services/allocations.py, with the other ends of allocations.)

The rules are the pure `core/gang_run.py`; this module reads and writes `Allocation.placement`
(a new list on every change, so the JSON column is saved)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.core import gang_run
from control_plane.core import states as st
from control_plane.db.models import Agent, Allocation
from control_plane.errors import not_found

_ALLOC_STATE = {"assigned": st.AllocationState.ASSIGNED, "pulling": st.AllocationState.PULLING, "starting": st.AllocationState.STARTING,
                "running": st.AllocationState.RUNNING}


def is_gang(alloc: Allocation) -> bool:
    return bool(alloc.placement) and len(alloc.placement) > 1


def parts(alloc: Allocation) -> list[gang_run.Part]:
    """The part records, with the defaults of rows written before parts had a state."""
    out = []
    for p in alloc.placement or ():
        rec = {"state": "assigned", "exit_code": None, "message": None, "gone": None, "stopped": False}
        rec.update(p)
        out.append(rec)
    return out


# After the chief's clean exit, how long the other parts may take to exit on their own before
# they are stopped (a worker still writing its last files, or stuck in a collective).
WORKER_EXIT_GRACE_S = 30.0


def owes(alloc: Allocation, agent_id: str, now: float) -> str | None:
    """What the agent is owed for its part of the gang: "kill", "start" or nothing."""
    ps = parts(alloc)
    if agent_id in gang_run.to_kill(ps, alloc.kill_requested, now, WORKER_EXIT_GRACE_S):
        return "kill"
    if agent_id in gang_run.to_start(ps, alloc.kill_requested):
        return "start"
    return None


def progressed(alloc: Allocation, agent_id: str, state: str) -> st.AllocationState | None:
    """A part reported `state` (pulling, starting, running): the allocation's new state when the
    least advanced part moved (the caller moves the allocation and its trial), else None."""
    changed = gang_run.advance(parts(alloc), agent_id, state)
    if changed is None:
        return None
    alloc.placement = changed
    return _ALLOC_STATE.get(gang_run.progress(changed))


def rendezvous(s: Session, alloc: Allocation, resources_id: str) -> dict[str, object]:
    """Determined's rendezvous info for one part (its resources id is its agent's id); a trial on
    one agent is rank 0 of one."""
    if not is_gang(alloc):
        if resources_id != (alloc.agent_id or ""):
            raise not_found(f"resources {resources_id} of allocation {alloc.id}")
        agent = s.get(Agent, alloc.agent_id) if alloc.agent_id else None
        addrs = list(agent.addresses or []) if agent is not None else []
        return {"addresses": addrs[:1] or ["127.0.0.1"], "rank": 0, "slots": [len(alloc.slot_ids or ())]}
    ps = parts(alloc)
    ids = [str(p["agent"]) for p in ps]
    addresses = {a.id: list(a.addresses or []) for a in s.scalars(select(Agent).where(Agent.id.in_(ids)))}
    info = gang_run.rendezvous(ps, addresses, resources_id)
    if info is None:
        raise not_found(f"resources {resources_id} of allocation {alloc.id}")
    return info
