"""GET /metrics: the Prometheus text format.

Two parts: what the processes counted in memory (control_plane/telemetry.py: requests, loop ticks,
launches, terminations, cloud errors, leadership; every process's, added up, in multiprocess mode),
then the cluster as the record says it now (services/telemetry_snapshot.py: slots, queues,
instances), read once per scrape by whichever process answers it.

Unauthenticated, as scrapers expect (master.yaml `metrics_enabled: false` removes the route): no
label or value carries a secret, a token or a username. It takes a slot in the users' admission lane
like any request that reads the database."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.exc import SQLAlchemyError

from control_plane import telemetry
from control_plane.master import Master
from control_plane.services.telemetry_snapshot import pool_snapshots

log = logging.getLogger("shipyard.api")

router = APIRouter()


class ClusterCollector:
    """The record's view of each pool, read at scrape time (a prometheus_client collector)."""

    def __init__(self, master: Master) -> None:
        self.master = master

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("shipyard_cluster_snapshot_up", "1 if this scrape could read the cluster's state "
                               "from the database.")
        try:
            with self.master.read_sessions() as s:
                pools = pool_snapshots(s, [p.name for p in self.master.config.resource_pools], self.master.clock())
        except SQLAlchemyError as e:
            log.warning("event=metrics_snapshot_failed error=%s", type(e).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        families = {
            "slots": GaugeMetricFamily("shipyard_pool_slots", "Slots of the pool's connected agents.",
                                       labels=["pool"]),
            "used": GaugeMetricFamily("shipyard_pool_slots_used", "Slots held by allocations placed on agents.",
                                      labels=["pool"]),
            "queue": GaugeMetricFamily("shipyard_pool_queue_length", "Allocations waiting for placement.",
                                       labels=["pool"]),
            "wait": GaugeMetricFamily("shipyard_pool_queue_oldest_wait_seconds",
                                      "How long the oldest waiting allocation has waited (0 when none waits).",
                                      labels=["pool"]),
            "instances": GaugeMetricFamily("shipyard_pool_instances", "Instances not yet terminated, by state.",
                                           labels=["pool", "state"]),
        }
        for p in pools:
            families["slots"].add_metric([p.pool], p.slots_total)
            families["used"].add_metric([p.pool], p.slots_used)
            families["queue"].add_metric([p.pool], p.queue_length)
            families["wait"].add_metric([p.pool], p.oldest_wait_s)
            for state, count in p.instances.items():
                families["instances"].add_metric([p.pool, state], count)
        yield from families.values()


def record_leadership(master: Master) -> None:
    """This process's leadership as its Master says now. A Master without leadership election (one
    process) leads."""
    is_leader = getattr(master, "is_leader", None)
    leading = bool(is_leader()) if callable(is_leader) else True
    token = getattr(master, "leader_token", None)
    telemetry.record_leader(master.master_id, leading, token if isinstance(token, int) else None)


def render(master: Master) -> bytes:
    record_leadership(master)
    return telemetry.exposition() + generate_latest(ClusterCollector(master))  # type: ignore[arg-type]


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(render(request.app.state.master), media_type=CONTENT_TYPE_LATEST)
