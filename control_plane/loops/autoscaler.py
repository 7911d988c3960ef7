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
Launch errors back the pool off (quota: exponential; capacity/throttling: short) or stop it (auth,
invalid config), and the pool shows why in `det resource-pool describe`."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.core import states as st
from control_plane.core.scaling import InstanceView, PendingDemand, PoolLimits, ScaleDecision, decide
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Instance, ResourcePool, Token
from control_plane.master import Master
from control_plane.services import allocations
from provisioners.base import CloudInstance, ErrorKind, InstanceState, LaunchSpec, ProviderError
from provisioners.factory import PoolConfigError, PoolProvider, build_provider

log = logging.getLogger("shipyard.autoscaler")

INST_REQUESTED = "requested"
INST_STARTING = "starting"
INST_RUNNING = "running"
INST_STOPPING = "stopping"
INST_TERMINATED = "terminated"
INST_LIVE = (INST_REQUESTED, INST_STARTING, INST_RUNNING)
POOL_DISABLED = "disabled"

# A `requested` row with no cloud instance after this long never launched (the master died
# before the call, or the call failed without an answer): it is closed, never re-sent.
REQUEST_GRACE = timedelta(minutes=3)

UserDataRenderer = Callable[[str, str, str, "PoolProvider"], str]  # (pool, launch_id, token, provider) -> user-data


@dataclass
class _PoolState:
    provider: PoolProvider | None
    error: str | None = None


class Autoscaler:
    def __init__(self, master: Master, render_user_data: UserDataRenderer | None = None) -> None:
        self.master = master
        self.render_user_data = render_user_data or self.default_user_data
        self.pools: dict[str, _PoolState] = {}

    # -- set-up ---------------------------------------------------------------------------------
    def elastic_pools(self) -> list[str]:
        return [p.name for p in self.master.config.resource_pools
                if p.provider and p.provider.get("type") in ("aws", "gcp", "local", "static")]

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
                    row.state, row.error = "error", state.error
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
            if row is None or row.state in (INST_TERMINATED,):
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
            if row.state == INST_STOPPING:
                continue
            row.state = INST_RUNNING if ci.state == InstanceState.RUNNING else (
                INST_STOPPING if ci.state == InstanceState.STOPPING else INST_STARTING)
        for row in rows.values():
            if row.launch_id in seen or row.state == INST_TERMINATED:
                continue
            if row.state == INST_REQUESTED and now - row.requested_at < REQUEST_GRACE:
                continue  # the launch may still be in flight
            self._close_row(s, row, now, row.terminate_reason or (
                "launch never confirmed" if row.state == INST_REQUESTED else "instance disappeared from the cloud"))
        return orphans

    def _close_row(self, s: Session, row: Instance, now: datetime, reason: str) -> None:
        row.state = INST_TERMINATED
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
        rows = list(s.scalars(select(Instance).where(Instance.pool == pool, Instance.state.in_(INST_LIVE))))
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
                state="requested" if row.state == INST_REQUESTED else ("running" if row.state == INST_RUNNING else "starting"),
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
        if launch and prow.backoff_until is not None and prow.backoff_until > now:
            reasons.append(f"not launching: backing off after launch errors until {prow.backoff_until.isoformat()}"
                           f" ({prow.error})")
            launch = 0
        if launch and prow.state == POOL_DISABLED:
            reasons.append("not launching: the pool was torn down (enable it to launch again)")
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
            row.state = INST_STOPPING
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
            s.add(Instance(launch_id=launch_id, pool=pool, provider=settings.type, state=INST_REQUESTED,
                           requested_at=now))
            launch_ids.append(launch_id)
        prow.last_decision = {
            "launch": launch, "terminate": [{"id": t.id, "reason": t.reason} for t in decision.terminate],
            "reasons": reasons, "pending": {str(k): v for k, v in shapes.items()}, "instances": len(rows),
        }
        prow.last_decision_at = now
        if prow.state in ("backoff", "error") and (prow.backoff_until is None or prow.backoff_until <= now):
            prow.state = "ok"  # the backoff is over: the next launch tries again
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
            if os.environ.get("SHIPYARD_FAILPOINT") == "after_launch":
                # Test-only crash point (tests/e2e/test_elastic_pools.py, the chaos test): the master
                # dies after the cloud accepted the launch and before the result is recorded.
                log.warning("event=failpoint name=after_launch launched=%d", len(launched))
                for handler in logging.getLogger().handlers:
                    handler.flush()
                os._exit(137)
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
                    row.instance_id = ci.id
                    row.state = INST_RUNNING if ci.state == InstanceState.RUNNING else INST_STARTING
                    row.launched_at = ci.launched_at
                    row.location = ci.location
                    row.instance_type = ci.instance_type
                    row.private_ip = ci.private_ip
                elif error is not None:
                    self._close_row(s, row, now, f"launch failed: {error}")
            prow = s.get(ResourcePool, pool)
            assert prow is not None
            if error is None:
                prow.launch_failures = 0
                prow.backoff_until = None
                if prow.state == "backoff":
                    prow.state, prow.error = "ok", None
                return
            self._record_error(prow, pp, error, now)

    def _record_error(self, prow: ResourcePool, pp: PoolProvider, error: ProviderError, now: datetime) -> None:
        prow.launch_failures += 1
        if error.kind in (ErrorKind.AUTH, ErrorKind.INVALID):
            # Retrying cannot help until someone fixes the account or the config; still look again
            # after the longest backoff so a fixed IAM policy is picked up without a restart.
            prow.state = "error"
            prow.backoff_until = now + pp.settings.launch_error_backoff_max
        else:
            base = pp.settings.launch_error_backoff.total_seconds()
            if error.kind == ErrorKind.QUOTA:
                delay = base * (2 ** min(prow.launch_failures - 1, 16))
            else:  # capacity everywhere, throttled, unknown: a short, growing pause
                delay = base * min(prow.launch_failures, 4) / 2
            delay = min(delay, pp.settings.launch_error_backoff_max.total_seconds())
            prow.state = "backoff"
            prow.backoff_until = now + timedelta(seconds=delay)
        prow.error = str(error)
        log.warning("event=launch_failed pool=%s kind=%s failures=%d backoff_until=%s error=%r", prow.name,
                    error.kind.value, prow.launch_failures, prow.backoff_until.isoformat(), str(error))

    def _terminate(self, pool: str, pp: PoolProvider, instance_ids: list[str], reason: str | None) -> None:
        try:
            pp.provider.terminate(instance_ids)
        except ProviderError as e:
            log.warning("event=terminate_failed pool=%s ids=%s error=%s", pool, instance_ids, e)
            return  # rows stay `stopping`; the next tick sees the instances still listed and retries
        if reason:
            log.info("event=orphans_terminated pool=%s ids=%s", pool, instance_ids)

    def default_user_data(self, pool: str, launch_id: str, token: str, pp: PoolProvider) -> str:
        if pp.settings.type in ("local", "static"):
            return token  # local processes and SSH-bootstrapped hosts just need their credential
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
                    row.state = POOL_DISABLED
            state = self._pool(name)
            if state.provider is None:
                continue
            ids = [ci.id for ci in state.provider.provider.list()]
            if ids:
                state.provider.provider.terminate(ids)
                count += len(ids)
            with transaction(self.master.sessions) as s:
                now = self.master.clock()
                for row in s.scalars(select(Instance).where(Instance.pool == name, Instance.state != INST_TERMINATED)):
                    self._close_row(s, row, now, "cluster or pool taken down")
        log.info("event=teardown pools=%s instances_terminated=%d", pool or "all", count)
        return count

    def enable(self, pool: str) -> None:
        with transaction(self.master.sessions) as s:
            row = s.get(ResourcePool, pool)
            if row is not None and row.state == POOL_DISABLED:
                row.state = "ok"


def register(master: Master, autoscaler: Autoscaler | None = None, interval_s: float = 3.0) -> Autoscaler:
    autoscaler = autoscaler or Autoscaler(master)
    if autoscaler.elastic_pools():
        master.add_loop("autoscaler", autoscaler.tick, interval_s)
    return autoscaler
