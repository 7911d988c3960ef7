"""One object per master (per process): the long-poll hubs (frontdoor/agent_polls.py,
frontdoor/preempt_polls.py) and the group writers (frontdoor/group_commit.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

from control_plane.master import Master

H = TypeVar("H")


def per_master(factory: Callable[[Master], H]) -> Callable[[Master], H]:
    """`of(master)`: the master's object, made by `factory` on first use and dropped with it."""
    made: weakref.WeakKeyDictionary[Master, H] = weakref.WeakKeyDictionary()

    def of(master: Master) -> H:
        obj = made.get(master)
        if obj is None:
            obj = made[master] = factory(master)
        return obj

    return of
