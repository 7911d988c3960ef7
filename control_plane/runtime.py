"""Which background loops the master runs."""

from __future__ import annotations

from control_plane import autoscaler, gc_hooks, pools
from control_plane.master import Master


def start_background(master: Master) -> None:
    pools.register(master)
    gc_hooks.register(master)
    master.autoscaler = autoscaler.register(master)
    master.start_loops()
