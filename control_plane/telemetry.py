"""The master's Prometheus metrics: the metric objects and the small functions that move them.

What happens in a process is counted here as it happens (requests, loop ticks, launches,
terminations, cloud errors, leadership); what is in the database (slots, queues, instances) is read
at scrape time by the /metrics route (api/prometheus.py over services/telemetry_snapshot.py), so
it is never stale and never counted twice.

Label values are bounded: route templates (never a raw path), a fixed set of methods, causes and
error kinds, configured pool names, master ids. No label carries a token, a username or anything a
client chose.

Several processes (API workers and a control process, control_plane/workers.py): when
PROMETHEUS_MULTIPROC_DIR is set before prometheus_client is first imported (it decides then), every
process writes its values to files in that directory and `exposition()` adds them up
(prometheus_client's multiprocess mode); the live gauges of a process that ended are dropped by
`multiprocess.mark_process_dead(pid)`. Imports only the standard library and prometheus_client
(the bottom layer of the master)."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector

UNMATCHED = "unmatched"  # no route: a 404, or a request refused by admission before routing

# Requests last from a millisecond (a refusal, a cached read) to a long-poll's timeout (30 s+).
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TICK_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HTTP_REQUESTS = Counter("shipyard_http_requests", "HTTP requests answered, by route template, method and status.",
                        ("route", "method", "status"))
HTTP_DURATION = Histogram("shipyard_http_request_duration_seconds",
                          "Time from a request's arrival to the end of its response, by route template, method "
                          "and status.", ("route", "method", "status"), buckets=_REQUEST_BUCKETS)
LOOP_TICK = Histogram("shipyard_loop_tick_duration_seconds", "How long one tick of a background loop took.",
                      ("loop",), buckets=_TICK_BUCKETS)
LAUNCHES = Counter("shipyard_instance_launches",
                   "Instances asked of the cloud, by pool and outcome (launched, failed: the cloud refused, "
                   "unknown: no answer, the row waits for a list to show the instance or not).",
                   ("pool", "outcome"))
TERMINATIONS = Counter("shipyard_instance_terminations", "Instances the master decided to terminate, by pool and "
                       "cause.", ("pool", "cause"))
CLOUD_ERRORS = Counter("shipyard_cloud_errors", "Failed cloud calls, by pool, operation and error kind.",
                       ("pool", "operation", "kind"))
ADMISSION_REFUSALS = Counter("shipyard_admission_refusals",
                             "Slots an admission lane refused (a request's 503; or a waiting agent poll's "
                             "full check, which asks again), by lane (users, cluster) and why: "
                             "queue_full (request_queue waiting), over_wait (the lane could not serve it within "
                             "its queue wait (request_queue_wait_s; the cluster's cluster_queue_wait_s) at its "
                             "recent rate), timed_out (it waited that long).",
                             ("lane", "reason"))
# Each process reports itself; with several processes the live ones' values are combined (max).
LEADER = Gauge("shipyard_leader", "1 if this master process holds the leadership (runs the loops), else 0.",
               ("master_id",), multiprocess_mode="livemax")
LEADER_TOKEN = Gauge("shipyard_leader_fencing_token", "The fencing token of the leadership this master process "
                     "holds (0: none).", ("master_id",), multiprocess_mode="livemax")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
ERROR_KINDS = frozenset({"capacity", "quota", "throttled", "auth", "invalid", "unknown"})
OPERATIONS = frozenset({"launch", "terminate", "list", "describe"})
# A termination's cause, from the start of the reason the autoscaler records (core/scaling/decider.py,
# loops/autoscaler/). Anything else is `other`: the label set stays bounded whatever a reason says.
_CAUSE_PREFIXES = (
    ("idle for ", "idle"),
    ("above max_instances", "above_max_instances"),
    ("agent did not connect", "agent_never_connected"),
    ("agent disconnected", "agent_disconnected"),
    ("the cloud reports", "stopped_outside_master"),
    ("cluster or pool taken down", "teardown"),
    ("orphan", "orphan"),
)
TERMINATION_CAUSES = (*(cause for _, cause in _CAUSE_PREFIXES), "other")

# Per-label-set children, so the per-request path is one dict lookup, not two `labels()` calls.
_request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    """One request answered. `route` is a template (or UNMATCHED); a method outside METHODS counts
    as OTHER, so no client can grow the label set."""
    key = (route, method if method in METHODS else "OTHER", status)
    children = _request_children.get(key)
    if children is None:
        children = _request_children.setdefault(key, (HTTP_REQUESTS.labels(key[0], key[1], str(status)),
                                                      HTTP_DURATION.labels(key[0], key[1], str(status))))
    children[0].inc()
    children[1].observe(seconds)


def refused(lane: str, reason: str) -> None:
    ADMISSION_REFUSALS.labels(lane, reason).inc()


def observe_loop_tick(name: str, seconds: float) -> None:
    """One tick of the loop `name` (called by Master.add_loop around every tick)."""
    LOOP_TICK.labels(name).observe(seconds)


def termination_cause(reason: str) -> str:
    """The bounded cause of a termination reason (`other` for one not known here)."""
    for prefix, cause in _CAUSE_PREFIXES:
        if reason.startswith(prefix):
            return cause
    return "other"


def terminated(pool: str, reason: str) -> None:
    """A termination decided for one instance; `reason` as recorded on its row."""
    TERMINATIONS.labels(pool, termination_cause(reason)).inc()


def launched(pool: str, requested: int, launched: int, error_kind: str | None) -> None:
    """One launch call for `requested` instances, of which the cloud returned `launched`; the rest
    failed (the cloud said no) or are unknown (no clear answer: an UNKNOWN error, or none at all)."""
    if launched:
        LAUNCHES.labels(pool, "launched").inc(launched)
    rest = requested - launched
    if rest > 0:
        LAUNCHES.labels(pool, "failed" if error_kind is not None and error_kind != "unknown" else "unknown").inc(rest)


def cloud_error(pool: str, operation: str, kind: str) -> None:
    """A cloud call that failed: `operation` (launch, terminate, list, describe) and the error's kind
    (shipyard_common/provider_errors.ErrorKind's values; `unknown` for anything else)."""
    CLOUD_ERRORS.labels(pool, operation if operation in OPERATIONS else "other",
                        kind if kind in ERROR_KINDS else "unknown").inc()


def record_leader(master_id: str, leading: bool, token: int | None) -> None:
    """This process's view of the leadership: read from its Master at scrape time, and to be called by
    a process that leads whenever its lease changes (with several processes, the one scraped may not
    be the one leading)."""
    LEADER.labels(master_id).set(1 if leading else 0)
    LEADER_TOKEN.labels(master_id).set(token if leading and token is not None else 0)


def multiprocess() -> bool:
    """Whether prometheus_client writes values to PROMETHEUS_MULTIPROC_DIR (decided when it was imported)."""
    return values.ValueClass is not values.MutexValue


def exposition() -> bytes:
    """Every metric counted in memory, in the Prometheus text format: this process's (with
    prometheus_client's process and runtime collectors), or, in multiprocess mode, those of every
    process writing to the directory, added up."""
    if not multiprocess():
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return generate_latest(registry)

