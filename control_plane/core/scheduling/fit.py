"""Whether a pool can ever host a trial's shape: pure, over what the pool's hosts can bring.

Today an allocation is placed whole on one agent, so the largest host decides. When multi-agent
placement comes (the scheduling issue), a pool that can spread a trial across agents says so with
`multi_agent=True` and the check relaxes to the pool's total capacity without its callers changing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolCapacity:
    pool: str
    largest_host_slots: int  # the most slots one agent (instance, host) of the pool brings
    source: str  # where that figure comes from, in words: "its instances", "its largest connected agent"
    multi_agent: bool = False  # the pool places one allocation across agents
    total_slots: int | None = None  # with multi_agent: the most the pool can bring at once (None: no bound)


def cannot_host(slots: int, capacity: PoolCapacity | None) -> str | None:
    """Why no placement of the pool can ever serve `slots` slots, or None when one can (or when the
    pool's capacity is not known yet: a trial is never refused on a guess)."""
    if capacity is None or slots <= capacity.largest_host_slots:
        return None
    if capacity.multi_agent:
        if capacity.total_slots is None or slots <= capacity.total_slots:
            return None
        return (f"{slots} slots per trial cannot be served by pool {capacity.pool!r}: it can bring at most "
                f"{capacity.total_slots} slots across its agents")
    return (f"{slots} slots per trial cannot fit on any instance of pool {capacity.pool!r}: its largest "
            f"({capacity.source}) has {capacity.largest_host_slots} slots, and a trial is placed on one agent")
