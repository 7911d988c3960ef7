"""The autoscaler loop: per elastic pool, observe (cloud list + database), decide (pure scale
decider), act (launch / terminate through the pool's provider), and record everything on the pool.

Level-triggered: every tick starts from what the cloud's tags and the database say, never from
memory, so a crash anywhere is healed by the next tick:
- an instance row is written (state `requested`, keyed by a fresh launch id) *before* the launch
  call; the launch id is the cloud's idempotency key and a tag on the instance;
- a cloud instance whose launch id matches a row is adopted (this heals a crash between launch and
  record: no duplicate launch); one with this cluster's tags and no row is an orphan, terminated;
- a row whose instance vanished from the cloud (spot reclaim, manual delete) ends, and so do the
  allocations that ran on it (an infrastructure failure: it does not count against max_restarts).
Launch errors back the pool off or stop it (the pure core control_plane/core/scaling/backoff.py
decides how long from the error's kind and scope), and the pool shows why in
`det resource-pool describe`.

Tests reach the cloud edge through `wrap_provider`: a function that wraps each pool's provider
(failure injection, a crash right after a launch), so no test-only path lives here."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.core import states as st
from control_plane.core.scaling import InstanceView, PendingDemand, PoolLimits, ScaleDecision, backoff, decide
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Instance, ResourcePool, Token
from control_plane.master import Master
from control_plane.services import allocations
from provisioners import registry
from provisioners.base import (
    CloudInstance,
    CloudState,
    ErrorKind,
    LaunchSpec,
    Provider,
    ProviderError,
    UserDataKind,
)
from provisioners.factory import PoolConfigError, PoolProvider, build_provider

log = logging.getLogger("shipyard.autoscaler")

# The master's record of a listed instance follows the cloud's view of it. A listed instance is not
# gone yet (whatever state it reports): its row ends when it leaves the list.
_RECORD_OF: dict[CloudState, InstanceState] = {
    CloudState.PENDING: InstanceState.STARTING,
    CloudState.RUNNING: InstanceState.RUNNING,
    CloudState.STOPPING: InstanceState.STOPPING,
    CloudState.TERMINATED: InstanceState.STOPPING,
}

# A `requested` row with no cloud instance after this long never launched (the master died
# before the call, or the call failed without an answer): it is closed, never re-sent.
REQUEST_GRACE = timedelta(minutes=3)

UserDataRenderer = Callable[[str, str, str, "PoolProvider"], str]  # (pool, launch_id, token, provider) -> user-data
# (pool name, the pool's provider) -> the provider the autoscaler talks to. Tests wrap the cloud
# edge with it (failure injection); production passes none.
ProviderWrapper = Callable[[str, Provider], Provider]


@dataclass
class _PoolState:
    provider: PoolProvider | None
    error: str | None = None


class Autoscaler:
    def __init__(self, master: Master, render_user_data: UserDataRenderer | None = None,
                 wrap_provider: ProviderWrapper | None = None) -> None:
        self.master = master
        self.render_user_data = render_user_data or self.default_user_data
        self.wrap_provider = wrap_provider
        self.pools: dict[str, _PoolState] = {}

    # -- set-up ---------------------------------------------------------------------------------
    def elastic_pools(self) -> list[str]:
        return [p.name for p in self.master.config.resource_pools
                if p.provider and p.provider.get("type") in registry.provider_types()]

    def _pool(self, name: str) -> _PoolState:
        state = self.pools.get(name)
        if state is not None and state.provider is not None:
            return state
        cfg = self.master.config.pool(name)
        assert cfg is not None and cfg.provider is not None
        try:
            provider = build_provider(dict(cfg.provider), pool=name, cluster_id=self.master.cluster_id,
                                      master_url=self.master.config.advertised_url,
                                      state_dir=self.master.config.state_dir)
            if self.wrap_provider is not None:
                provider = replace(provider, provider=self.wrap_provider(name, provider.provider))
            state = _PoolState(provider)
        except (PoolConfigError, ProviderError) as e:
            # This pool is refused with a clear message; the other pools keep running.
            state = _PoolState(None, f"pool {name!r} is not usable: {e}")
            log.error("event=pool_config_error pool=%s error=%s", name, e)
        self.pools[name] = state
        return state

    # -- the loop -------------------------------------------------------------------------------
    def tick(self) -> None:
        for name in self.elastic_pools():
            try:
                self.tick_pool(name)
            except Exception:
                log.exception("event=autoscaler_error pool=%s", name)

    def tick_pool(self, name: str) -> None:
        state = self._pool(name)
        now = self.master.clock()
        if state.provider is None:
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.state = _pool_move(row, PoolState.ERROR)
                    row.error = state.error
            return
        pp = state.provider
        try:
            cloud = pp.provider.list()
        except ProviderError as e:
            log.warning("event=list_failed pool=%s error=%s", name, e)
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.error = f"cannot list instances: {e}"
            return
        with transaction(self.master.sessions) as s:
            orphans = self._reconcile(s, name, cloud, now)
        if orphans:
            self._terminate(name, pp, orphans, "orphan: carries this cluster's tags but the master has no record")
        with transaction(self.master.sessions) as s:
            decision, launch_ids, terminate_ids = self._decide(s, name, pp, now)
        if terminate_ids:
            self._terminate(name, pp, terminate_ids, None)
        if launch_ids:
            self._launch(name, pp, launch_ids)
        if decision.launch or decision.terminate:
            self.master.notify()

    # -- observe ---------------------------------------------------------------------------------
    def _reconcile(self, s: Session, pool: str, cloud: list[CloudInstance], now: datetime) -> list[str]:
        rows = {r.launch_id: r for r in s.scalars(select(Instance).where(Instance.pool == pool))}
        by_instance_id = {r.instance_id: r for r in rows.values() if r.instance_id}
        seen: set[str] = set()
        orphans: list[str] = []
        for ci in cloud:
            row = rows.get(ci.launch_id or "") or by_instance_id.get(ci.id)
            if row is None or row.state == InstanceState.TERMINATED:
                orphans.append(ci.id)
                continue
            seen.add(row.launch_id)
            if row.instance_id is None:
                log.info("event=instance_adopted pool=%s launch_id=%s instance_id=%s", pool, row.launch_id, ci.id)
            row.instance_id = ci.id
            row.location = ci.location or row.location
            row.instance_type = ci.instance_type or row.instance_type
            row.private_ip = ci.private_ip
            row.launched_at = row.launched_at or ci.launched_at
            _instance_move(row, _RECORD_OF[ci.state])  # a row asked to stop stays stopping
        for row in rows.values():
            if row.launch_id in seen or row.state == InstanceState.TERMINATED:
                continue
            if row.state == InstanceState.REQUESTED and now - row.requested_at < REQUEST_GRACE:
                continue  # the launch may still be in flight
            self._close_row(s, row, now, row.terminate_reason or (
                "launch never confirmed" if row.state == InstanceState.REQUESTED
                else "instance disappeared from the cloud"))
        return orphans

    def _close_row(self, s: Session, row: Instance, now: datetime, reason: str) -> None:
        row.state = st.transition(InstanceState(row.state), InstanceState.TERMINATED)
        row.terminated_at = now
        row.terminate_reason = reason
        for t in s.scalars(select(Token).where(Token.launch_id == row.launch_id, Token.revoked_at.is_(None))):
            t.revoked_at = now
        agent = self._agent_of(s, row)
        if agent is not None and agent.state == st.AGENT_CONNECTED:
            agent.state = st.AGENT_DISCONNECTED
            agent.disconnected_at = now
        if agent is not None:
            allocations.end_agent_allocations(s, self.master, agent.id, st.CAUSE_INSTANCE_TERMINATED,
                                        f"instance {row.instance_id} terminated: {reason}")
        log.info("event=instance_closed pool=%s launch_id=%s instance_id=%s reason=%r", row.pool, row.launch_id,
                 row.instance_id, reason)

    @staticmethod
    def _agent_of(s: Session, row: Instance) -> Agent | None:
        if row.agent_id:
            return s.get(Agent, row.agent_id)
        if row.instance_id:
            return s.scalar(select(Agent).where(Agent.instance_id == row.instance_id))
        return None

    # -- decide ----------------------------------------------------------------------------------
    def _decide(self, s: Session, pool: str, pp: PoolProvider, now: datetime) -> tuple[ScaleDecision, list[str], list[str]]:
        settings = pp.settings
        pending = list(s.scalars(select(Allocation).where(Allocation.pool == pool,
                                                           Allocation.state == st.ALLOC_PENDING)))
        shapes: dict[int, int] = {}
        for a in pending:
            shapes[a.slots_needed] = shapes.get(a.slots_needed, 0) + 1
        demand = [PendingDemand(slots, count) for slots, count in sorted(shapes.items())]
        rows = list(s.scalars(select(Instance).where(Instance.pool == pool, Instance.state.in_(st.INSTANCE_LIVE))))
        busy: dict[str, int] = {}
        running: set[str] = set()  # agents with any task, zero-slot ones included
        for a in s.scalars(select(Allocation).where(Allocation.pool == pool, Allocation.state.in_(st.ALLOC_ON_AGENT))):
            busy[a.agent_id or ""] = busy.get(a.agent_id or "", 0) + a.slots_needed
            running.add(a.agent_id or "")
        views = []
        for row in rows:
            agent = self._agent_of(s, row)
            if agent is not None and row.agent_id is None:
                row.agent_id = agent.id
            connected = agent is not None and agent.state == st.AGENT_CONNECTED
            busy_slots = busy.get(agent.id, 0) if agent else 0
            views.append(InstanceView(
                id=row.launch_id,
                state=InstanceState(row.state),
                launched_at=row.launched_at or row.requested_at,
                agent_connected=connected,
                agent_first_connected_at=agent.registered_at if agent else None,
                agent_disconnected_since=None if connected or agent is None else agent.disconnected_at,
                busy_slots=busy_slots,
                idle_since=(agent.idle_since or now) if connected and agent.id not in running else None,
            ))
        limits = PoolLimits(
            min_instances=settings.min_instances, max_instances=settings.max_instances,
            slots_per_instance=pp.slots_per_instance, max_idle_agent_period=settings.max_idle_agent_period,
            max_agent_starting_period=settings.max_agent_starting_period,
            max_disconnected_period=settings.max_disconnected_period,
            max_launch_per_decision=settings.max_launch_per_decision,
        )
        decision = decide(demand, views, limits, now)
        prow = s.get(ResourcePool, pool)
        assert prow is not None
        launch = decision.launch
        reasons = list(decision.reasons)
        if launch and not backoff.may_launch(PoolState(prow.state), prow.backoff_until, now):
            if prow.state == PoolState.DISABLED:
                reasons.append("not launching: the pool was torn down (enable it to launch again)")
            else:
                assert prow.backoff_until is not None
                reasons.append(f"not launching: backing off after launch errors until "
                               f"{prow.backoff_until.isoformat()} ({prow.error})")
            launch = 0
        by_launch = {r.launch_id: r for r in rows}
        terminate_ids: list[str] = []
        for t in decision.terminate:
            row = by_launch.get(t.id)
            if row is None:
                continue
            if row.instance_id is None:
                self._close_row(s, row, now, t.reason)
                continue
            row.state = st.transition(InstanceState(row.state), InstanceState.STOPPING)
            row.terminate_requested_at = now
            row.terminate_reason = t.reason
            agent = self._agent_of(s, row)
            if agent is not None:
                agent.enabled = False  # nothing new lands on an instance being terminated
            terminate_ids.append(row.instance_id)
            log.info("event=terminate_decided pool=%s instance_id=%s reason=%r", pool, row.instance_id, t.reason)
        launch_ids: list[str] = []
        for _ in range(launch):
            launch_id = uuid.uuid4().hex
            s.add(Instance(launch_id=launch_id, pool=pool, provider=settings.type, state=InstanceState.REQUESTED,
                           requested_at=now))
            launch_ids.append(launch_id)
        prow.last_decision = {
            "launch": launch, "terminate": [{"id": t.id, "reason": t.reason} for t in decision.terminate],
            "reasons": reasons, "pending": {str(k): v for k, v in shapes.items()}, "instances": len(rows),
        }
        prow.last_decision_at = now
        # The backoff is over: the next launch tries again.
        prow.state = backoff.current_state(PoolState(prow.state), prow.backoff_until, now)
        return decision, launch_ids, terminate_ids

    # -- act -------------------------------------------------------------------------------------
    def _launch(self, pool: str, pp: PoolProvider, launch_ids: list[str]) -> None:
        specs = []
        with transaction(self.master.sessions) as s:
            now = self.master.clock()
            for launch_id in launch_ids:
                token = auth.issue_token(s, auth.TokenKind.BOOTSTRAP, now=now, ttl=pp.settings.bootstrap_token_ttl,
                                         pool=pool, launch_id=launch_id)
                specs.append(LaunchSpec(launch_id, self.render_user_data(pool, launch_id, token, pp)))
        log.info("event=launching pool=%s count=%d", pool, len(specs))
        try:
            result = pp.provider.launch(specs)
            launched, error = list(result.launched), result.error
        except ProviderError as e:
            launched, error = [], e
        except Exception as e:  # a provider bug must not leave rows dangling forever
            launched, error = [], ProviderError(ErrorKind.UNKNOWN, f"{type(e).__name__}: {e}")
        with transaction(self.master.sessions) as s:
            now = self.master.clock()
            got = {ci.launch_id: ci for ci in launched}
            for launch_id in launch_ids:
                row = s.get(Instance, launch_id)
                if row is None:
                    continue
                ci = got.get(launch_id)
                if ci is not None:
                    # A row closed meanwhile (the pool torn down) stays closed: the instance is an
                    # orphan to the next tick, which terminates it.
                    if not _instance_move(row, InstanceState.RUNNING if ci.state == CloudState.RUNNING
                                          else InstanceState.STARTING):
                        continue
                    row.instance_id = ci.id
                    row.launched_at = ci.launched_at
                    row.location = ci.location
                    row.instance_type = ci.instance_type
                    row.private_ip = ci.private_ip
                elif error is not None:
                    self._close_row(s, row, now, f"launch failed: {error}")
            prow = s.get(ResourcePool, pool)
            assert prow is not None
            if error is None:
                self._record_success(prow)
                return
            self._record_error(prow, pp, error, now)

    @staticmethod
    def _record_success(prow: ResourcePool) -> None:
        after = backoff.after_success(PoolState(prow.state))
        if prow.launch_failures or prow.state != after.state:
            prow.error = None  # the launch error shown on the pool is over
        prow.state, prow.backoff_until, prow.launch_failures = after.state, after.backoff_until, after.failures

    @staticmethod
    def _record_error(prow: ResourcePool, pp: PoolProvider, error: ProviderError, now: datetime) -> None:
        settings = backoff.BackoffSettings(pp.settings.launch_error_backoff, pp.settings.launch_error_backoff_max)
        after = backoff.after_failure(PoolState(prow.state), prow.launch_failures, error.kind, error.scope, settings,
                                      now)
        prow.state, prow.backoff_until, prow.launch_failures = after.state, after.backoff_until, after.failures
        prow.error = f"{error} [{after.reason}]"
        log.warning("event=launch_failed pool=%s kind=%s scope=%s failures=%d state=%s backoff_until=%s error=%r",
                    prow.name, error.kind.value, error.scope.value, after.failures, after.state.value,
                    after.backoff_until.isoformat() if after.backoff_until else None, str(error))

    def _terminate(self, pool: str, pp: PoolProvider, instance_ids: list[str], reason: str | None) -> None:
        try:
            pp.provider.terminate(instance_ids)
        except ProviderError as e:
            log.warning("event=terminate_failed pool=%s ids=%s error=%s", pool, instance_ids, e)
            return  # rows stay `stopping`; the next tick sees the instances still listed and retries
        if reason:
            log.info("event=orphans_terminated pool=%s ids=%s", pool, instance_ids)

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
        ))

    # -- cluster teardown -------------------------------------------------------------------------
    def terminate_all(self, pool: str | None = None) -> int:
        """Disable launching and terminate every instance with this cluster's tags in one pool (or
        all elastic pools): what `det deploy local down` and deleting a pool do."""
        count = 0
        for name in [pool] if pool else self.elastic_pools():
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.state = st.transition(PoolState(row.state), PoolState.DISABLED)
            state = self._pool(name)
            if state.provider is None:
                continue
            ids = [ci.id for ci in state.provider.provider.list()]
            if ids:
                state.provider.provider.terminate(ids)
                count += len(ids)
            with transaction(self.master.sessions) as s:
                now = self.master.clock()
                for row in s.scalars(select(Instance).where(Instance.pool == name,
                                                             Instance.state != InstanceState.TERMINATED)):
                    self._close_row(s, row, now, "cluster or pool taken down")
        log.info("event=teardown pools=%s instances_terminated=%d", pool or "all", count)
        return count

    def enable(self, pool: str) -> None:
        with transaction(self.master.sessions) as s:
            row = s.get(ResourcePool, pool)
            if row is not None and row.state == PoolState.DISABLED:
                row.state = PoolState.OK


def _instance_move(row: Instance, target: InstanceState) -> bool:
    """Move the row to `target` if its state machine allows it; whether it did."""
    current = InstanceState(row.state)
    if not st.can_transition(current, target):
        log.debug("event=instance_state_kept launch_id=%s state=%s refused=%s", row.launch_id, current, target)
        return False
    row.state = target
    return True


def _pool_move(row: ResourcePool, target: PoolState) -> PoolState:
    """`target` if the pool's state machine allows the change, else its current state."""
    current = PoolState(row.state)
    return target if st.can_transition(current, target) else current


def register(master: Master, autoscaler: Autoscaler | None = None, interval_s: float = 3.0) -> Autoscaler:
    autoscaler = autoscaler or Autoscaler(master)
    if autoscaler.elastic_pools():
        master.add_loop("autoscaler", autoscaler.tick, interval_s)
    return autoscaler
