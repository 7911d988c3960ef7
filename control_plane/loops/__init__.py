"""Which background loops the master runs."""

from __future__ import annotations

from control_plane.loops import autoscaler
from control_plane.loops import placement as pools
from control_plane.master import Master
from control_plane.services import checkpoint_gc as gc_hooks


def start_background(master: Master) -> None:
    pools.register(master)
    gc_hooks.register(master)
    master.autoscaler = autoscaler.register(master)
    master.start_loops()
