"""The master's background loops: each reads state, calls a pure core and applies its result.

- `placement`: heartbeats, trial reconciliation and placement (the scheduler core), every 0.5 s and
  on every `master.notify()`;
- `autoscaler`: per elastic pool, observe the cloud and the database, decide (the scale decider
  core), launch and terminate through the pool's provider;
- `checkpoint_gc`: delete the files of checkpoints the GC policy dropped;
- `task_idle`: stop notebooks idle past their timeout (core/task_idle.py)."""

from __future__ import annotations

from control_plane.db.wakebus import WakeBus
from control_plane.loops import autoscaler, checkpoint_gc, placement, task_idle
from control_plane.master import Master
from control_plane.services.leadership import Leadership


def start_background(master: Master, *, wrap_provider: autoscaler.ProviderWrapper | None = None,
                     shared: bool = False) -> None:
    """The loops of the process that may lead. They run only while it holds the leadership lease
    (services/leadership.py); until then it stands by. `shared`: other master processes use the
    same database (API workers, other hosts): wake-ups cross process boundaries (db/wakebus.py).
    `wrap_provider` wraps each elastic pool's provider (tests inject cloud failures with it)."""
    placement.register(master)
    checkpoint_gc.register(master)
    task_idle.register(master)  # notebooks past their idle timeout
    scaler = autoscaler.register(master, autoscaler.Autoscaler(master, wrap_provider=wrap_provider))
    master.autoscaler = scaler
    master.on_leading(scaler.pools.clear)  # rebuilt from the database: another leader may have acted
    start_wakebus(master, shared=shared)
    master.leadership = Leadership(master.sessions, master.engine, master.master_id,
                                   ttl_s=master.config.leader_lease_s, address=master.config.advertised_url)
    master.start_leadership(renew_s=master.config.leader_lease_s / 5)
    master.start_loops()


def start_wakebus(master: Master, *, shared: bool) -> None:
    """PostgreSQL: always (another host may run a master against the same database). SQLite:
    only when several processes share the file."""
    if master.engine.dialect.name == "postgresql" or (shared and master.engine.url.database not in (None, "", ":memory:")):
        master.wakebus = WakeBus(master.engine, master.master_id, master.wake_local)
        master.wakebus.start()
