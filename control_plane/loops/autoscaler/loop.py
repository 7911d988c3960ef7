"""The autoscaler loop object: the elastic pools, each pool's provider (built once, refused with a
clear error when its configuration does not build), and one tick per pool that chains the steps:
observe (`reconcile`), decide (`decision`), consolidate (`consolidate`), act (`act`). Also what the
API asks of it: teardown (`terminate_all`) and `enable`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from control_plane import telemetry
from control_plane.core import states as st
from control_plane.core.states import PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import ResourcePool
from control_plane.loops.autoscaler import act, consolidate, decision, reconcile, warm
from control_plane.loops.autoscaler.act import UserDataRenderer
from control_plane.loops.autoscaler.memory import PoolMemory
from control_plane.loops.autoscaler.reconcile import LIST_ERROR
from control_plane.loops.autoscaler.records import pool_move
from control_plane.master import Master
from provisioners import registry
from provisioners.base import Provider, ProviderError, UserDataKind
from provisioners.factory import PoolConfigError, PoolProvider, build_provider

log = logging.getLogger("shipyard.autoscaler")

# (pool name, the pool's provider) -> the provider the autoscaler talks to. Tests wrap the cloud
# edge with it (failure injection); production passes none.
ProviderWrapper = Callable[[str, Provider], Provider]


class Autoscaler:
    def __init__(self, master: Master, render_user_data: UserDataRenderer | None = None,
                 wrap_provider: ProviderWrapper | None = None) -> None:
        self.master = master
        self.render_user_data = render_user_data or self.default_user_data
        self.wrap_provider = wrap_provider
        self.pools: dict[str, PoolMemory] = {}

    # -- set-up ---------------------------------------------------------------------------------
    def elastic_pools(self) -> list[str]:
        return [p.name for p in self.master.config.resource_pools
                if p.provider and p.provider.get("type") in registry.provider_types()]

    def pool_provider(self, name: str) -> PoolProvider | None:
        """The pool's provider and the settings the loop acts on; None if the pool is unusable (its
        record's error says why)."""
        return self._pool(name).provider

    def _pool(self, name: str) -> PoolMemory:
        memory = self.pools.get(name)
        if memory is not None and memory.provider is not None:
            return memory
        cfg = self.master.config.pool(name)
        assert cfg is not None and cfg.provider is not None
        try:
            provider = build_provider(dict(cfg.provider), pool=name, cluster_id=self.master.cluster_id,
                                      master_url=self.master.config.advertised_url,
                                      state_dir=self.master.config.state_dir)
            if self.wrap_provider is not None:
                provider = replace(provider, provider=self.wrap_provider(name, provider.provider))
            memory = PoolMemory(provider)
        except (PoolConfigError, ProviderError) as e:
            # This pool is refused with a clear message; the other pools keep running.
            memory = PoolMemory(None, f"pool {name!r} is not usable: {e}")
            log.error("event=pool_config_error pool=%s error=%s", name, e)
        self.pools[name] = memory
        return memory

    # -- the loop -------------------------------------------------------------------------------
    def tick(self) -> None:
        for name in self.elastic_pools():
            try:
                self.tick_pool(name)
            except Exception:
                log.exception("event=autoscaler_error pool=%s", name)

    def tick_pool(self, name: str) -> None:
        memory = self._pool(name)
        now = self.master.clock()
        if memory.provider is None:
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.state = pool_move(row, PoolState.ERROR)
                    row.error = memory.error
            return
        pp = memory.provider
        try:
            cloud = pp.provider.list()
        except ProviderError as e:
            log.warning("event=list_failed pool=%s error=%s", name, e)
            telemetry.cloud_error(name, "list", e.kind.value)
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.error = f"{LIST_ERROR}{e}"
            # Blind, but terminate is idempotent: what is being stopped keeps being asked to stop.
            act.send_terminations(self.master, name, memory, [], now)
            return
        lookups = reconcile.lookup_missing(self.master, name, pp, {ci.id for ci in cloud})
        with transaction(self.master.sessions) as s:
            orphans = reconcile.reconcile(s, self.master, name, memory, cloud, lookups, now)
        decided, launch_ids = decision.decide_and_apply(self.master, name, memory, orphans, now)
        launch_ids += consolidate.run(self.master, name, memory, now)  # replacements
        warm.send(self.master, name, memory, cloud, now)  # a start refused for good begins a termination
        act.send_terminations(self.master, name, memory, orphans, now)
        if launch_ids:
            act.launch(self.master, name, memory, launch_ids, self.render_user_data)
        if decided.launch or decided.terminate or decided.start or decided.park:
            self.master.notify()

    def default_user_data(self, pool: str, launch_id: str, token: str, pp: PoolProvider) -> str:
        if pp.provider_type.user_data is UserDataKind.TOKEN:
            return token  # the provider starts the agent itself and only needs its credential
        from agent_bootstrap.cloud_init import BootstrapParams, render_user_data

        return render_user_data(BootstrapParams(
            master_url=pp.settings.master_url or self.master.config.advertised_url,
            pool=pool,
            bootstrap_token=token,
            provider=pp.settings.type,
            launch_id=launch_id,
            startup_script=pp.settings.startup_script,
            agent_options=dict(pp.settings.agent),
            container_runtime=pool_cfg.container_runtime if (pool_cfg := self.master.config.pool(pool)) else "process",
        ))

    # -- cluster teardown -------------------------------------------------------------------------
    def terminate_all(self, pool: str | None = None) -> int:
        """Disable launching and terminate every instance with this cluster's tags in one pool (or
        all elastic pools): what `det deploy local down` and deleting a pool do. Returns how many
        instances the terminate was asked for.

        Like any other termination, the rows go to `stopping` (committed before the call) and end
        when the cloud says the instance is gone, on a later tick: a terminate that fails here (or
        a list that fails) is sent again by the next tick, or the next start of the master. The
        allocations on them end at once (requeued as infrastructure failures). A row with no
        instance yet (a launch in flight) ends at once: an instance that lands later is an orphan
        to the next tick."""
        count = 0
        for name in [pool] if pool else self.elastic_pools():
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.state = st.transition(PoolState(row.state), PoolState.DISABLED)
            memory = self._pool(name)
            if memory.provider is None:
                continue
            try:
                cloud = memory.provider.provider.list()
            except ProviderError as e:
                # Blind: the rows are still stopped, and the instances without a row wait for the
                # orphan sweep of a tick whose list works.
                log.warning("event=teardown_list_failed pool=%s error=%s", name, e)
                cloud = []
            with transaction(self.master.sessions) as s:
                now = self.master.clock()
                stopped, orphans = act.stop_for_teardown(s, self.master, name, memory, cloud,
                                                         "cluster or pool taken down", now)
            for ci in orphans:
                memory.terminations.pop(ci.id, None)
            count += stopped + len(orphans)
            act.send_terminations(self.master, name, memory, orphans, now)
        log.info("event=teardown pools=%s instances_terminating=%d", pool or "all", count)
        return count

    def enable(self, pool: str) -> None:
        with transaction(self.master.sessions) as s:
            row = s.get(ResourcePool, pool)
            if row is not None and row.state == PoolState.DISABLED:
                row.state = PoolState.OK


def register(master: Master, autoscaler: Autoscaler | None = None, interval_s: float = 3.0) -> Autoscaler:
    autoscaler = autoscaler or Autoscaler(master)
    if autoscaler.elastic_pools():
        master.add_loop("autoscaler", autoscaler.tick, interval_s)
    return autoscaler
