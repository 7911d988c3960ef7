"""A stateful local fake of the Compute Engine REST API, driven by the real google-cloud-compute client.

Only what Shipyard's GCP provider (and `det deploy gcp`) calls is implemented: instances insert / get /
list / aggregatedList / delete / stop / start and zoneOperations get / wait, with the behaviours that
matter to a provisioner:

- label filters as the client sends them (`(labels.k = "v") AND (...)`), pagination
  (`maxResults` / `pageToken`), `requestId` idempotency (a repeated id returns the first operation
  and has no second effect);
- operations that are not DONE when returned and finish on a later read, with an `error` field;
- instances that start PROVISIONING and become RUNNING on a later read, and that linger in
  STOPPING for one read after a delete;
- error injection per method and zone: HTTP errors (429, 403, 400, 503...) or operation errors
  (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED...);
- a record of every call and of every insert body as sent, so tests can assert what went over the
  wire;
- disks: each attached disk exists until its instance is deleted with `autoDelete` true (then it is
  recorded in `deleted_disks`), else it outlives the instance (`disks`); `setDiskAutoDelete` flips
  the flag like GCE's (an operation);
- `hide_from_list(name, times)`: the next lists miss an instance that exists (GCE lists are
  eventually consistent right after an insert); a get still finds it.

Point a client at it with `client_options={"api_endpoint": fake.endpoint}` and
`AnonymousCredentials()`. The `gce_fake` fixture starts one per test.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

LINK_BASE = "https://www.googleapis.com/compute/v1/"
# GCE reports timestamps in Pacific time with an offset; keeping that here makes the provider
# prove it handles offsets rather than assuming UTC.
_PACIFIC = timezone(timedelta(hours=-7))

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_METADATA_VALUE_MAX = 256 * 1024

_DEFAULT_REASON = {
    400: "invalid",
    401: "authError",
    403: "forbidden",
    404: "notFound",
    409: "alreadyExists",
    412: "conditionNotMet",
    429: "rateLimitExceeded",
    500: "backendError",
    503: "backendError",
}
_DEFAULT_OP_MESSAGE = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": "The zone '{zone}' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later.",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": "The zone '{zone}' does not have enough resources "
    "available to fulfill the request. '(resource type:compute)'.",
    "QUOTA_EXCEEDED": "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region {region}.",
}
_DEFAULT_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-east1-b")

METHODS = (
    "stop",
    "start",
    "insert",
    "get",
    "list",
    "aggregatedList",
    "delete",
    "operations.get",
    "operations.wait",
    "setDiskAutoDelete",
)


class FakeHttpError(Exception):
    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason or _DEFAULT_REASON.get(status, "error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


@dataclass
class Injection:
    """One injected failure rule.

    It lets the first `skip` matching calls through, then fires `times` times (None: forever).
    With `after`, an HTTP error is returned after the call took effect (a lost response).
    """

    method: str
    zone: str | None
    code: str | None  # operation error code (insert/delete only)
    status: int | None  # HTTP status of a synchronous error
    reason: str | None
    message: str | None
    times: int | None
    skip: int = 0
    after: bool = False
    seen: int = 0
    machine_type: str | None = None  # only inserts of this machine type (short name)
    hits: int = 0

    def applies(self, method: str, zone: str | None, body: dict[str, Any] | None = None) -> bool:
        if self.method != method or (self.zone is not None and self.zone != zone):
            return False
        if self.machine_type is not None and str((body or {}).get("machineType", "")).rsplit("/", 1)[-1] \
                != self.machine_type:
            return False
        return self.times is None or self.hits < self.times


@dataclass(frozen=True)
class Call:
    method: str
    project: str
    zone: str | None
    params: dict[str, str]
    body: dict[str, Any] | None


@dataclass
class _InstanceState:
    key: tuple[str, str, str]  # (project, zone, name)
    resource: dict[str, Any]
    reads: int = 0
    deleting: bool = False
    # A stop or start in progress: GCE finishes it on its own (within seconds to a minute), whether
    # or not anyone waits on the operation; here it is done by the next read of the instance.
    powering: _Operation | None = None


@dataclass
class _Operation:
    resource: dict[str, Any]
    get_polls_left: int
    error: dict[str, Any] | None = None
    http_error: tuple[int, str] | None = None
    on_done: Callable[[], None] | None = None
    done: bool = False


@dataclass
class GceFake:
    """The fake's state plus its HTTP server. Thread-safe: the server handles requests on threads."""

    zones: tuple[str, ...] = _DEFAULT_ZONES
    # Cap on page size (GCE's real cap is 500); lower it to force pagination.
    max_page_size: int = 500
    # How many operations.get reads return RUNNING before DONE (operations.wait always finishes
    # an operation unless `hold_operations` is set).
    op_get_polls_before_done: int = 1
    # When set, operations never finish: wait returns RUNNING after a short pause.
    hold_operations: bool = False
    # When set, a PROVISIONING instance is reported once and is RUNNING from the next read on.
    auto_advance: bool = True

    calls: list[Call] = field(default_factory=list)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)  # instance name -> insert body
    injections: list[Injection] = field(default_factory=list)

    _instances: dict[tuple[str, str, str], _InstanceState] = field(default_factory=dict)
    # (project, zone, disk name) -> the disk; the names of disks deleted with their instance
    _disks: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    deleted_disks: list[str] = field(default_factory=list)
    _hidden: dict[str, int] = field(default_factory=dict)  # instance name -> lists still to miss it
    _operations: dict[tuple[str, str, str], _Operation] = field(default_factory=dict)
    _request_ids: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="gce-fake", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "fake not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ---- test controls ---------------------------------------------------------------------

    def inject(
        self,
        method: str,
        *,
        zone: str | None = None,
        code: str | None = None,
        status: int | None = None,
        reason: str | None = None,
        message: str | None = None,
        times: int | None = 1,
        skip: int = 0,
        after: bool = False,
        machine_type: str | None = None,
    ) -> Injection:
        """Make matching calls fail: the first `skip` go through, then `times` fail (None: all).

        `status` gives a synchronous HTTP error (e.g. 429, 403); with `after=True` the call takes
        effect first and only its response is lost. `code` gives an accepted insert or delete whose
        operation ends DONE with that error code (e.g. ZONE_RESOURCE_POOL_EXHAUSTED).
        """
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; one of {METHODS}")
        if (code is None) == (status is None):
            raise ValueError("give exactly one of code= (operation error) or status= (HTTP error)")
        if code is not None and method not in ("insert", "delete", "setDiskAutoDelete"):
            raise ValueError("operation errors only apply to insert, delete and setDiskAutoDelete")
        if after and status is None:
            raise ValueError("after=True needs status=")
        rule = Injection(method, zone, code, status, reason, message, times, skip=skip, after=after,
                         machine_type=machine_type)
        with self._lock:
            self.injections.append(rule)
        return rule

    def set_status(self, name: str, status: str) -> None:
        with self._lock:
            self._find(name).resource["status"] = status

    def set_running(self, name: str | None = None) -> None:
        """Mark one instance (or every PROVISIONING/STAGING one) RUNNING."""
        with self._lock:
            for st in self._instances.values():
                if name is None and st.resource["status"] in ("PROVISIONING", "STAGING"):
                    st.resource["status"] = "RUNNING"
                elif name is not None and st.resource["name"] == name:
                    st.resource["status"] = "RUNNING"

    def add_instance(
        self,
        *,
        project: str,
        zone: str,
        name: str,
        labels: dict[str, str] | None = None,
        status: str = "RUNNING",
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Seed an instance created by someone else (not through insert)."""
        body: dict[str, Any] = {
            "name": name,
            "machineType": f"zones/{zone}/machineTypes/e2-small",
            "labels": dict(labels or {}),
            "metadata": {"items": [{"key": k, "value": v} for k, v in (metadata or {}).items()]},
            "networkInterfaces": [{"network": "global/networks/default"}],
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "x"}}],
        }
        with self._lock:
            res = self._materialize(project, zone, body)
            res["status"] = status
            self._instances[(project, zone, name)] = _InstanceState((project, zone, name), res)
            return copy.deepcopy(res)

    def hide_from_list(self, name: str, times: int = 1) -> None:
        """The next `times` list / aggregatedList answers leave this instance out (it exists)."""
        with self._lock:
            self._hidden[name] = times

    @property
    def disks(self) -> list[str]:
        """The names of the disks that exist (attached or left behind by a deleted instance)."""
        with self._lock:
            return sorted(k[2] for k in self._disks)

    @property
    def instances(self) -> list[dict[str, Any]]:
        """Every instance that exists, as GCE would return it (copies)."""
        with self._lock:
            return [copy.deepcopy(st.resource) for _, st in sorted(self._instances.items())]

    def instance(self, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._find(name).resource)

    def has_instance(self, name: str) -> bool:
        with self._lock:
            return any(k[2] == name for k in self._instances)

    def calls_to(self, method: str, zone: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method and (zone is None or c.zone == zone)]

    def _find(self, name: str) -> _InstanceState:
        found = [st for k, st in self._instances.items() if k[2] == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} instances named {name!r}")
        return found[0]

    # ---- request handling ------------------------------------------------------------------

    def handle(self, verb: str, path: str, params: dict[str, str], body: dict[str, Any] | None) -> Any:
        route = _route(verb, path)
        if route is None:
            raise FakeHttpError(501, f"the GCE fake does not implement {verb} {path}", "notImplemented")
        method, project, zone, rest = route
        with self._lock:
            self.calls.append(Call(method, project, zone, dict(params), copy.deepcopy(body)))
            rule = self._firing_rule(method, zone, body)
            if rule is not None and rule.status is not None:
                rule.hits += 1
                error = FakeHttpError(
                    rule.status, rule.message or f"injected HTTP {rule.status} on {method}", rule.reason
                )
                if not rule.after:
                    raise error
                self._dispatch(method, project, zone, rest, params, body, None)
                raise error
            op_rule = rule if rule is not None and rule.code is not None else None
            return self._dispatch(method, project, zone, rest, params, body, op_rule)

    def _firing_rule(self, method: str, zone: str | None, body: dict[str, Any] | None = None) -> Injection | None:
        for rule in self.injections:
            if not rule.applies(method, zone, body):
                continue
            rule.seen += 1
            if rule.seen > rule.skip:
                return rule
        return None

    def _dispatch(
        self,
        method: str,
        project: str,
        zone: str | None,
        rest: str,
        params: dict[str, str],
        body: dict[str, Any] | None,
        op_rule: Injection | None,
    ) -> Any:
        if method == "insert":
            assert zone is not None and body is not None
            return self._insert(project, zone, params, body, op_rule)
        if method == "get":
            assert zone is not None
            return self._get(project, zone, rest)
        if method == "list":
            return self._list(project, zone, params)
        if method == "aggregatedList":
            return self._aggregated(project, params)
        if method == "delete":
            assert zone is not None
            return self._delete(project, zone, rest, params, op_rule)
        if method == "setDiskAutoDelete":
            assert zone is not None
            return self._set_disk_auto_delete(project, zone, rest, params, op_rule)
        if method in ("stop", "start"):
            assert zone is not None
            return self._power(method, project, zone, rest)
        if method == "operations.get":
            assert zone is not None
            return self._op_read(project, zone, rest, wait=False)
        assert zone is not None
        return self._op_read(project, zone, rest, wait=True)

    def _insert(
        self,
        project: str,
        zone: str,
        params: dict[str, str],
        body: dict[str, Any],
        rule: Injection | None,
    ) -> dict[str, Any]:
        _check_zone(zone)
        request_id = params.get("requestId")
        if request_id is not None:
            _check_request_id(request_id)
            seen = self._request_ids.get((project, request_id))
            if seen is not None:
                return self._op_view(self._operations[(project, seen[0], seen[1])])
        _validate_instance(zone, body)
        name = body["name"]
        if (project, zone, name) in self._instances:
            raise FakeHttpError(
                409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
            )
        target = f"{LINK_BASE}projects/{project}/zones/{zone}/instances/{name}"
        op = self._new_operation(project, zone, "insert", target)
        if rule is not None:
            rule.hits += 1
            assert rule.code is not None
            op.error = _op_error(rule.code, rule.message, zone)
            op.http_error = _op_http_error(rule.code)
        else:
            self.sent.setdefault(name, copy.deepcopy(body))
            res = self._materialize(project, zone, body)
            self._instances[(project, zone, name)] = _InstanceState((project, zone, name), res)
            op.resource["targetId"] = res["id"]
        if request_id is not None:
            self._request_ids[(project, request_id)] = (zone, op.resource["name"])
        return self._op_view(op)

    def _materialize(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """The instance as GCE stores it: the request plus server-filled fields."""
        n = next(self._ids)
        res = copy.deepcopy(body)
        name = res["name"]
        res.update(
            kind="compute#instance",
            id=str(7_000_000_000_000_000_000 + n),
            creationTimestamp=datetime.now(_PACIFIC).isoformat(timespec="milliseconds"),
            zone=f"{LINK_BASE}projects/{project}/zones/{zone}",
            selfLink=f"{LINK_BASE}projects/{project}/zones/{zone}/instances/{name}",
            status="PROVISIONING",
            labelFingerprint="42WmSpB8rSM=",
            cpuPlatform="Unknown CPU Platform",
        )
        res["machineType"] = _expand(project, res["machineType"])
        sched = res.setdefault("scheduling", {})
        sched.setdefault("onHostMaintenance", "MIGRATE")
        sched.setdefault("automaticRestart", True)
        sched.setdefault("preemptible", False)
        sched.setdefault("provisioningModel", "STANDARD")
        for i, nic in enumerate(res.get("networkInterfaces", [])):
            nic["name"] = f"nic{i}"
            nic["kind"] = "compute#networkInterface"
            nic["network"] = _expand(project, nic.get("network", "global/networks/default"))
            nic["networkIP"] = f"10.128.{n // 250}.{n % 250 + 2}"
            for ac in nic.get("accessConfigs", []):
                ac.setdefault("name", "External NAT")
                ac["kind"] = "compute#accessConfig"
                if ac.get("type") == "ONE_TO_ONE_NAT":
                    ac["natIP"] = f"34.72.{n // 250}.{n % 250 + 2}"
        for i, disk in enumerate(res.get("disks", [])):
            disk.setdefault("type", "PERSISTENT")
            disk.setdefault("autoDelete", False)  # GCE's API default, unlike gcloud's
            disk["index"] = i
            disk["deviceName"] = f"persistent-disk-{i}"
            disk_name = name if i == 0 else f"{name}-{i}"
            disk["source"] = f"{LINK_BASE}projects/{project}/zones/{zone}/disks/{disk_name}"
            self._disks[(project, zone, disk_name)] = {"name": disk_name, "users": [res["selfLink"]]}
        md = res.setdefault("metadata", {})
        md["kind"] = "compute#metadata"
        md["fingerprint"] = "h0o0B1ws-xs="
        return res

    def _read_instance(self, st: _InstanceState) -> dict[str, Any] | None:
        """One read of an instance, applying the state transitions reads drive."""
        st.reads += 1
        if st.powering is not None and not self.hold_operations:
            self._finish(st.powering)  # done by the time anyone looks again
            st.powering = None
        view = copy.deepcopy(st.resource)
        if st.deleting:
            if st.reads > 1:
                self._remove_instance(st)
                return None
            return view
        if self.auto_advance and st.resource["status"] in ("PROVISIONING", "STAGING"):
            st.resource["status"] = "RUNNING"
        return view

    def _get(self, project: str, zone: str, name: str) -> dict[str, Any]:
        st = self._instances.get((project, zone, name))
        view = self._read_instance(st) if st is not None else None
        if view is None:
            raise FakeHttpError(
                404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        return view

    def _matching(self, project: str, zone: str | None, flt: str | None) -> list[dict[str, Any]]:
        pred = _parse_filter(flt) if flt else (lambda _r: True)
        out: list[dict[str, Any]] = []
        for key in sorted(self._instances):
            p, z, _ = key
            if p != project or (zone is not None and z != zone):
                continue
            st = self._instances[key]
            if not pred(st.resource):
                continue
            view = self._read_instance(st)
            if view is not None and self._hidden.get(key[2], 0) > 0:
                self._hidden[key[2]] -= 1  # the list lags: this answer misses it
                continue
            if view is not None:
                out.append(view)
        return out

    def _page(
        self, items: list[dict[str, Any]], params: dict[str, str]
    ) -> tuple[list[dict[str, Any]], str | None]:
        size = self.max_page_size
        if "maxResults" in params:
            size = min(size, max(1, int(params["maxResults"])))
        token = params.get("pageToken") or ""
        if token and not re.fullmatch(r"offset-[0-9]+", token):
            raise FakeHttpError(400, f"Invalid value for field 'pageToken': '{token}'.", "invalid")
        start = int(token.removeprefix("offset-")) if token else 0
        page = items[start : start + size]
        nxt = f"offset-{start + size}" if start + size < len(items) else None
        return page, nxt

    def _list(self, project: str, zone: str | None, params: dict[str, str]) -> dict[str, Any]:
        assert zone is not None
        _check_zone(zone)
        page, nxt = self._page(self._matching(project, zone, params.get("filter")), params)
        out: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{project}/zones/{zone}/instances",
            "selfLink": f"{LINK_BASE}projects/{project}/zones/{zone}/instances",
        }
        if page:
            out["items"] = page
        if nxt:
            out["nextPageToken"] = nxt
        return out

    def _aggregated(self, project: str, params: dict[str, str]) -> dict[str, Any]:
        page, nxt = self._page(self._matching(project, None, params.get("filter")), params)
        scopes: dict[str, dict[str, Any]] = {}
        for res in page:
            z = res["zone"].rsplit("/", 1)[-1]
            scopes.setdefault(f"zones/{z}", {"instances": []})["instances"].append(res)
        # Like GCE, empty zones appear with a warning rather than being left out.
        for z in self.zones:
            scopes.setdefault(
                f"zones/{z}",
                {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope 'zones/{z}' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{z}"}],
                    }
                },
            )
        out: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": scopes,
            "selfLink": f"{LINK_BASE}projects/{project}/aggregated/instances",
        }
        if nxt:
            out["nextPageToken"] = nxt
        return out

    def _delete(
        self, project: str, zone: str, name: str, params: dict[str, str], rule: Injection | None
    ) -> dict[str, Any]:
        request_id = params.get("requestId")
        if request_id is not None:
            _check_request_id(request_id)
            seen = self._request_ids.get((project, request_id))
            if seen is not None:
                return self._op_view(self._operations[(project, seen[0], seen[1])])
        st = self._instances.get((project, zone, name))
        if st is None:
            raise FakeHttpError(
                404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        op = self._new_operation(project, zone, "delete", st.resource["selfLink"])
        op.resource["targetId"] = st.resource["id"]
        if rule is not None:
            rule.hits += 1
            assert rule.code is not None
            op.error = _op_error(rule.code, rule.message, zone)
            op.http_error = _op_http_error(rule.code)
        else:
            if not st.deleting:  # a repeated delete does not restart the shutdown
                st.deleting = True
                st.reads = 0
                st.resource["status"] = "STOPPING"

            def gone(state: _InstanceState = st) -> None:
                self._remove_instance(state)

            op.on_done = gone
        if request_id is not None:
            self._request_ids[(project, request_id)] = (zone, op.resource["name"])
        return self._op_view(op)

    def _power(self, method: str, project: str, zone: str, name: str) -> dict[str, Any]:
        """stop: STOPPING, then TERMINATED when the operation is done; start: RUNNING when it is done."""
        st = self._instances.get((project, zone, name))
        if st is None:
            raise FakeHttpError(
                404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        op = self._new_operation(project, zone, method, st.resource["selfLink"])
        if method == "stop":
            st.resource["status"] = "STOPPING"
        final = "TERMINATED" if method == "stop" else "RUNNING"

        def done(state: _InstanceState = st) -> None:
            state.resource["status"] = final

        op.on_done = done
        st.powering = op
        return self._op_view(op)

    def _remove_instance(self, st: _InstanceState) -> None:
        """The instance is gone: its disks with autoDelete go with it, the others are detached."""
        if self._instances.get(st.key) is not st:
            return
        del self._instances[st.key]
        project, zone, _ = st.key
        for disk in st.resource.get("disks", []):
            key = (project, zone, disk["source"].rsplit("/", 1)[-1])
            if key not in self._disks:
                continue
            if disk.get("autoDelete"):
                del self._disks[key]
                self.deleted_disks.append(key[2])
            else:
                self._disks[key]["users"] = []

    def _set_disk_auto_delete(
        self, project: str, zone: str, name: str, params: dict[str, str], rule: Injection | None
    ) -> dict[str, Any]:
        st = self._instances.get((project, zone, name))
        if st is None:
            raise FakeHttpError(
                404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        if "autoDelete" not in params or "deviceName" not in params:
            raise _invalid("Required parameters 'autoDelete' and 'deviceName' are missing.")
        disk = next((d for d in st.resource.get("disks", []) if d.get("deviceName") == params["deviceName"]), None)
        if disk is None:
            raise _invalid(f"No attached disk found with device name '{params['deviceName']}'")
        op = self._new_operation(project, zone, "setDiskAutoDelete", st.resource["selfLink"])
        if rule is not None:
            rule.hits += 1
            assert rule.code is not None
            op.error = _op_error(rule.code, rule.message, zone)
            op.http_error = _op_http_error(rule.code)
        else:
            disk["autoDelete"] = params["autoDelete"].lower() == "true"
        return self._op_view(op)

    def _new_operation(self, project: str, zone: str, kind: str, target: str) -> _Operation:
        n = next(self._ids)
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
        now = datetime.now(_PACIFIC).isoformat(timespec="milliseconds")
        res = {
            "kind": "compute#operation",
            "id": str(5_000_000_000_000_000_000 + n),
            "name": name,
            "zone": f"{LINK_BASE}projects/{project}/zones/{zone}",
            "operationType": kind,
            "targetLink": target,
            "status": "PENDING",
            "user": "fake-user@example.com",
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": f"{LINK_BASE}projects/{project}/zones/{zone}/operations/{name}",
        }
        op = _Operation(res, get_polls_left=self.op_get_polls_before_done)
        self._operations[(project, zone, name)] = op
        return op

    def _finish(self, op: _Operation) -> None:
        if op.done:
            return
        op.done = True
        op.resource.update(status="DONE", progress=100, endTime=datetime.now(_PACIFIC).isoformat())
        if op.error is not None:
            op.resource["error"] = op.error
            assert op.http_error is not None
            op.resource["httpErrorStatusCode"], op.resource["httpErrorMessage"] = op.http_error
        if op.on_done is not None:
            op.on_done()

    def _op_view(self, op: _Operation) -> dict[str, Any]:
        return copy.deepcopy(op.resource)

    def _op_read(self, project: str, zone: str, name: str, *, wait: bool) -> dict[str, Any]:
        op = self._operations.get((project, zone, name))
        if op is None:
            raise FakeHttpError(
                404, f"The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found"
            )
        if self.hold_operations:
            op.resource["status"] = "RUNNING"
            if wait:
                # The real wait blocks up to two minutes; a short pause keeps the client honest
                # about looping without slowing tests down.
                self._lock.release()
                try:
                    time.sleep(0.05)
                finally:
                    self._lock.acquire()
            return self._op_view(op)
        if wait or op.get_polls_left <= 0:
            self._finish(op)
        else:
            op.get_polls_left -= 1
            op.resource["status"] = "RUNNING"
        return self._op_view(op)


# ---- routing, validation, filters ------------------------------------------------------------

_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances$"), "insert"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances$"), "list"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$"), "get"),
    ("DELETE", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$"), "delete"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances$"), "aggregatedList"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/stop$"), "stop"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/start$"), "start"),
    (
        "POST",
        re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/setDiskAutoDelete$"),
        "setDiskAutoDelete",
    ),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)$"), "operations.get"),
    (
        "POST",
        re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)/wait$"),
        "operations.wait",
    ),
]


def _route(verb: str, path: str) -> tuple[str, str, str | None, str] | None:
    for v, pattern, method in _ROUTES:
        m = pattern.match(path)
        if v == verb and m:
            groups = [unquote(g) for g in m.groups()]
            project = groups[0]
            zone = groups[1] if method != "aggregatedList" else None
            rest = groups[2] if len(groups) > 2 else ""
            return method, project, zone, rest
    return None


def _expand(project: str, ref: str) -> str:
    if ref.startswith(("https://", "http://")):
        return ref
    if ref.startswith("projects/"):
        return LINK_BASE + ref
    return f"{LINK_BASE}projects/{project}/{ref}"


def _check_zone(zone: str) -> None:
    if not _ZONE_RE.match(zone):
        raise FakeHttpError(400, f"Invalid value for field 'zone': '{zone}'.", "invalid")


def _check_request_id(request_id: str) -> None:
    try:
        uuid.UUID(request_id)
    except ValueError:
        raise FakeHttpError(
            400, f"Invalid value for field 'requestId': '{request_id}'. Must be a valid UUID.", "invalid"
        ) from None


def _invalid(msg: str) -> FakeHttpError:
    return FakeHttpError(400, msg, "invalid")


def _zone_of_ref(ref: str) -> str | None:
    m = re.search(r"zones/([^/]+)/", ref)
    return m.group(1) if m else None


def _validate_instance(zone: str, body: dict[str, Any]) -> None:
    """The checks real GCE makes that a provisioner is likely to get wrong."""
    name = body.get("name", "")
    if not _NAME_RE.match(name):
        raise _invalid(
            f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    mt = body.get("machineType")
    if not mt:
        raise _invalid("Invalid value for field 'resource.machineType': ''. Machine type is required.")
    if _zone_of_ref(mt) not in (None, zone):
        raise _invalid(f"Invalid value for field 'resource.machineType': '{mt}'. Zone does not match.")
    labels = body.get("labels", {})
    if len(labels) > 64:
        raise _invalid("Too many labels (max 64).")
    for k, v in labels.items():
        if not _LABEL_KEY_RE.match(k) or not _LABEL_VALUE_RE.match(v):
            raise _invalid(f"Invalid value for field 'resource.labels': '{k}={v}'.")
    disks = body.get("disks", [])
    boots = [d for d in disks if d.get("boot")]
    if len(boots) != 1:
        raise _invalid("Exactly one boot disk is required.")
    init = boots[0].get("initializeParams", {})
    if not boots[0].get("source") and not init.get("sourceImage"):
        raise _invalid("Boot disk needs a source or initializeParams.sourceImage.")
    if init.get("diskType") and _zone_of_ref(init["diskType"]) not in (None, zone):
        raise _invalid(f"Invalid value for field 'diskType': '{init['diskType']}'. Zone does not match.")
    if not body.get("networkInterfaces"):
        raise _invalid("At least one network interface is required.")
    sched = body.get("scheduling", {})
    accels = body.get("guestAccelerators", [])
    for acc in accels:
        if _zone_of_ref(acc.get("acceleratorType", "")) not in (None, zone):
            raise _invalid(f"Accelerator type '{acc.get('acceleratorType')}' is not in zone {zone}.")
        if int(acc.get("acceleratorCount", 0)) < 1:
            raise _invalid("acceleratorCount must be at least 1.")
    if accels and sched.get("onHostMaintenance") != "TERMINATE":
        raise _invalid("Instances with guest accelerators do not support live migration.")
    if sched.get("provisioningModel") == "SPOT" or sched.get("preemptible"):
        if sched.get("automaticRestart", True):
            raise _invalid("Scheduling must have automaticRestart = false for Spot/preemptible VMs.")
        if sched.get("onHostMaintenance") != "TERMINATE":
            raise _invalid("Scheduling must have onHostMaintenance = TERMINATE for Spot/preemptible VMs.")
    keys = [it.get("key") for it in body.get("metadata", {}).get("items", [])]
    if len(keys) != len(set(keys)):
        raise _invalid("Duplicate metadata keys.")
    for it in body.get("metadata", {}).get("items", []):
        if len(it.get("value", "").encode()) > _METADATA_VALUE_MAX:
            raise _invalid(f"Metadata value for key '{it.get('key')}' is too large.")


def _op_error(code: str, message: str | None, zone: str) -> dict[str, Any]:
    region = zone.rsplit("-", 1)[0]
    text = message or _DEFAULT_OP_MESSAGE.get(code, f"injected {code}").format(zone=zone, region=region)
    return {"errors": [{"code": code, "message": text}]}


def _op_http_error(code: str) -> tuple[int, str]:
    if "QUOTA" in code:
        return 403, "FORBIDDEN"
    if "EXHAUSTED" in code:
        return 503, "SERVICE UNAVAILABLE"
    return 400, "BAD REQUEST"


_TOKEN_RE = re.compile(
    r'\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>!=|=|:)|(?P<word>[^\s()"=!:]+))'
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise _invalid(f"Invalid value for field 'filter': '{text}'.")
        kind = m.lastgroup
        assert kind is not None
        value = m.group(kind)
        if kind == "str":
            value = json.loads(value)
        out.append((kind, value))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _field(resource: dict[str, Any], path: str) -> Any:
    cur: Any = resource
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _as_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _parse_filter(text: str) -> Callable[[dict[str, Any]], bool]:
    """GCE list filters, the subset that label selection uses: comparisons `field = "v"`,
    `field != v`, `field : v` (substring, `:*` = present), `field eq regex`, grouped with
    parentheses and joined by AND (explicit or implicit). OR / NOT are refused loudly."""
    toks = _tokens(text)
    pos = 0

    def peek() -> tuple[str, str] | None:
        return toks[pos] if pos < len(toks) else None

    def take() -> tuple[str, str]:
        nonlocal pos
        if pos >= len(toks):
            raise _invalid(f"Invalid value for field 'filter': '{text}' (unexpected end).")
        tok = toks[pos]
        pos += 1
        return tok

    def term() -> Callable[[dict[str, Any]], bool]:
        kind, value = take()
        if kind == "lp":
            inner = conj()
            if take()[0] != "rp":
                raise _invalid(f"Invalid value for field 'filter': '{text}' (unbalanced parentheses).")
            return inner
        if kind != "word" or value.upper() in ("AND", "OR", "NOT"):
            raise _invalid(f"Invalid value for field 'filter': '{text}' (expected a field name).")
        path = value
        op_kind, op = take()
        if op_kind == "word" and op in ("eq", "ne"):
            op_kind = "op"
        if op_kind != "op":
            raise _invalid(f"Invalid value for field 'filter': '{text}' (expected an operator).")
        v_kind, want = take()
        if v_kind not in ("str", "word"):
            raise _invalid(f"Invalid value for field 'filter': '{text}' (expected a value).")

        def pred(resource: dict[str, Any]) -> bool:
            got = _field(resource, path)
            if op == ":":
                if want == "*":
                    return got is not None
                return got is not None and want in _as_text(got)
            if op in ("eq", "ne"):
                hit = got is not None and re.fullmatch(want, _as_text(got)) is not None
                return hit if op == "eq" else not hit
            hit = got is not None and _as_text(got) == want
            return hit if op == "=" else not hit

        return pred

    def conj() -> Callable[[dict[str, Any]], bool]:
        parts = [term()]
        while True:
            tok = peek()
            if tok is None or tok[0] == "rp":
                break
            if tok[0] == "word" and tok[1].upper() in ("OR", "NOT"):
                raise _invalid(f"The GCE fake does not support {tok[1]} in filters: '{text}'.")
            if tok[0] == "word" and tok[1].upper() == "AND":
                take()
            parts.append(term())
        return lambda r: all(p(r) for p in parts)

    result = conj()
    if pos != len(toks):
        raise _invalid(f"Invalid value for field 'filter': '{text}' (trailing tokens).")
    return result


# ---- HTTP plumbing ---------------------------------------------------------------------------


def _make_handler(fake: GceFake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes; without this, delayed ACKs add ~40 ms a call.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

        def _serve(self, verb: str) -> None:
            parts = urlsplit(self.path)
            params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    raise _invalid("Request body is not valid JSON.") from None
                status, payload = 200, fake.handle(verb, parts.path, params, body)
            except FakeHttpError as err:
                status, payload = err.status, err.body()
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

    return Handler


@contextmanager
def running_gce_fake(**settings: Any) -> Iterator[GceFake]:
    fake = GceFake(**settings)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def gce_fake() -> Iterator[GceFake]:
    """A started GCE fake, fresh per test. Import it into a test module or conftest to use it."""
    with running_gce_fake() as fake:
        yield fake
