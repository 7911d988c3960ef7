"""Allocations placed across several agents (gangs): the agents an allocation holds, their parts'
progress, the agents owed a start or a kill, and the rendezvous of the parts. (A part's exit, and
the end of the whole gang, are in services/allocations.py, with the other ends of allocations.)

The rules are the pure `core/gang_run.py`; this module reads and writes `Allocation.placement`
(a new list on every change, so the JSON column is saved)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from control_plane.core import gang_run
from control_plane.core import states as st
from control_plane.db.models import Agent, Allocation
from control_plane.errors import not_found

_ALLOC_STATE = {"assigned": st.AllocationState.ASSIGNED, "pulling": st.AllocationState.PULLING, "starting": st.AllocationState.STARTING,
                "running": st.AllocationState.RUNNING}


def is_gang(alloc: Any) -> bool:
    return bool(alloc.placement) and len(alloc.placement) > 1


def held(alloc: Any) -> list[tuple[str, list[str]]]:
    """The agents an allocation holds, each with the slot ids it holds there, the chief first: every
    part of a gang across agents (`placement`), else its one agent (`agent_id`). `alloc` is an
    Allocation or a row with its `agent_id`, `slot_ids` and `placement`.

    The one home of "which agents does this allocation occupy": placement's used slots, the
    autoscaler's busy instances and its idle re-check (`holding`), the web UI's busy slots and the
    agents' commands all read it, so a gang's second agent is never taken for idle."""
    if alloc.placement:
        return [(str(p["agent"]), [str(x) for x in p.get("slots") or ()]) for p in alloc.placement]
    if alloc.agent_id is None:
        return []
    return [(str(alloc.agent_id), [str(x) for x in alloc.slot_ids or ()])]


def busy_slots(allocs: Iterable[Any]) -> dict[str, int]:
    """Slots held per agent by `allocs` (allocations on agents), every agent of a gang included; an
    agent holding only zero-slot tasks is a key with 0. A gang's part holds its slots; an allocation
    on one agent holds the slots it needs."""
    busy: dict[str, int] = {}
    for a in allocs:
        gang = is_gang(a)
        for agent_id, slot_ids in held(a):
            busy[agent_id] = busy.get(agent_id, 0) + (len(slot_ids) if gang else a.slots_needed)
    return busy


def holding(s: Session, agent_id: str, pool: str | None = None) -> list[Allocation]:
    """The allocations on agents that hold `agent_id`: those it is the chief of, and gangs it is a
    part of, re-read from the database (objects already in the session are refreshed: the
    autoscaler's idle re-check runs it right after locking the agent's row, and must see what a
    placement committed meanwhile).

    A part that is not the chief is found by reading the live allocations with a `placement` (of
    `pool`, when given) and filtering their parts here, rather than through a table of parts
    indexed by agent: live gangs are few (each takes two or more whole agents, so at most half the
    pool's agents), the JSON column is the record every gang rule reads and writes, and a second
    copy of it would have to be kept in step on every assignment and part exit."""
    q = select(Allocation).where(or_(Allocation.agent_id == agent_id, Allocation.placement.is_not(None)),
                                 Allocation.state.in_(st.ALLOC_ON_AGENT))
    if pool is not None:
        q = q.where(Allocation.pool == pool)
    rows = s.scalars(q.execution_options(populate_existing=True))
    return [a for a in rows if any(held_id == agent_id for held_id, _ in held(a))]


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
