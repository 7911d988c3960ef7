"""Which background loops the master runs."""

from __future__ import annotations

from control_plane import pools
from control_plane.master import Master


def start_background(master: Master) -> None:
    pools.register(master)
    master.start_loops()
