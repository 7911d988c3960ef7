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
  A list miss is evidence, not proof (cloud lists are eventually consistent): the row ends when the
  cloud says so by id (`describe`) or after the pool's `list_miss_grace`
  (control_plane/core/scaling/reconcile.py has the rules);
- terminations are level-triggered: a row in `stopping` (and an orphan) gets its terminate call
  again on later ticks, at growing intervals up to a bound, until the cloud reports the instance
  gone; a crash between committing `stopping` and the call is healed the same way. Until then the
  instance counts toward max_instances (it bills). An instance the cloud reports stopped, suspended
  or shutting down (a GCE VM powered off, an EC2 instance stopped by hand) is terminated: its disks
  would bill forever.
The snapshot is read in a read-only transaction and the decision written in another, so placement
may commit in between: a termination that presumes the instance idle is applied only if its agent
still holds no allocation under a lock on the agent's row, which is disabled in the same
transaction (placement assigns through a compare-and-set on `enabled`); whichever commits first
wins. The decider is given the pool's recent demand arrivals (allocations created over its
`arrival_window`) for its scale-down hysteresis.
Launch errors back the pool off or stop it (the pure core control_plane/core/scaling/backoff.py
decides how long from the error's kind and scope), and the pool shows why in
`det resource-pool describe`; during a long backoff one instance probes every
`launch_probe_interval`. An error shown on the pool ends with the condition that caused it.

What is kept in memory is safe to lose: when each instance was first missed from a list (a restart
starts the grace window again), the terminate attempts (a restart sends them again at once) and when
the last launch failed (a restart starts the probe interval again).

Tests reach the cloud edge through `wrap_provider`: a function that wraps each pool's provider
(failure injection, a crash right after a launch), so no test-only path lives here."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane import auth, telemetry
from control_plane.core import states as st
from control_plane.core.scaling import (
    DEFAULT_ARRIVAL_WINDOW,
    Arrival,
    InstanceView,
    PendingDemand,
    PoolLimits,
    ScaleDecision,
    backoff,
    decide,
)
from control_plane.core.scaling import reconcile as rec
from control_plane.core.scheduling.gang import whole_agent_parts
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
    describer,
)
from provisioners.capacity import cooldowns_of
from provisioners.factory import PoolConfigError, PoolProvider, build_provider

log = logging.getLogger("shipyard.autoscaler")

# The master's record of a listed instance follows the cloud's view of it while it runs. A listed
# instance that is not running any more (stopped, suspended, shutting down) is not gone yet: the
# master terminates it, and its row ends when the cloud says it is gone.
_RECORD_OF: dict[CloudState, InstanceState] = {
    CloudState.PENDING: InstanceState.STARTING,
    CloudState.RUNNING: InstanceState.RUNNING,
}
_DOWN_BY_CLOUD: dict[CloudState, str] = {
    CloudState.STOPPING: "the cloud reports it stopping or shutting down (not by this master)",
    CloudState.STOPPED: "the cloud reports it stopped or suspended (not by this master): its disks still bill",
    CloudState.TERMINATED: "the cloud reports it terminated (not by this master)",
}
# Prefixes of the pool errors that end with their cause (a list that works again, a provider that
# builds again); launch errors end with the backoff or a launch that goes through.
LIST_ERROR = "cannot list instances: "

# A `requested` row with no cloud instance after this long never launched (the master died
# before the call, or the call failed without an answer): it is closed, never re-sent.
REQUEST_GRACE = timedelta(minutes=3)

_NOT_ASKED = object()  # no lookup by id answered for an instance

UserDataRenderer = Callable[[str, str, str, "PoolProvider"], str]  # (pool, launch_id, token, provider) -> user-data
# (pool name, the pool's provider) -> the provider the autoscaler talks to. Tests wrap the cloud
# edge with it (failure injection); production passes none.
ProviderWrapper = Callable[[str, Provider], Provider]


@dataclass
class _Attempts:
    """Terminate calls sent for one instance by this process."""

    count: int = 0
    last_at: datetime | None = None
    last_error: str | None = None


@dataclass
class _Snapshot:
    """What the decider is given, read in one read-only transaction, and what the write needs of it."""

    demand: list[PendingDemand]
    shapes: dict[int, int]
    arrivals: list[Arrival]
    views: list[InstanceView]
    live: int
    stopping: list[tuple[str | None, datetime | None, str | None]]  # (instance id, since, reason)
    links: dict[str, str]  # launch id -> agent id, for rows not yet linked to their agent
    orphans: list[CloudInstance] = field(default_factory=list)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class _PoolState:
    provider: PoolProvider | None
    error: str | None = None
    # launch id -> when a list first missed its instance (in a row)
    first_missed: dict[str, datetime] = field(default_factory=dict)
    # instance id -> terminate attempts, for rows in `stopping` and orphans
    terminations: dict[str, _Attempts] = field(default_factory=dict)
    last_launch_failure_at: datetime | None = None

    def list_miss_grace(self) -> timedelta:
        assert self.provider is not None
        if self.provider.settings.list_miss_grace is not None:
            return self.provider.settings.list_miss_grace
        return timedelta(0) if self.provider.provider_type.consistent_list else rec.DEFAULT_LIST_MISS_GRACE


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
            telemetry.cloud_error(name, "list", e.kind.value)
            with transaction(self.master.sessions) as s:
                row = s.get(ResourcePool, name)
                if row is not None:
                    row.error = f"{LIST_ERROR}{e}"
            # Blind, but terminate is idempotent: what is being stopped keeps being asked to stop.
            self._send_terminations(name, state, [], now)
            return
        lookups = self._lookup_missing(name, pp, {ci.id for ci in cloud})
        with transaction(self.master.sessions) as s:
            orphans = self._reconcile(s, name, state, cloud, lookups, now)
        decision, launch_ids = self._decide(name, state, orphans, now)
        self._send_terminations(name, state, orphans, now)
        if launch_ids:
            self._launch(name, state, launch_ids)
        if decision.launch or decision.terminate:
            self.master.notify()

    # -- observe ---------------------------------------------------------------------------------
    def _lookup_missing(self, pool: str, pp: PoolProvider, listed: set[str]) -> dict[str, CloudInstance | None]:
        """Look up by id the instances of this pool's rows that the list did not show (outside any
        transaction: a cloud call). Empty when the provider cannot, or the lookup failed: the list
        miss then only counts toward the grace window."""
        lookup = describer(pp.provider)
        if lookup is None:
            return {}
        with self.master.sessions() as s:
            missing = [iid for iid in s.scalars(select(Instance.instance_id).where(
                Instance.pool == pool, Instance.state.in_(st.INSTANCE_BILLED), Instance.instance_id.is_not(None)))
                if iid is not None and iid not in listed]
        if not missing:
            return {}
        try:
            found = lookup.describe(missing)
        except Exception as e:  # ProviderError, or a provider bug: the grace window still applies
            log.warning("event=describe_failed pool=%s ids=%s error=%s", pool, missing, e)
            telemetry.cloud_error(pool, "describe", e.kind.value if isinstance(e, ProviderError) else "unknown")
            return {}
        log.info("event=described pool=%s %s", pool,
                 " ".join(f"{iid}={found[iid].state if found.get(iid) else 'not_found'}"
                          for iid in missing if iid in found))
        return found

    def _reconcile(self, s: Session, pool: str, state: _PoolState, cloud: list[CloudInstance],
                   lookups: dict[str, CloudInstance | None], now: datetime) -> list[CloudInstance]:
        """Bring the pool's rows in line with the cloud; the orphans (this cluster's tags, no live
        row), to be terminated."""
        prow = s.get(ResourcePool, pool)
        if prow is not None and prow.error is not None and (
                prow.error.startswith(LIST_ERROR) or prow.error.startswith(f"pool {pool!r} is not usable")):
            log.info("event=pool_error_cleared pool=%s error=%r", pool, prow.error)
            prow.error = None  # the list works again / the provider builds again
        rows = {r.launch_id: r for r in s.scalars(select(Instance).where(Instance.pool == pool))}
        by_instance_id = {r.instance_id: r for r in rows.values() if r.instance_id}
        seen: set[str] = set()
        orphans: list[CloudInstance] = []
        for ci in cloud:
            row = rows.get(ci.launch_id or "") or by_instance_id.get(ci.id)
            if row is None or row.state == InstanceState.TERMINATED:
                orphans.append(ci)
                continue
            seen.add(row.launch_id)
            self._observe(s, row, ci, now)
        grace = state.list_miss_grace()
        for row in rows.values():
            if row.launch_id in seen or row.state == InstanceState.TERMINATED:
                state.first_missed.pop(row.launch_id, None)
                continue
            if row.state == InstanceState.REQUESTED:
                # Else the launch may still be in flight, or have succeeded behind a lost answer
                # and not be listed yet: the row keeps its place under max_instances meanwhile.
                if now - row.requested_at >= max(REQUEST_GRACE, grace):
                    self._close_row(s, row, now, row.terminate_reason or "launch never confirmed")
                continue
            if row.instance_id is None:
                self._close_row(s, row, now, row.terminate_reason or "no instance was ever recorded for it")
                continue
            looked = lookups.get(row.instance_id, _NOT_ASKED)
            if isinstance(looked, CloudInstance) and looked.state != CloudState.TERMINATED:
                state.first_missed.pop(row.launch_id, None)
                self._observe(s, row, looked, now)
                continue
            lookup = (rec.Lookup.NOT_ASKED if looked is _NOT_ASKED else rec.Lookup.NOT_FOUND if looked is None
                      else rec.Lookup.TERMINATED)
            first = state.first_missed.setdefault(row.launch_id, now)
            verdict = rec.missing_instance(InstanceState(row.state), row.launched_at or row.requested_at, first,
                                           lookup, grace, now)
            if not verdict.gone:
                if first == now:
                    log.info("event=instance_missed pool=%s launch_id=%s instance_id=%s state=%s why=%r", pool,
                             row.launch_id, row.instance_id, row.state, verdict.reason)
                continue
            state.first_missed.pop(row.launch_id, None)
            log.info("event=instance_gone pool=%s launch_id=%s instance_id=%s state=%s evidence=%r", pool,
                     row.launch_id, row.instance_id, row.state, verdict.reason)
            self._close_row(s, row, now, row.terminate_reason
                            or f"instance disappeared from the cloud: {verdict.reason}")
        return orphans

    def _observe(self, s: Session, row: Instance, ci: CloudInstance, now: datetime) -> None:
        """The row follows what the cloud reports of its instance."""
        if row.instance_id is None:
            log.info("event=instance_adopted pool=%s launch_id=%s instance_id=%s", row.pool, row.launch_id, ci.id)
            if row.state == InstanceState.REQUESTED:
                row.terminate_reason = None  # an ambiguous launch failure that did launch
        row.instance_id = ci.id
        row.location = ci.location or row.location
        row.instance_type = ci.instance_type or row.instance_type
        row.private_ip = ci.private_ip
        row.launched_at = row.launched_at or ci.launched_at
        target = _RECORD_OF.get(ci.state)
        if target is not None:
            _instance_move(row, target)  # a row asked to stop stays stopping
        elif row.state != InstanceState.STOPPING:
            self._begin_termination(s, row, now, _DOWN_BY_CLOUD[ci.state])

    def _begin_termination(self, s: Session, row: Instance, now: datetime, reason: str) -> None:
        """`stopping` is committed before any terminate call; the call is (re)sent after the commit,
        on this tick and later ones, until the cloud says the instance is gone."""
        row.state = st.transition(InstanceState(row.state), InstanceState.STOPPING)
        row.terminate_requested_at = now
        row.terminate_reason = reason
        telemetry.terminated(row.pool, reason)
        agent = self._agent_of(s, row)
        if agent is not None:
            agent.enabled = False  # nothing new lands on an instance being terminated
        log.info("event=terminate_decided pool=%s launch_id=%s instance_id=%s reason=%r", row.pool, row.launch_id,
                 row.instance_id, reason)

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
    def _decide(self, pool: str, state: _PoolState, orphans: list[CloudInstance],
                now: datetime) -> tuple[ScaleDecision, list[str]]:
        """Read a snapshot (a read-only transaction), decide on it (pure), then apply the decision
        in a write transaction. Placement may commit in between: a termination that presumes the
        instance idle is applied only if its agent still holds no allocation, checked under a lock
        on the agent row (`_claim_idle`), and placement assigns only to an agent still enabled
        (control_plane/loops/placement.py), so neither overwrites what the other committed."""
        pp = state.provider
        assert pp is not None
        settings = pp.settings
        limits = PoolLimits(
            min_instances=settings.min_instances, max_instances=settings.max_instances,
            slots_per_instance=pp.slots_per_instance, max_idle_agent_period=settings.max_idle_agent_period,
            max_agent_starting_period=settings.max_agent_starting_period,
            max_disconnected_period=settings.max_disconnected_period,
            max_launch_per_decision=settings.max_launch_per_decision,
            arrival_window=settings.arrival_window or DEFAULT_ARRIVAL_WINDOW,
        )
        with self.master.read_sessions() as s:
            snap = self._snapshot(s, pool, orphans, limits, now, hysteresis=bool(settings.arrival_window))
        decision = decide(snap.demand, snap.views, limits, now, snap.arrivals)
        with transaction(self.master.sessions) as s:
            launch_ids = self._apply(s, pool, state, decision, snap, now)
        return decision, launch_ids

    def _snapshot(self, s: Session, pool: str, orphans: list[CloudInstance], limits: PoolLimits,
                  now: datetime, *, hysteresis: bool = True) -> _Snapshot:
        pending = list(s.scalars(select(Allocation).where(Allocation.pool == pool,
                                                           Allocation.state == st.ALLOC_PENDING)))
        shapes: dict[int, int] = {}
        for a in pending:
            # A gang larger than an instance goes on whole instances (core/scheduling/gang.py):
            # demand that many full instances; one that cannot be split stays unschedulable.
            parts = whole_agent_parts(a.slots_needed, limits.slots_per_instance)
            size = limits.slots_per_instance if parts is not None and parts > 1 else a.slots_needed
            shapes[size] = shapes.get(size, 0) + (parts if parts is not None and parts > 1 else 1)
        demand = [PendingDemand(slots, count) for slots, count in sorted(shapes.items())]
        # The demand arrivals of the window (every allocation created in it, whatever it became):
        # they predict the next one (scale-down hysteresis).
        arrivals = [] if not hysteresis else [Arrival(at, slots) for at, slots in s.execute(
            select(Allocation.created_at, Allocation.slots_needed).where(
                Allocation.pool == pool, Allocation.created_at > now - limits.arrival_window))]
        billed = list(s.scalars(select(Instance).where(Instance.pool == pool,
                                                        Instance.state.in_(st.INSTANCE_BILLED))))
        rows = [r for r in billed if r.state in st.INSTANCE_LIVE]
        stopping = [r for r in billed if r.state == InstanceState.STOPPING]
        busy: dict[str, int] = {}
        running: set[str] = set()  # agents with any task, zero-slot ones included
        for a in s.scalars(select(Allocation).where(Allocation.pool == pool, Allocation.state.in_(st.ALLOC_ON_AGENT))):
            busy[a.agent_id or ""] = busy.get(a.agent_id or "", 0) + a.slots_needed
            running.add(a.agent_id or "")
        views = []
        links: dict[str, str] = {}
        for row in rows:
            agent = self._agent_of(s, row)
            if agent is not None and row.agent_id is None:
                links[row.launch_id] = agent.id
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
        # Instances being stopped, and orphans, bill until the cloud says they are gone: they leave
        # no room under max_instances (never capacity).
        views += [InstanceView(id=r.launch_id, state=InstanceState.STOPPING, launched_at=r.launched_at or r.requested_at)
                  for r in stopping]
        views += [InstanceView(id=f"orphan:{ci.id}", state=InstanceState.STOPPING, launched_at=ci.launched_at)
                  for ci in orphans]
        return _Snapshot(demand=demand, shapes=shapes, arrivals=arrivals, views=views, live=len(rows),
                         stopping=[(r.instance_id, r.terminate_requested_at, r.terminate_reason) for r in stopping],
                         links=links, orphans=orphans)

    def _apply(self, s: Session, pool: str, state: _PoolState, decision: ScaleDecision, snap: _Snapshot,
               now: datetime) -> list[str]:
        pp = state.provider
        assert pp is not None
        settings = pp.settings
        prow = s.get(ResourcePool, pool)
        assert prow is not None
        launch = decision.launch
        reasons = list(decision.reasons)
        if state.last_launch_failure_at is None and prow.backoff_until is not None and prow.backoff_until > now:
            state.last_launch_failure_at = now  # restarted during a backoff: the probe interval starts again
        allowance = backoff.launch_allowance(PoolState(prow.state), prow.backoff_until, state.last_launch_failure_at,
                                             settings.launch_probe_interval, now)
        if launch and allowance.cap is not None and launch > allowance.cap:
            error = f" ({prow.error})" if prow.error and prow.state != PoolState.DISABLED else ""
            reasons.append(f"{'not launching' if allowance.cap == 0 else 'launch 1'}: {allowance.reason}{error}")
            launch = allowance.cap
        for launch_id, agent_id in snap.links.items():
            row = s.get(Instance, launch_id)
            if row is not None and row.agent_id is None:
                row.agent_id = agent_id
        terminated: list[dict[str, str]] = []
        planned = [(t, s.get(Instance, t.id)) for t in decision.terminate]
        # Agent rows are locked in agent id order, as placement takes them: no cycle of waits.
        for t, row in sorted(planned, key=lambda p: ((p[1].agent_id or "") if p[1] else "", p[0].id)):
            if row is None or row.state not in st.INSTANCE_LIVE:
                continue  # an orphan (its terminate is sent by _send_terminations), or ended meanwhile
            if t.presumes_idle:
                refused = self._claim_idle(s, row)
                if refused:
                    reasons.append(f"not terminating {t.id}: {refused}")
                    log.info("event=idle_termination_refused pool=%s launch_id=%s instance_id=%s decided=%r why=%r",
                             pool, row.launch_id, row.instance_id, t.reason, refused)
                    continue
            if row.instance_id is None:
                self._close_row(s, row, now, t.reason)
            else:
                self._begin_termination(s, row, now, t.reason)
            terminated.append({"id": t.id, "reason": t.reason})
        launch_ids: list[str] = []
        for _ in range(launch):
            launch_id = uuid.uuid4().hex
            s.add(Instance(launch_id=launch_id, pool=pool, provider=settings.type, state=InstanceState.REQUESTED,
                           requested_at=now))
            launch_ids.append(launch_id)
        # The backoff is over: the next launch tries again, and the error that caused it is history.
        new_state = backoff.current_state(PoolState(prow.state), prow.backoff_until, now)
        previous_error = None
        if new_state != prow.state and new_state == PoolState.OK and prow.error:
            previous_error, prow.error = prow.error, None
            log.info("event=pool_backoff_over pool=%s previous_error=%r", pool, previous_error)
        prow.state = new_state
        prow.last_decision = {
            "launch": launch, "terminate": terminated,
            "reasons": reasons, "pending": {str(k): v for k, v in snap.shapes.items()}, "instances": snap.live,
            "stopping": len(snap.stopping), "orphans": len(snap.orphans),
            "terminating": self._terminating(state, snap.stopping, snap.orphans, now),
            "backoff": None if prow.backoff_until is None or prow.backoff_until <= now else {
                "until": prow.backoff_until.isoformat(), "failures": prow.launch_failures,
                "probe": allowance.cap == 1,
                "next_probe_at": allowance.next_probe_at.isoformat() if allowance.next_probe_at else None,
            },
            **({"previous_error": previous_error} if previous_error else {}),
            # Subnets/zones skipped after capacity errors (provisioners/capacity.py), and the slots one
            # instance brings (what submissions and pending trials are checked against).
            "capacity": cooldowns_of(pp.provider), "slots_per_instance": pp.slots_per_instance,
        }
        prow.last_decision_at = now
        return launch_ids

    def _claim_idle(self, s: Session, row: Instance) -> str | None:
        """Whether the instance is still without work, decided under a lock on its agent's row; if
        so its agent is disabled in the same transaction (nothing new lands on it). The reason it is
        not, else. The lock (FOR UPDATE on PostgreSQL; SQLite's write transaction already holds the
        database) waits for a placement writing to that agent to commit, and the check for
        allocations runs after it, so it sees that placement's assignment."""
        agent_id = row.agent_id or (s.scalar(select(Agent.id).where(Agent.instance_id == row.instance_id))
                                    if row.instance_id else None)
        if agent_id is None:
            return None  # no agent: nothing can run there, and a stopping instance's agent is refused
        agent = s.scalar(select(Agent).where(Agent.id == agent_id).with_for_update()
                         .execution_options(populate_existing=True))
        if agent is None:
            return None
        held = s.scalar(select(func.count()).select_from(Allocation).where(
            Allocation.agent_id == agent.id, Allocation.state.in_(st.ALLOC_ON_AGENT)))
        if held:
            return f"its agent {agent.id} took {_plural(held, 'allocation')} since the decision"
        agent.enabled = False
        return None

    @staticmethod
    def _terminating(state: _PoolState, stopping: list[tuple[str | None, datetime | None, str | None]],
                     orphans: list[CloudInstance], now: datetime) -> list[dict[str, Any]]:
        """What `det resource-pool describe` shows of the terminations still waiting on the cloud."""
        out = []
        for iid, since, reason in [*stopping, *((ci.id, None, "orphan") for ci in orphans)]:
            if iid is None:
                continue
            attempts = state.terminations.get(iid, _Attempts())
            out.append({"instance_id": iid, "reason": reason, "since": since.isoformat() if since else None,
                        "attempts": attempts.count, "last_error": attempts.last_error,
                        "overdue": rec.terminate_overdue(since, now)})
        return out

    # -- act -------------------------------------------------------------------------------------
    def _launch(self, pool: str, state: _PoolState, launch_ids: list[str]) -> None:
        pp = state.provider
        assert pp is not None
        specs = []
        with transaction(self.master.sessions) as s:
            now = self.master.clock()
            for launch_id in launch_ids:
                token = auth.issue_token(s, auth.TokenKind.BOOTSTRAP, now=now, ttl=pp.settings.bootstrap_token_ttl,
                                         pool=pool, launch_id=launch_id)
                specs.append(LaunchSpec(launch_id, self.render_user_data(pool, launch_id, token, pp)))
        log.info("event=launching pool=%s count=%d", pool, len(specs))
        self.master.assert_leading()
        try:
            result = pp.provider.launch(specs)
            launched, error = list(result.launched), result.error
        except ProviderError as e:
            launched, error = [], e
        except Exception as e:  # a provider bug must not leave rows dangling forever
            launched, error = [], ProviderError(ErrorKind.UNKNOWN, f"{type(e).__name__}: {e}")
        telemetry.launched(pool, len(launch_ids), len(launched), error.kind.value if error is not None else None)
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
                elif error is not None and error.kind == ErrorKind.UNKNOWN:
                    # An ambiguous failure (a timeout, a lost answer, a provider bug): the cloud may
                    # have made the instance. The row stays `requested`, counted under max_instances,
                    # until a list shows the instance (adopted by its launch-id tag) or the request
                    # grace passes without it (closed by _reconcile).
                    row.terminate_reason = f"launch failed: {error}"
                    log.warning("event=launch_outcome_unknown pool=%s launch_id=%s error=%r", pool, launch_id,
                                str(error))
                elif error is not None:
                    self._close_row(s, row, now, f"launch failed: {error}")
            prow = s.get(ResourcePool, pool)
            assert prow is not None
            # What the launch learnt of each subnet/zone shows on the pool at once, not a tick later.
            prow.last_decision = {**(prow.last_decision or {}), "capacity": cooldowns_of(pp.provider)}
            if error is None:
                self._record_success(prow)
                state.last_launch_failure_at = None
                return
            self._record_error(prow, pp, error, now)
            state.last_launch_failure_at = now

    @staticmethod
    def _record_success(prow: ResourcePool) -> None:
        after = backoff.after_success(PoolState(prow.state))
        if prow.error:
            log.info("event=pool_error_cleared pool=%s error=%r", prow.name, prow.error)
        prow.error = None  # a launch went through: whatever stopped launches is over
        prow.state, prow.backoff_until, prow.launch_failures = after.state, after.backoff_until, after.failures

    @staticmethod
    def _record_error(prow: ResourcePool, pp: PoolProvider, error: ProviderError, now: datetime) -> None:
        settings = backoff.BackoffSettings(pp.settings.launch_error_backoff, pp.settings.launch_error_backoff_max)
        after = backoff.after_failure(PoolState(prow.state), prow.launch_failures, error.kind, error.scope, settings,
                                      now)
        prow.state, prow.backoff_until, prow.launch_failures = after.state, after.backoff_until, after.failures
        prow.error = f"{error} [{after.reason}]"
        telemetry.cloud_error(prow.name, "launch", error.kind.value)
        log.warning("event=launch_failed pool=%s kind=%s scope=%s failures=%d state=%s backoff_until=%s error=%r",
                    prow.name, error.kind.value, error.scope.value, after.failures, after.state.value,
                    after.backoff_until.isoformat() if after.backoff_until else None, str(error))

    def _send_terminations(self, pool: str, state: _PoolState, orphans: list[CloudInstance], now: datetime) -> None:
        """Send the terminate call for every instance still to be terminated whose retry is due: rows
        in `stopping` (committed before this call, so a crash here is healed by the next tick) and
        orphans. Every attempt and failure is logged with its cause; the attempts grow their interval
        up to a bound (control_plane/core/scaling/reconcile.py) and never stop while the cloud has
        the instance."""
        pp = state.provider
        assert pp is not None
        with self.master.sessions() as s:
            stopping = [(r.instance_id, r.terminate_reason or "", r.terminate_requested_at)
                        for r in s.scalars(select(Instance).where(Instance.pool == pool,
                                                                  Instance.state == InstanceState.STOPPING))
                        if r.instance_id]
        wanted: dict[str, tuple[str, datetime | None]] = {
            iid: (reason, since) for iid, reason, since in stopping if iid is not None}
        orphan_ids = {ci.id for ci in orphans}
        for iid in orphan_ids:
            wanted.setdefault(iid, ("orphan: carries this cluster's tags but the master has no record", None))
        for iid in list(state.terminations):
            if iid not in wanted:
                del state.terminations[iid]  # gone (or its row ended): nothing left to retry
        due = [iid for iid in wanted
               if rec.terminate_due(state.terminations.get(iid, _Attempts()).count,
                                    state.terminations.get(iid, _Attempts()).last_at, now)]
        if not due:
            return
        for iid in due:
            attempts = state.terminations.setdefault(iid, _Attempts())
            attempts.count += 1
            attempts.last_at = now
            reason, since = wanted[iid]
            if attempts.count == 1 and iid in orphan_ids:
                telemetry.terminated(pool, reason)  # an orphan's termination is decided here, not by a row
            level = logging.WARNING if rec.terminate_overdue(since, now) else logging.INFO
            log.log(level, "event=terminate_sent pool=%s instance_id=%s attempt=%d since=%s overdue=%s reason=%r",
                    pool, iid, attempts.count, since.isoformat() if since else None,
                    rec.terminate_overdue(since, now), reason)
        self.master.assert_leading()
        try:
            pp.provider.terminate(due)
        except Exception as e:  # ProviderError, or a provider bug: either way the next attempt comes
            error = str(e) if isinstance(e, ProviderError) else f"{type(e).__name__}: {e}"
            telemetry.cloud_error(pool, "terminate", e.kind.value if isinstance(e, ProviderError) else "unknown")
            for iid in due:
                attempts = state.terminations[iid]
                attempts.last_error = error
                log.warning("event=terminate_failed pool=%s instance_id=%s attempt=%d next_attempt_at=%s error=%r",
                            pool, iid, attempts.count,
                            (now + rec.terminate_retry_delay(attempts.count)).isoformat(), error)
            return
        for iid in due:
            state.terminations[iid].last_error = None
        if orphan_ids & set(due):
            log.info("event=orphans_terminated pool=%s ids=%s", pool, sorted(orphan_ids & set(due)))

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
            state = self._pool(name)
            if state.provider is None:
                continue
            try:
                cloud = state.provider.provider.list()
            except ProviderError as e:
                # Blind: the rows are still stopped, and the instances without a row wait for the
                # orphan sweep of a tick whose list works.
                log.warning("event=teardown_list_failed pool=%s error=%s", name, e)
                cloud = []
            reason = "cluster or pool taken down"
            with transaction(self.master.sessions) as s:
                now = self.master.clock()
                rows = list(s.scalars(select(Instance).where(Instance.pool == name,
                                                              Instance.state != InstanceState.TERMINATED)))
                by_launch = {r.launch_id: r for r in rows}
                by_instance = {r.instance_id: r for r in rows if r.instance_id}
                orphans = []
                for ci in cloud:
                    row = by_launch.get(ci.launch_id or "") or by_instance.get(ci.id)
                    if row is None:
                        orphans.append(ci)
                    elif row.instance_id is None:
                        row.instance_id = ci.id  # adopted: its termination is followed like the others
                for row in rows:
                    if row.instance_id is None:
                        self._close_row(s, row, now, reason)
                        continue
                    if row.state != InstanceState.STOPPING:
                        self._begin_termination(s, row, now, reason)
                    agent = self._agent_of(s, row)
                    if agent is not None:
                        allocations.end_agent_allocations(s, self.master, agent.id, st.CAUSE_INSTANCE_TERMINATED,
                                                          f"instance {row.instance_id} is being terminated: {reason}")
                    state.terminations.pop(row.instance_id, None)  # sent now, whatever was due
                    count += 1
            for ci in orphans:
                state.terminations.pop(ci.id, None)
            count += len(orphans)
            self._send_terminations(name, state, orphans, now)
        log.info("event=teardown pools=%s instances_terminating=%d", pool or "all", count)
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
