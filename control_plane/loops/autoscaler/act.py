"""Act: the cloud calls a decision leads to, and what their outcomes write. Launches (a bootstrap
token and user-data per `requested` row, one provider call, each row then following its instance;
the outcome backs the pool off or clears its error) and terminations (re-sent with a bounded,
growing interval until the cloud says the instance is gone). Every call follows a committed row:
a crash in between is healed by the next tick."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import auth, telemetry
from control_plane.core import states as st
from control_plane.core.scaling import InstanceOption, backoff
from control_plane.core.scaling import reconcile as rec
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Instance, ResourcePool
from control_plane.loops.autoscaler import types
from control_plane.loops.autoscaler.memory import Attempts, PoolMemory
from control_plane.loops.autoscaler.records import agent_of, begin_termination, close_row, instance_move
from control_plane.master import Master
from control_plane.services import allocations
from provisioners.base import CloudInstance, CloudState, ErrorKind, LaunchSpec, ProviderError, offers_of
from provisioners.capacity import cooldowns_of
from provisioners.factory import PoolProvider

log = logging.getLogger("shipyard.autoscaler")

UserDataRenderer = Callable[[str, str, str, "PoolProvider"], str]  # (pool, launch_id, token, provider) -> user-data

ORPHAN_REASON = "orphan: carries this cluster's tags but the master has no record"


def launch(master: Master, pool: str, memory: PoolMemory, launch_ids: list[str],
           render_user_data: UserDataRenderer) -> None:
    """Launch one instance per `requested` row (its launch id the cloud's idempotency key), then
    record what came of it."""
    pp = memory.provider
    assert pp is not None
    specs = []
    offers = offers_of(pp.provider)
    with transaction(master.sessions) as s:
        now = master.clock()
        for launch_id in launch_ids:
            token = auth.issue_token(s, auth.TokenKind.BOOTSTRAP, now=now, ttl=pp.settings.bootstrap_token_ttl,
                                     pool=pool, launch_id=launch_id)
            row = s.get(Instance, launch_id)
            # The type the decision chose, then the next-cheapest that fit (capacity failover).
            choices = types.choices_for(offers, row.instance_type, row.capacity) if row is not None else ()
            specs.append(LaunchSpec(launch_id, render_user_data(pool, launch_id, token, pp), choices))
    log.info("event=launching pool=%s count=%d", pool, len(specs))
    master.assert_leading()
    try:
        result = pp.provider.launch(specs)
        launched, error = list(result.launched), result.error
    except ProviderError as e:
        launched, error = [], e
    except Exception as e:  # a provider bug must not leave rows dangling forever
        launched, error = [], ProviderError(ErrorKind.UNKNOWN, f"{type(e).__name__}: {e}")
    telemetry.launched(pool, len(launch_ids), len(launched), error.kind.value if error is not None else None)
    with transaction(master.sessions) as s:
        now = master.clock()
        _record_launched(s, master, pool, launch_ids, launched, error, now, types.options_of(pp.provider))
        prow = s.get(ResourcePool, pool)
        assert prow is not None
        # What the launch learnt of each subnet/zone shows on the pool at once, not a tick later.
        prow.last_decision = {**(prow.last_decision or {}), "capacity": cooldowns_of(pp.provider)}
        if error is None:
            record_success(prow)
            memory.last_launch_failure_at = None
            return
        record_error(prow, pp, error, now)
        memory.last_launch_failure_at = now


def _record_launched(s: Session, master: Master, pool: str, launch_ids: list[str], launched: list[CloudInstance],
                     error: ProviderError | None, now: datetime, options: tuple[InstanceOption, ...] = ()) -> None:
    """Each requested row follows its launch: the instance it got, or kept `requested` after an
    ambiguous failure, or closed after a definite one."""
    got = {ci.launch_id: ci for ci in launched}
    for launch_id in launch_ids:
        row = s.get(Instance, launch_id)
        if row is None:
            continue
        ci = got.get(launch_id)
        if ci is not None:
            # A row closed meanwhile (the pool torn down) stays closed: the instance is an
            # orphan to the next tick, which terminates it.
            if not instance_move(row, InstanceState.RUNNING if ci.state == CloudState.RUNNING
                                 else InstanceState.STARTING):
                continue
            row.instance_id = ci.id
            row.launched_at = ci.launched_at
            row.location = ci.location
            row.instance_type = types.recorded_type(options, ci.instance_type)
            row.capacity = types.SPOT if ci.spot else types.ON_DEMAND
            row.private_ip = ci.private_ip
        elif error is not None and error.kind == ErrorKind.UNKNOWN:
            # An ambiguous failure (a timeout, a lost answer, a provider bug): the cloud may
            # have made the instance. The row stays `requested`, counted under max_instances,
            # until a list shows the instance (adopted by its launch-id tag) or the request
            # grace passes without it (closed by the reconciliation).
            row.terminate_reason = f"launch failed: {error}"
            log.warning("event=launch_outcome_unknown pool=%s launch_id=%s error=%r", pool, launch_id,
                        str(error))
        elif error is not None:
            close_row(s, master, row, now, f"launch failed: {error}")


def record_success(prow: ResourcePool) -> None:
    after = backoff.after_success(PoolState(prow.state))
    if prow.error:
        log.info("event=pool_error_cleared pool=%s error=%r", prow.name, prow.error)
    prow.error = None  # a launch went through: whatever stopped launches is over
    prow.state, prow.backoff_until, prow.launch_failures = after.state, after.backoff_until, after.failures


def record_error(prow: ResourcePool, pp: PoolProvider, error: ProviderError, now: datetime) -> None:
    settings = backoff.BackoffSettings(pp.settings.launch_error_backoff, pp.settings.launch_error_backoff_max)
    after = backoff.after_failure(PoolState(prow.state), prow.launch_failures, error.kind, error.scope, settings,
                                  now)
    prow.state, prow.backoff_until, prow.launch_failures = after.state, after.backoff_until, after.failures
    prow.error = f"{error} [{after.reason}]"
    telemetry.cloud_error(prow.name, "launch", error.kind.value)
    log.warning("event=launch_failed pool=%s kind=%s scope=%s failures=%d state=%s backoff_until=%s error=%r",
                prow.name, error.kind.value, error.scope.value, after.failures, after.state.value,
                after.backoff_until.isoformat() if after.backoff_until else None, str(error))


def send_terminations(master: Master, pool: str, memory: PoolMemory, orphans: list[CloudInstance],
                      now: datetime) -> None:
    """Send the terminate call for every instance still to be terminated whose retry is due: rows
    in `stopping` (committed before this call, so a crash here is healed by the next tick) and
    orphans. Every attempt and failure is logged with its cause; the attempts grow their interval
    up to a bound (control_plane/core/scaling/reconcile.py) and never stop while the cloud has
    the instance."""
    pp = memory.provider
    assert pp is not None
    orphan_ids = {ci.id for ci in orphans}
    wanted = _to_terminate(master, pool, orphan_ids)
    for iid in list(memory.terminations):
        if iid not in wanted:
            del memory.terminations[iid]  # gone (or its row ended): nothing left to retry
    due = [iid for iid in wanted
           if rec.terminate_due(memory.terminations.get(iid, Attempts()).count,
                                memory.terminations.get(iid, Attempts()).last_at, now)]
    if not due:
        return
    for iid in due:
        attempts = memory.terminations.setdefault(iid, Attempts())
        attempts.count += 1
        attempts.last_at = now
        reason, since = wanted[iid]
        if attempts.count == 1 and iid in orphan_ids:
            telemetry.terminated(pool, reason)  # an orphan's termination is decided here, not by a row
        level = logging.WARNING if rec.terminate_overdue(since, now) else logging.INFO
        log.log(level, "event=terminate_sent pool=%s instance_id=%s attempt=%d since=%s overdue=%s reason=%r",
                pool, iid, attempts.count, since.isoformat() if since else None,
                rec.terminate_overdue(since, now), reason)
    master.assert_leading()
    try:
        pp.provider.terminate(due)
    except Exception as e:  # ProviderError, or a provider bug: either way the next attempt comes
        error = str(e) if isinstance(e, ProviderError) else f"{type(e).__name__}: {e}"
        telemetry.cloud_error(pool, "terminate", e.kind.value if isinstance(e, ProviderError) else "unknown")
        for iid in due:
            attempts = memory.terminations[iid]
            attempts.last_error = error
            log.warning("event=terminate_failed pool=%s instance_id=%s attempt=%d next_attempt_at=%s error=%r",
                        pool, iid, attempts.count,
                        (now + rec.terminate_retry_delay(attempts.count)).isoformat(), error)
        return
    for iid in due:
        memory.terminations[iid].last_error = None
    if orphan_ids & set(due):
        log.info("event=orphans_terminated pool=%s ids=%s", pool, sorted(orphan_ids & set(due)))


def _to_terminate(master: Master, pool: str, orphan_ids: set[str]) -> dict[str, tuple[str, datetime | None]]:
    """Instance id -> (reason, since) of what is to be terminated: rows in `stopping`, then orphans."""
    with master.sessions() as s:
        stopping = [(r.instance_id, r.terminate_reason or "", r.terminate_requested_at)
                    for r in s.scalars(select(Instance).where(Instance.pool == pool,
                                                              Instance.state == InstanceState.STOPPING))
                    if r.instance_id]
    wanted: dict[str, tuple[str, datetime | None]] = {
        iid: (reason, since) for iid, reason, since in stopping if iid is not None}
    for iid in orphan_ids:
        wanted.setdefault(iid, (ORPHAN_REASON, None))
    return wanted


def stop_for_teardown(s: Session, master: Master, pool: str, memory: PoolMemory, cloud: list[CloudInstance],
                      reason: str, now: datetime) -> tuple[int, list[CloudInstance]]:
    """Teardown's write: every live row of the pool moves to `stopping` (or ends, with no instance
    yet), the allocations on them end, and their terminate is due at once. How many rows, and the
    orphans (listed with this cluster's tags, no row): the caller makes theirs due."""
    count = 0
    rows = list(s.scalars(select(Instance).where(Instance.pool == pool, Instance.state != InstanceState.TERMINATED)))
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
            close_row(s, master, row, now, reason)
            continue
        if row.state != InstanceState.STOPPING:
            begin_termination(s, row, now, reason)
        agent = agent_of(s, row)
        if agent is not None:
            allocations.end_agent_allocations(s, master, agent.id, st.ExitCause.INSTANCE_TERMINATED,
                                              f"instance {row.instance_id} is being terminated: {reason}")
        memory.terminations.pop(row.instance_id, None)  # sent now, whatever was due
        count += 1
    return count, orphans
