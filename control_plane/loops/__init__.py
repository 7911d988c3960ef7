"""The master's background loops: each reads state, calls a pure core and applies its result.

- `placement`: heartbeats, trial reconciliation and placement (the scheduler core), every 0.5 s and
  on every `master.notify()`;
- `autoscaler`: per elastic pool, observe the cloud and the database, decide (the scale decider
  core), launch and terminate through the pool's provider;
- `checkpoint_gc`: delete the files of checkpoints the GC policy dropped."""

from __future__ import annotations

from control_plane.loops import autoscaler, checkpoint_gc, placement
from control_plane.master import Master


def start_background(master: Master, *, wrap_provider: autoscaler.ProviderWrapper | None = None) -> None:
    """`wrap_provider` wraps each elastic pool's provider (tests inject cloud failures with it)."""
    placement.register(master)
    checkpoint_gc.register(master)
    master.autoscaler = autoscaler.register(master, autoscaler.Autoscaler(master, wrap_provider=wrap_provider))
    master.start_loops()
