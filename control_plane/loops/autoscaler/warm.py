"""The warm pool's side of the autoscaler (`warm_pool_size`): what the decider is told of parked
instances, how its parks and starts are written, the stop and start calls that follow them, and how
a parked row follows what the cloud reports.

* Park: an idle on-demand instance the decider would terminate for idleness is parked while the
  warm pool has room. Like an idle termination it is applied only if `claim_idle` agrees (its agent,
  disabled in the same transaction, holds nothing); the row moves to `parking` (committed before
  the stop call), then to `parked` once the cloud reports the instance stopped. The stop is sent
  again, at growing intervals, while the cloud still reports it running.
* Start: a parked instance is started instead of a launch. The row moves to `starting` with
  `resumed_at` (the decider then treats it as a launch made at that time: its agent must connect
  within max_agent_starting_period), its agent is enabled again, and the start call follows the
  commit; it is sent again while the cloud still reports the instance stopped. A start the cloud
  refuses for good (no capacity in its zone, the instance gone) terminates the row: the next
  decision launches elsewhere; so does a stop the cloud refuses for good (an instance that cannot be
  stopped: it is terminated, as it would have been without a warm pool).
* A parked instance bills its disks: it is accounted for (listed, looked up, terminated by a
  teardown) until the cloud says it is gone, and terminated past `warm_pool_max_age`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import telemetry
from control_plane.core import states as st
from control_plane.core.scaling import InstanceView, ScaleDecision
from control_plane.core.scaling import reconcile as rec
from control_plane.core.states import InstanceState
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Instance
from control_plane.loops.autoscaler import types
from control_plane.loops.autoscaler.memory import Attempts, PoolMemory
from control_plane.loops.autoscaler.records import agent_of, begin_termination, instance_move
from control_plane.master import Master
from control_plane.services import scaling_history
from provisioners.base import CloudInstance, CloudState, ErrorKind, ProviderError, parker

log = logging.getLogger("shipyard.autoscaler")

#: How many of the pool's most recent starts from the warm pool the idle stage is given.
START_SAMPLES = 20
CAUSE_PARK = "park"
WARM_CAPACITY = "warm pool"  # a start's "capacity" in the scaling history


def start_times(s: Session, pool: str) -> tuple[timedelta, ...]:
    """Start to agent registered again, of the pool's most recent starts from the warm pool."""
    rows = s.execute(select(Instance.resumed_at, Instance.resume_connected_at).where(
        Instance.pool == pool, Instance.resumed_at.is_not(None), Instance.resume_connected_at.is_not(None))
        .order_by(Instance.resumed_at.desc()).limit(START_SAMPLES))
    return tuple(connected - started for started, connected in rows if connected >= started)


def parked_view(row: Instance) -> InstanceView:
    return InstanceView(id=row.launch_id, state=InstanceState(row.state),
                        launched_at=row.launched_at or row.requested_at, instance_type=row.instance_type or "",
                        spot=row.capacity == types.SPOT, parked_at=row.parked_at or row.launched_at or row.requested_at)


def resumed(row: Instance) -> bool:
    """Started from the warm pool and its agent not registered since: booting, as a launch."""
    return (row.state in (InstanceState.STARTING, InstanceState.RUNNING) and row.resumed_at is not None
            and (row.resume_connected_at is None or row.resume_connected_at < row.resumed_at))


def apply(s: Session, decision: ScaleDecision, reasons: list[str], now: datetime,
          claims: dict[str, str | None]) -> tuple[list[dict[str, str]], list[tuple[str, str]]]:
    """Write the decided parks (each only if its instance was claimed idle: `claims`, launch id ->
    why not, or None) and starts. As the history records them: the parks as instances leaving
    service (cause "park"), the starts as instances coming (their type, capacity "warm pool")."""
    done: list[dict[str, str]] = []
    started: list[tuple[str, str]] = []
    for action in sorted(decision.park, key=lambda a: a.id):
        row = s.get(Instance, action.id)
        if row is None or row.state != InstanceState.RUNNING or not row.instance_id:
            continue
        refused = claims.get(action.id, "it is no longer live")
        if refused:
            reasons.append(f"not parking {action.id}: {refused}")
            continue
        row.state = st.transition(InstanceState(row.state), InstanceState.PARKING)
        row.parked_at = now
        log.info("event=park_decided pool=%s launch_id=%s instance_id=%s reason=%r", row.pool, row.launch_id,
                 row.instance_id, action.reason)
        done.append({"id": action.id, "reason": action.reason, "cause": CAUSE_PARK})
    for action in decision.start:
        row = s.get(Instance, action.id)
        if row is None or row.state != InstanceState.PARKED:
            continue
        row.state = st.transition(InstanceState(row.state), InstanceState.STARTING)
        row.resumed_at = now
        agent = agent_of(s, row)
        if agent is not None:
            agent.enabled = True  # disabled when it was parked (claim_idle)
            agent.idle_since = now
            _disconnected(agent, now)  # nothing lands on it before it registers again
        log.info("event=start_decided pool=%s launch_id=%s instance_id=%s", row.pool, row.launch_id, row.instance_id)
        started.append((row.instance_type or "", WARM_CAPACITY))
    return done, started


def _disconnected(agent: Agent, now: datetime) -> None:
    """A powered-off instance's agent is gone, whether or not its heartbeats have timed out yet."""
    if agent.state == st.AgentState.CONNECTED:
        agent.state = st.AgentState.DISCONNECTED
        agent.disconnected_at = now


def observe(s: Session, row: Instance, ci: CloudInstance, now: datetime) -> bool:
    """The warm pool's rules for a listed instance; whether they applied (else the usual ones do).
    Parking: parked once the cloud reports it stopped (its agent is gone then), and kept parking while
    it is stopping or still running (the stop is sent again). Parked: stays parked while stopped;
    reported running (started by someone else, or a lagging list), it is parking again: the master
    starts a parked instance only for work, and stops it otherwise. Started by the master and still
    stopped or stopping at the cloud: stays starting (the start is sent again)."""
    if row.state == InstanceState.PARKING:
        if ci.state == CloudState.STOPPED:
            instance_move(row, InstanceState.PARKED)
            agent = agent_of(s, row)
            if agent is not None:
                _disconnected(agent, now)
            return True
        return ci.state in (CloudState.STOPPING, CloudState.RUNNING, CloudState.PENDING)
    if row.state == InstanceState.PARKED:
        if ci.state in (CloudState.RUNNING, CloudState.PENDING):
            log.warning("event=parked_instance_running pool=%s launch_id=%s instance_id=%s: not started by the "
                        "master, stopped again", row.pool, row.launch_id, row.instance_id)
            instance_move(row, InstanceState.PARKING)
            row.parked_at = now  # it ran meanwhile: parked (and its stop timed) from now
        return ci.state in (CloudState.STOPPED, CloudState.STOPPING, CloudState.RUNNING, CloudState.PENDING)
    return resumed(row) and ci.state in (CloudState.STOPPED, CloudState.STOPPING)


def send(master: Master, pool: str, memory: PoolMemory, cloud: list[CloudInstance], now: datetime) -> None:
    """The stop calls due for parking rows whose instance the cloud still reports running, and the
    start calls due for started rows whose instance it still reports stopped. A start refused for
    good (no capacity there, the instance gone, not allowed), a stop refused for good (it cannot be
    stopped), and a stop that has not taken effect within TERMINATE_OVERDUE of the first call (the
    instance running, billing, its agent disabled) terminate the row."""
    pp = memory.provider
    assert pp is not None
    calls = parker(pp.provider)
    if calls is None:
        return
    listed = {ci.id: ci.state for ci in cloud}
    with master.sessions() as s:
        rows = list(s.scalars(select(Instance).where(
            Instance.pool == pool, Instance.instance_id.is_not(None),
            Instance.state.in_((InstanceState.PARKING, InstanceState.STARTING, InstanceState.RUNNING)))))
        stopping = [r for r in rows if r.state == InstanceState.PARKING
                    and listed.get(r.instance_id or "") in (CloudState.RUNNING, CloudState.PENDING)]
        # Still running TERMINATE_OVERDUE after the park was decided (the record's time, not this
        # process's memory): the stop is not taking effect.
        late = {r.instance_id for r in stopping if r.parked_at is not None and now - r.parked_at > rec.TERMINATE_OVERDUE}
        to_stop = [r.instance_id for r in stopping]
        to_start = [r.instance_id for r in rows if resumed(r) and listed.get(r.instance_id or "") == CloudState.STOPPED]
    for attempts in (memory.parking, memory.starting):
        for iid in [i for i in attempts if i not in set(to_stop) | set(to_start)]:
            del attempts[iid]
    master.assert_leading()
    minutes = int(rec.TERMINATE_OVERDUE.total_seconds() // 60)
    overdue = {iid: f"stop for the warm pool not done {minutes}m after the park"
               + (f" (last error: {a.last_error})" if (a := memory.parking.get(iid)) and a.last_error else "")
               for iid in late if iid}
    to_stop = [i for i in to_stop if i not in overdue]
    # One call per instance: a refusal names the one it is about.
    refused = overdue | {iid: f"stop for the warm pool refused: {error}"
               for iid in _due(memory.parking, [i for i in to_stop if i], now)
               if (error := _call(pool, "stop", calls.stop, [iid], memory.parking[iid])) is not None}
    refused |= {iid: f"start from the warm pool failed: {error}"
                for iid in _due(memory.starting, [i for i in to_start if i], now)
                if (error := _call(pool, "start", calls.start, [iid], memory.starting[iid])) is not None}
    if refused:
        _terminate_refused(master, pool, refused, now)


def _terminate_refused(master: Master, pool: str, refused: dict[str, str], now: datetime) -> None:
    """A stop or start the cloud refused for good: the instance is terminated (the next decision
    launches for the work it was started for), with the refusal as its reason."""
    with transaction(master.sessions) as s:
        ended = []
        for row in s.scalars(select(Instance).where(Instance.pool == pool, Instance.instance_id.in_(refused))):
            if row.state == InstanceState.PARKING or resumed(row):
                reason = refused[row.instance_id or ""]
                begin_termination(s, row, now, reason)
                ended.append({"id": row.launch_id, "reason": reason, "cause": scaling_history.CAUSE_DECIDER})
        scaling_history.record_decision(s, pool, now, scaling_history.retention_of(master.config), launches=(),
                                        terminated=ended, reasons=[f"terminate {t['id']}: {t['reason']}" for t in ended])


def _due(attempts: dict[str, Attempts], ids: list[str], now: datetime) -> list[str]:
    due = [i for i in ids if rec.terminate_due(attempts.get(i, Attempts()).count, attempts.get(i, Attempts()).last_at,
                                               now)]
    for iid in due:
        a = attempts.setdefault(iid, Attempts())
        a.count, a.last_at = a.count + 1, now
    return due


def _call(pool: str, what: str, call: Callable[[Sequence[str]], None], ids: list[str],
          attempts: Attempts) -> str | None:
    """One stop or start call; the error when the cloud refused it for good (a stop: the instance
    cannot be stopped, INVALID; a start: no capacity there, the instance gone, or not allowed: a
    launch may still be). Other failures are logged (and kept in `attempts`), and the call comes
    again."""
    if not ids:
        return None
    log.info("event=%s_sent pool=%s instance_ids=%s", what, pool, ids)
    try:
        call(ids)
    except Exception as e:  # ProviderError, or a provider bug: the next attempt comes
        kind = e.kind if isinstance(e, ProviderError) else ErrorKind.UNKNOWN
        telemetry.cloud_error(pool, what, kind.value)
        log.warning("event=%s_failed pool=%s instance_ids=%s kind=%s error=%r", what, pool, ids, kind.value, str(e))
        attempts.last_error = str(e)
        if kind is ErrorKind.INVALID or (what == "start" and kind in (ErrorKind.CAPACITY, ErrorKind.AUTH)):
            return str(e)
        return None
    attempts.last_error = None
    return None
