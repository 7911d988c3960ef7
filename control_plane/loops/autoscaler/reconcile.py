"""Observe: bring a pool's instance rows in line with what the cloud lists (and, for rows the list
missed, what a lookup by id says). A listed instance whose launch id matches a row is adopted (a
crash between launch and record heals without a duplicate launch); one with this cluster's tags and
no live row is an orphan, returned to be terminated; a row whose instance vanished ends when the
cloud says so by id or after the pool's `list_miss_grace` (control_plane/core/scaling/reconcile.py
has the rules); an instance the cloud reports stopped, suspended or shutting down is terminated,
unless the master parked it in the pool's warm pool (warm.py)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import telemetry
from control_plane.core import states as st
from control_plane.core.scaling import reconcile as rec
from control_plane.core.states import InstanceState
from control_plane.db.models import Instance, ResourcePool
from control_plane.loops.autoscaler import types, warm
from control_plane.loops.autoscaler.memory import PoolMemory
from control_plane.loops.autoscaler.records import begin_termination, close_row, instance_move
from control_plane.master import Master
from provisioners.base import CloudInstance, CloudState, ProviderError, describer
from provisioners.factory import PoolProvider

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


def lookup_missing(master: Master, pool: str, pp: PoolProvider, listed: set[str]) -> dict[str, CloudInstance | None]:
    """Look up by id the instances of this pool's rows that the list did not show (outside any
    transaction: a cloud call). Empty when the provider cannot, or the lookup failed: the list
    miss then only counts toward the grace window."""
    lookup = describer(pp.provider)
    if lookup is None:
        return {}
    with master.sessions() as s:
        missing = [iid for iid in s.scalars(select(Instance.instance_id).where(
            Instance.pool == pool, Instance.state.in_(st.INSTANCE_KEPT), Instance.instance_id.is_not(None)))
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


def reconcile(s: Session, master: Master, pool: str, memory: PoolMemory, cloud: list[CloudInstance],
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
        observe(s, row, ci, now)
    grace = memory.list_miss_grace()
    for row in rows.values():
        if row.launch_id in seen or row.state == InstanceState.TERMINATED:
            memory.first_missed.pop(row.launch_id, None)
            continue
        _settle_unlisted(s, master, pool, memory, row, lookups, grace, now)
    return orphans


def _settle_unlisted(s: Session, master: Master, pool: str, memory: PoolMemory, row: Instance,
                     lookups: dict[str, CloudInstance | None], grace: timedelta, now: datetime) -> None:
    """A live row whose instance the list did not show: kept while its launch may be in flight, or
    while the miss is not yet proof; closed once the lookup or the grace window says it is gone."""
    if row.state == InstanceState.REQUESTED:
        # Else the launch may still be in flight, or have succeeded behind a lost answer
        # and not be listed yet: the row keeps its place under max_instances meanwhile.
        if now - row.requested_at >= max(REQUEST_GRACE, grace):
            close_row(s, master, row, now, row.terminate_reason or "launch never confirmed")
        return
    if row.instance_id is None:
        close_row(s, master, row, now, row.terminate_reason or "no instance was ever recorded for it")
        return
    looked = lookups.get(row.instance_id, _NOT_ASKED)
    if isinstance(looked, CloudInstance) and looked.state != CloudState.TERMINATED:
        memory.first_missed.pop(row.launch_id, None)
        observe(s, row, looked, now)
        return
    lookup = (rec.Lookup.NOT_ASKED if looked is _NOT_ASKED else rec.Lookup.NOT_FOUND if looked is None
              else rec.Lookup.TERMINATED)
    first = memory.first_missed.setdefault(row.launch_id, now)
    verdict = rec.missing_instance(InstanceState(row.state), row.launched_at or row.requested_at, first,
                                   lookup, grace, now)
    if not verdict.gone:
        if first == now:
            log.info("event=instance_missed pool=%s launch_id=%s instance_id=%s state=%s why=%r", pool,
                     row.launch_id, row.instance_id, row.state, verdict.reason)
        return
    memory.first_missed.pop(row.launch_id, None)
    log.info("event=instance_gone pool=%s launch_id=%s instance_id=%s state=%s evidence=%r", pool,
             row.launch_id, row.instance_id, row.state, verdict.reason)
    close_row(s, master, row, now, row.terminate_reason
              or f"instance disappeared from the cloud: {verdict.reason}")


def observe(s: Session, row: Instance, ci: CloudInstance, now: datetime) -> None:
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
    if ci.spot and not row.capacity:
        row.capacity = types.SPOT  # adopted after a crash: never parked as if on demand
    if warm.observe(s, row, ci, now):
        return  # the warm pool's own states (warm.py)
    target = _RECORD_OF.get(ci.state)
    if target is not None:
        instance_move(row, target)  # a row asked to stop stays stopping
    elif row.state != InstanceState.STOPPING:
        begin_termination(s, row, now, _DOWN_BY_CLOUD[ci.state])
