"""The run of a gang across agents (pure): one process group per agent, one allocation.

A trial of `slots_per_trial` larger than any agent is placed on several whole agents
(core/scheduling/gang.py); each agent runs one part of it (the chief is part 0). The allocation's
`placement` keeps one record per part:

    {"agent": id, "slots": [...], "state": "assigned|pulling|starting|running|exited",
     "exit_code": int | None, "message": str | None, "gone": cause | None, "stopped": bool,
     "at": epoch seconds of its exit | None}

The rules, all functions of those records:

* The allocation is as far along as its least advanced part (it is `running` once every part runs).
* The gang ends whole. The run is over as soon as the chief exits (whatever its code), any part
  exits non-zero, or any part is gone with its agent (lost, restarted without it, instance
  terminated): the parts still running are then stopped (`to_kill`) — at once after a failure;
  after the chief's clean exit, once the workers have had `grace_s` to finish on their own — and
  are marked `stopped`, so that their exit does not count as their failure.
* The allocation ends when every part has exited or is gone. Its outcome: the cause of a gone part
  (agent lost, instance terminated) if any, else the first failure of a part that was not stopped
  (its exit code and message, with its rank and agent), else a clean exit 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Progress of a part, in order. "exited" is final.
PART_STATES = ("assigned", "pulling", "starting", "running", "exited")
_ORDER = {name: i for i, name in enumerate(PART_STATES)}

Part = dict[str, Any]


def new_parts(parts: Iterable[tuple[str, Sequence[str]]]) -> list[Part]:
    """The records of a gang just assigned: (agent id, slot ids) per part, the chief first."""
    return [{"agent": agent, "slots": list(slots), "state": "assigned", "exit_code": None, "message": None,
             "gone": None, "stopped": False} for agent, slots in parts]


def rank_of(parts: Sequence[Part], agent_id: str) -> int | None:
    for i, p in enumerate(parts):
        if p.get("agent") == agent_id:
            return i
    return None


def _done(p: Part) -> bool:
    return p.get("state") == "exited"


def advance(parts: Sequence[Part], agent_id: str, state: str) -> list[Part] | None:
    """The records after the part on `agent_id` reported `state` (pulling, starting, running);
    None when nothing changes (unknown agent, or a late or repeated event)."""
    i = rank_of(parts, agent_id)
    if i is None or state not in _ORDER or state == "exited":
        return None
    if _ORDER[state] <= _ORDER.get(parts[i].get("state", "assigned"), 0):
        return None
    out = [dict(p) for p in parts]
    out[i]["state"] = state
    return out


def exited(parts: Sequence[Part], agent_id: str, exit_code: int | None, message: str | None,
           *, gone: str | None = None, at: float | None = None) -> list[Part] | None:
    """The records after the part on `agent_id` exited at `at` (or is `gone` with its agent: a
    cause); None when it had already (a repeated report)."""
    i = rank_of(parts, agent_id)
    if i is None or _done(parts[i]):
        return None
    out = [dict(p) for p in parts]
    out[i].update(state="exited", exit_code=exit_code, message=message, gone=gone, at=at)
    if over(out):
        for p in out:
            if not _done(p):
                p["stopped"] = True
    return out


def over(parts: Sequence[Part]) -> bool:
    """Must the whole gang stop? (The chief exited, a part failed, or a part is gone.)"""
    for rank, p in enumerate(parts):
        if not _done(p) or p.get("stopped"):
            continue
        if rank == 0 or p.get("gone") or p.get("exit_code") != 0:
            return True
    return False


def _failed(parts: Sequence[Part]) -> bool:
    return any(_done(p) and not p.get("stopped") and (p.get("gone") or p.get("exit_code") != 0) for p in parts)


def to_kill(parts: Sequence[Part], kill_requested: bool, now: float | None = None, grace_s: float = 0.0) -> list[str]:
    """The agents to send a kill: every part not yet exited, once the master asked for a kill or
    the gang is over (after the chief's clean exit, only once `grace_s` has passed since it)."""
    live = [str(p["agent"]) for p in parts if not _done(p)]
    if kill_requested:
        return live
    if not over(parts):
        return []
    at = parts[0].get("at") if not _failed(parts) else None
    if at is not None and now is not None and now - float(at) < grace_s:
        return []
    return live


def to_start(parts: Sequence[Part], kill_requested: bool) -> list[str]:
    """The agents still owed a start (not after a kill or the end of the gang)."""
    if kill_requested or over(parts):
        return []
    return [str(p["agent"]) for p in parts if p.get("state") == "assigned"]


def progress(parts: Sequence[Part]) -> str:
    """The allocation's state: that of its least advanced part (exited parts aside)."""
    live = [p.get("state", "assigned") for p in parts if not _done(p)]
    if not live:
        return "exited"
    return min(live, key=lambda s: _ORDER[s])


@dataclass(frozen=True)
class Outcome:
    gone: str | None  # the cause when a part went with its agent
    exit_code: int | None
    reason: str | None


def outcome(parts: Sequence[Part]) -> Outcome | None:
    """How the allocation ends, once every part has exited (None while any part runs)."""
    if not parts or not all(_done(p) for p in parts):
        return None
    for rank, p in enumerate(parts):
        if p.get("gone"):
            return Outcome(str(p["gone"]), None, _where(rank, p) + (p.get("message") or str(p["gone"])))
    for rank, p in enumerate(parts):
        if not p.get("stopped") and p.get("exit_code") != 0:
            return Outcome(None, p.get("exit_code"), _where(rank, p) + (p.get("message") or "failed"))
    chief = parts[0]
    return Outcome(None, 0, chief.get("message"))


def _where(rank: int, p: Part) -> str:
    return f"rank {rank} (agent {p.get('agent')}): "


def rendezvous(parts: Sequence[Part], addresses: dict[str, list[str]], agent_id: str) -> dict[str, Any] | None:
    """Determined's v1RendezvousInfo for the part on `agent_id`: every part's address (the agent's
    first reported address), this part's rank, and the slots of every part."""
    rank = rank_of(parts, agent_id)
    if rank is None:
        return None
    addrs = []
    for p in parts:
        known = addresses.get(str(p["agent"])) or []
        addrs.append(known[0] if known else "127.0.0.1")
    return {"addresses": addrs, "rank": rank, "slots": [len(p.get("slots") or ()) for p in parts]}


C10D_PORT_BASE = 29400
C10D_PORT_SPAN = 2000


def _port_index(allocation_id: str) -> int:
    h = 0xCBF29CE484222325
    for b in allocation_id.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % C10D_PORT_SPAN


def c10d_port(allocation_id: str) -> int:
    """The TCP port of the gang's rendezvous store on its chief. Derived from the allocation id
    (FNV-1a), so every part computes the same one and two gangs on one host rarely share it; if
    they do, the later gang fails to bind, and is retried as a new allocation with another port."""
    return C10D_PORT_BASE + _port_index(allocation_id)


COMM_PORT_BASE = C10D_PORT_BASE - 2 * C10D_PORT_SPAN


def comm_port(allocation_id: str) -> int:
    """The first of the two TCP ports (this one and the next) of the chief's ZMQ broadcast server in
    Determined's `core.DistributedContext` (INTER_TRAIN_PROCESS_COMM_PORT_1/_2), derived like
    `c10d_port` and below its range (25400..29399), under the host's ephemeral ports."""
    return COMM_PORT_BASE + 2 * _port_index(allocation_id)
