"""Which background loops the master runs. Each loop module registers itself here."""

from __future__ import annotations

from control_plane.master import Master


def start_background(master: Master) -> None:
    master.start_loops()
