"""Whether a pool can ever host a trial's shape: pure, over what the pool's hosts can bring.

An allocation goes on one agent when one is large enough, else across whole agents of equal size
(gang.py): a shape larger than the largest host is placeable when it is a multiple of a host size
and the pool can bring that many hosts of that size at once (`total_slots`, or the connected agents
counted in `agent_sizes`). Pools whose capacity is not known yet refuse nothing."""

from __future__ import annotations

from dataclasses import dataclass

from control_plane.core.scheduling.gang import shapes


@dataclass(frozen=True)
class PoolCapacity:
    pool: str
    largest_host_slots: int  # the most slots one agent (instance, host) of the pool brings
    source: str  # where that figure comes from, in words: "its instances", "its largest connected agent"
    multi_agent: bool = True  # the pool places one allocation across whole agents
    total_slots: int | None = None  # with multi_agent: the most the pool can bring at once (None: no bound)
    # Static pools: slots per agent -> agents of that size (connected now); None: all hosts are the largest.
    agent_sizes: tuple[tuple[int, int], ...] | None = None


def cannot_host(slots: int, capacity: PoolCapacity | None) -> str | None:
    """Why no placement of the pool can ever serve `slots` slots, or None when one can (or when the
    pool's capacity is not known yet: a trial is never refused on a guess)."""
    if capacity is None or slots <= capacity.largest_host_slots:
        return None
    largest = capacity.largest_host_slots
    if not capacity.multi_agent:
        return (f"{slots} slots per trial cannot fit on any instance of pool {capacity.pool!r}: its largest "
                f"({capacity.source}) has {largest} slots, and a trial is placed on one agent")
    if capacity.agent_sizes is not None:
        if shapes(slots, dict(capacity.agent_sizes)):
            return None
        return (f"{slots} slots per trial cannot be served by pool {capacity.pool!r}: {capacity.source} has "
                f"{largest} slots, and across agents a trial takes whole agents of one size whose slots add up "
                f"to it (agents: " + ", ".join(f"{n}x{t} slots" for t, n in capacity.agent_sizes) + ")")
    if largest <= 0 or slots % largest:
        return (f"{slots} slots per trial cannot be served by pool {capacity.pool!r}: a trial across agents "
                f"takes whole agents, and its {capacity.source} have {largest} slots each ({slots} is not a "
                f"multiple of {largest})")
    if capacity.total_slots is not None and slots > capacity.total_slots:
        return (f"{slots} slots per trial cannot be served by pool {capacity.pool!r}: it can bring at most "
                f"{capacity.total_slots} slots across its agents ({capacity.source}: {largest} slots each)")
    return None
