"""GCP provider: GPU (or CPU) instances on Compute Engine through google-cloud-compute's REST client.

- Every instance carries the Shipyard labels (managed-by, cluster-id, pool, launch-id) so `list()`
  finds the pool's instances again after a master restart; the exact, unsanitized values and the
  master URL also go into instance metadata because label values cannot hold every character.
- `launch()` is idempotent per `LaunchSpec.launch_id`: instances already carrying the launch id are
  returned instead of inserted again, the instance name is derived from the launch id, and each
  insert carries a GCE requestId (uuid5 of launch id and zone) so retried HTTP calls are
  deduplicated by GCE itself.
- Zones are tried in the configured order. A zone not yet proven in this launch gets one instance
  first (a probe); only when it lands do the others follow, so an exhausted zone costs one insert,
  not one per instance. Out of capacity in a zone moves the remaining instances to the next zone,
  and later launches skip that zone for `capacity_cooldown_s` (per machine type,
  provisioners/capacity.py). Quota (labelled with its region, or the project for project-wide
  quotas), auth, invalid-configuration and rate-limit errors stop the launch and are reported in
  `LaunchResult.error` next to whatever did launch.
- Calls that can transiently fail (HTTP 429 / rate-limit reasons, 5xx, connection errors) are
  retried with tenacity, bounded in attempts, with jittered exponential waits.
- user-data is never logged.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import google.auth
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exc
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from provisioners.base import (
    MANAGED_BY_VALUE,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_MASTER,
    TAG_POOL,
    BuiltProvider,
    CloudInstance,
    CloudState,
    ErrorKind,
    ErrorScope,
    LaunchResult,
    LaunchSpec,
    ProviderContext,
    ProviderError,
    ProviderType,
    UserDataKind,
    label_key,
)
from provisioners.capacity import DEFAULT_CAPACITY_COOLDOWN_S, CapacityMemory, Cooldown, all_cooling_error
from provisioners.retry import RetryAttempt, RetryPolicy, call_with_retries

log = logging.getLogger("shipyard.provisioners.gcp")

# google-cloud-compute logs whole request bodies at DEBUG, and insert bodies carry the user-data
# (with an instance-bound token). Keep its loggers above DEBUG unless someone configured them.
_compute_log = logging.getLogger("google.cloud.compute_v1")
if _compute_log.level == logging.NOTSET:
    _compute_log.setLevel(logging.INFO)

T = TypeVar("T")

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# Metadata keys. `user-data` is what cloud-init reads on GCE images; the rest carry exact values
# that label rules would mangle (uppercase, dots, URLs).
METADATA_USER_DATA = "user-data"
METADATA_MASTER = "shipyard-master"
METADATA_CLUSTER = "shipyard-cluster-id"
METADATA_POOL = "shipyard-pool"
METADATA_LAUNCH_ID = "shipyard-launch-id"

LABEL_MANAGED_BY = label_key(TAG_MANAGED_BY)
LABEL_CLUSTER = label_key(TAG_CLUSTER)
LABEL_POOL = label_key(TAG_POOL)
LABEL_LAUNCH_ID = label_key(TAG_LAUNCH_ID)
_RESERVED_LABEL_PREFIX = "shipyard-"

# A fixed namespace so a launch id maps to the same requestId in every master process.
_REQUEST_ID_NAMESPACE = uuid.UUID("6f1d2c3e-5b7a-4c1e-9a0b-5368697079a1")

_STATE_BY_STATUS = {
    "PROVISIONING": CloudState.PENDING,
    "STAGING": CloudState.PENDING,
    # REPAIRING: the host failed under a running instance; it is not usable until it comes back.
    "REPAIRING": CloudState.PENDING,
    "RUNNING": CloudState.RUNNING,
    "STOPPING": CloudState.STOPPING,  # being stopped or deleted
    "SUSPENDING": CloudState.STOPPING,
    # GCE's TERMINATED is a VM powered off (by the agent losing its master, or by hand), not a deleted
    # one: its boot disk and any reservation keep billing until the VM is deleted.
    "SUSPENDED": CloudState.STOPPED,
    "STOPPED": CloudState.STOPPED,
    "TERMINATED": CloudState.STOPPED,
}
# Powered-off statuses: the VM is not running and its disks bill (what keep_stopped_disks is about).
_POWERED_OFF = frozenset({"TERMINATED", "STOPPED", "SUSPENDED"})

_NAME_PREFIX_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_PROJECT_RE = re.compile(r"^(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_RESOURCE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")
_NETWORK_TAG_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_MAX_GPUS = 16
_MAX_CUSTOM_LABELS = 64 - 4


# ---- configuration ---------------------------------------------------------------------------


class GcpConfigError(ValueError):
    """A GCP pool configuration value is unusable. `path` names the field (e.g. `zones[1]`)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class GcpPoolConfig:
    """One resource pool's Compute Engine settings. Validated on construction."""

    project: str
    zones: tuple[str, ...]  # failover order
    machine_type: str
    boot_disk_source_image: str
    gpu_type: str | None = None
    gpu_num: int = 0
    instance_slots: int | None = None  # defaults to gpu_num; required for CPU pools
    spot: bool = False  # provisioningModel SPOT, deleted on preemption
    preemptible: bool = False  # legacy preemptible VMs, also deleted on preemption
    network: str = "global/networks/default"
    subnetwork: str | None = None  # "name", "regions/R/subnetworks/name" or a full path
    external_ip: bool = True
    service_account_email: str | None = "default"  # None: no service account on the instance
    service_account_scopes: tuple[str, ...] = (CLOUD_PLATFORM_SCOPE,)
    network_tags: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    boot_disk_size_gb: int = 100
    boot_disk_type: str = "pd-ssd"
    name_prefix: str = "shipyard"
    api_endpoint: str | None = None  # e.g. a local fake in tests; None = the real API
    credentials_file: str | None = None  # service-account JSON; None = application default credentials
    # A zone that answered "no capacity" is skipped by later launches for this long (0: never).
    capacity_cooldown_s: int = DEFAULT_CAPACITY_COOLDOWN_S
    # A VM found powered off (TERMINATED, STOPPED, SUSPENDED: not by this master) is still deleted;
    # true keeps its disks (autoDelete turned off first), false deletes them with it.
    keep_stopped_disks: bool = False

    def __post_init__(self) -> None:
        _check_str(self.project, "project")
        if not _PROJECT_RE.match(self.project):
            raise GcpConfigError("project", f"{self.project!r} is not a GCP project id")
        zones = _str_tuple(self.zones, "zones")
        if not zones:
            raise GcpConfigError("zones", "at least one zone is required")
        for i, z in enumerate(zones):
            if not _ZONE_RE.match(z):
                raise GcpConfigError(f"zones[{i}]", f"{z!r} is not a zone name (expected e.g. us-central1-a)")
        if len(set(zones)) != len(zones):
            raise GcpConfigError("zones", "zones are listed more than once")
        object.__setattr__(self, "zones", zones)

        _check_resource_ref(self.machine_type, "machine_type")
        _check_str(self.boot_disk_source_image, "boot_disk_source_image")
        gpu_num = _check_int(self.gpu_num, "gpu_num", lo=0, hi=_MAX_GPUS)
        if self.gpu_type is not None:
            _check_resource_ref(self.gpu_type, "gpu_type")
        if gpu_num > 0 and self.gpu_type is None:
            raise GcpConfigError("gpu_type", f"required when gpu_num is {gpu_num}")
        if gpu_num == 0 and self.gpu_type is not None:
            raise GcpConfigError("gpu_num", f"must be at least 1 when gpu_type is {self.gpu_type!r}")
        if self.instance_slots is None:
            if gpu_num == 0:
                raise GcpConfigError("instance_slots", "required for a CPU pool (gpu_num is 0)")
            object.__setattr__(self, "instance_slots", gpu_num)
        else:
            _check_int(self.instance_slots, "instance_slots", lo=1, hi=1024)

        for name in ("spot", "preemptible", "external_ip", "keep_stopped_disks"):
            if not isinstance(getattr(self, name), bool):
                raise GcpConfigError(name, f"must be true or false, not {getattr(self, name)!r}")
        if self.spot and self.preemptible:
            raise GcpConfigError("preemptible", "choose spot or preemptible, not both")

        _check_str(self.network, "network")
        if self.subnetwork is not None:
            _check_str(self.subnetwork, "subnetwork")
        if self.service_account_email is not None:
            _check_str(self.service_account_email, "service_account_email")
        scopes = _str_tuple(self.service_account_scopes, "service_account_scopes")
        object.__setattr__(self, "service_account_scopes", scopes)
        tags = _str_tuple(self.network_tags, "network_tags")
        for i, t in enumerate(tags):
            if not _NETWORK_TAG_RE.match(t):
                raise GcpConfigError(f"network_tags[{i}]", f"{t!r} is not a valid network tag")
        object.__setattr__(self, "network_tags", tags)

        if not isinstance(self.labels, Mapping):
            raise GcpConfigError("labels", "must be a mapping of label keys to values")
        labels = dict(self.labels)
        if len(labels) > _MAX_CUSTOM_LABELS:
            raise GcpConfigError("labels", f"at most {_MAX_CUSTOM_LABELS} custom labels")
        for k, v in labels.items():
            if not isinstance(k, str) or not _LABEL_KEY_RE.match(k):
                raise GcpConfigError(
                    f"labels.{k}", "keys are lowercase letters, digits, '_' and '-', starting with a letter"
                )
            if k.startswith(_RESERVED_LABEL_PREFIX):
                raise GcpConfigError(
                    f"labels.{k}", f"keys starting with {_RESERVED_LABEL_PREFIX!r} are reserved"
                )
            if not isinstance(v, str) or not _LABEL_VALUE_RE.match(v):
                raise GcpConfigError(
                    f"labels.{k}", f"{v!r} is not a valid label value ([a-z0-9_-], at most 63)"
                )
        object.__setattr__(self, "labels", labels)

        _check_int(self.boot_disk_size_gb, "boot_disk_size_gb", lo=10, hi=65536)
        _check_resource_ref(self.boot_disk_type, "boot_disk_type")
        _check_str(self.name_prefix, "name_prefix")
        if not _NAME_PREFIX_RE.match(self.name_prefix):
            raise GcpConfigError(
                "name_prefix",
                f"{self.name_prefix!r}: lowercase letters, digits and '-', starting with a letter, at most 40",
            )
        if self.api_endpoint is not None:
            _check_str(self.api_endpoint, "api_endpoint")
            if not self.api_endpoint.startswith(("http://", "https://")):
                raise GcpConfigError("api_endpoint", "must start with http:// or https://")
        if self.credentials_file is not None:
            _check_str(self.credentials_file, "credentials_file")
        _check_int(self.capacity_cooldown_s, "capacity_cooldown_s", lo=0, hi=86400)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GcpPoolConfig:
        """Build from a pool's `provider` section. A `type: gcp` key is accepted and ignored."""
        if not isinstance(data, Mapping):
            raise GcpConfigError("provider", "must be a mapping")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k != "type"}
        if data.get("type", "gcp") != "gcp":
            raise GcpConfigError("type", f"expected 'gcp', got {data.get('type')!r}")
        unknown = sorted(set(values) - known)
        if unknown:
            raise GcpConfigError(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
        missing = [
            n for n in ("project", "zones", "machine_type", "boot_disk_source_image") if n not in values
        ]
        if missing:
            raise GcpConfigError(missing[0], "required")
        if values.get("labels") is None:
            values.pop("labels", None)
        return cls(**values)

    @property
    def is_spot(self) -> bool:
        return self.spot or self.preemptible

    @property
    def capacity_key(self) -> str:
        """What a zone's capacity is short of: the machine type, its GPUs and whether it is spot."""
        gpus = f" + {self.gpu_num}x {_last_segment(self.gpu_type)}" if self.gpu_num and self.gpu_type else ""
        return f"{_last_segment(self.machine_type)}{gpus}{' (spot)' if self.is_spot else ''}"


def _check_str(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise GcpConfigError(path, "must be a non-empty string")
    return value


def _check_int(value: Any, path: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GcpConfigError(path, f"must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise GcpConfigError(path, f"must be between {lo} and {hi}, got {value}")
    return value


def _str_tuple(value: Any, path: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise GcpConfigError(path, "must be a list of strings")
    for i, v in enumerate(value):
        _check_str(v, f"{path}[{i}]")
    return tuple(value)


def _check_resource_ref(value: Any, path: str) -> None:
    """A short name (n1-standard-8, nvidia-tesla-t4, pd-ssd) or a resource path/URL."""
    _check_str(value, path)
    if "/" not in value and not _RESOURCE_NAME_RE.match(value):
        raise GcpConfigError(path, f"{value!r} is not a valid resource name")


# ---- names and labels ------------------------------------------------------------------------


def label_value(value: str) -> str:
    """A GCE label value for `value`: lowercase, [a-z0-9_-], at most 63 characters.

    Long values keep a hash suffix so two different long ids do not collapse onto one label.
    """
    v = re.sub(r"[^a-z0-9_-]", "-", value.lower())
    if len(v) > 63:
        v = f"{v[:54]}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"
    return v


def request_id(launch_id: str, zone: str) -> str:
    """The GCE requestId for inserting `launch_id` in `zone`.

    Per zone, because GCE answers a repeated requestId with the first operation: after a capacity
    failure in one zone, the same id would replay that failure in the next.
    """
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{launch_id}/{zone}"))


def instance_name(prefix: str, cluster_id: str, launch_id: str) -> str:
    """A valid GCE instance name that is a pure function of the launch, so a retried insert
    collides with (instead of duplicating) an instance that already exists."""
    digest = hashlib.sha256(f"{cluster_id}\0{launch_id}".encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


# ---- error taxonomy --------------------------------------------------------------------------


class GceOperationError(Exception):
    """A zone operation that finished with `error.errors[]`."""

    def __init__(self, errors: Sequence[tuple[str, str]], http_status: int = 0) -> None:
        self.errors = list(errors)
        self.http_status = http_status
        super().__init__("; ".join(f"{c}: {m}" for c, m in self.errors) or "operation failed")


def _norm(code: str) -> str:
    # "quotaExceeded" and "QUOTA_EXCEEDED" are the same condition in GCE's two vocabularies
    # (HTTP error reasons and operation error codes).
    return re.sub(r"[^A-Z]", "", code.upper())


_CAPACITY = {
    "ZONERESOURCEPOOLEXHAUSTED",
    "ZONERESOURCEPOOLEXHAUSTEDWITHDETAILS",
    "RESOURCEPOOLEXHAUSTED",
    "RESOURCEEXHAUSTED",
    "STOCKOUT",
}
_QUOTA = {"QUOTAEXCEEDED", "QUOTALIMITEXCEEDED"}
_THROTTLED = {
    "RATELIMITEXCEEDED",
    "USERRATELIMITEXCEEDED",
    "RESOURCEOPERATIONRATEEXCEEDED",
    "OPERATIONRATEEXCEEDED",
    "RATELIMITED",
}
_AUTH = {
    "FORBIDDEN",
    "AUTHERROR",
    "PERMISSIONDENIED",
    "INSUFFICIENTPERMISSIONS",
    "UNAUTHORIZED",
    "ACCESSDENIED",
}
_INVALID = {
    "INVALID",
    "INVALIDFIELDVALUE",
    "INVALIDPARAMETER",
    "INVALIDUSAGE",
    "BADREQUEST",
    "REQUIRED",
    "RESOURCENOTFOUND",
    "NOTFOUND",
    "UNSUPPORTEDOPERATION",
    "CONDITIONNOTMET",
    "RESOURCEINUSEBYANOTHERRESOURCE",
}
_TRANSIENT_CAUSES: tuple[type[BaseException], ...] = (
    gexc.ServerError,
    gexc.DeadlineExceeded,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    auth_exc.TransportError,
)


def _kind_of_code(code: str) -> ErrorKind | None:
    n = _norm(code)
    if n in _CAPACITY:
        return ErrorKind.CAPACITY
    if n in _QUOTA:
        return ErrorKind.QUOTA
    if n in _THROTTLED:
        return ErrorKind.THROTTLED
    if n in _AUTH:
        return ErrorKind.AUTH
    if n in _INVALID or n.startswith("INVALID"):
        return ErrorKind.INVALID
    return None


def _kind_of_status(status: int) -> ErrorKind:
    if status == 429:
        return ErrorKind.THROTTLED
    if status in (401, 403):
        return ErrorKind.AUTH
    if status in (400, 404, 409, 412, 422):
        return ErrorKind.INVALID
    return ErrorKind.UNKNOWN


def _scope_and_location(kind: ErrorKind, zone: str, message: str) -> tuple[ErrorScope, str]:
    if kind is ErrorKind.CAPACITY:
        return ErrorScope.ZONE, zone
    if kind is ErrorKind.QUOTA:
        # GPUS_ALL_REGIONS and similar project-wide quotas cannot be escaped by changing region.
        if "ALL_REGIONS" in message.upper() or "GLOBAL" in message.upper():
            return ErrorScope.CLOUD, zone
        return ErrorScope.REGION, _region_of(zone) if zone else ""
    if kind in (ErrorKind.THROTTLED, ErrorKind.AUTH):
        return ErrorScope.CLOUD, zone
    return ErrorScope.REGION, zone


def classify_error(exc: BaseException, zone: str = "") -> ProviderError:
    """Sort any failure of a Compute Engine call into the provider error taxonomy."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, GceOperationError):
        # Several errors can come back; the most specific recognised code decides.
        for code, message in exc.errors:
            kind = _kind_of_code(code)
            if kind is not None:
                scope, location = _scope_and_location(kind, zone, message)
                return ProviderError(kind, str(exc), scope=scope, code=code, location=location)
        code = exc.errors[0][0] if exc.errors else ""
        kind = _kind_of_status(exc.http_status) if exc.http_status else ErrorKind.UNKNOWN
        scope, location = _scope_and_location(kind, zone, str(exc))
        return ProviderError(kind, str(exc), scope=scope, code=code, location=location)
    if isinstance(exc, gexc.GoogleAPICallError):
        reasons = [e.get("reason", "") for e in exc.errors if isinstance(e, dict)]
        if exc.reason:
            reasons.insert(0, exc.reason)
        status = int(exc.code) if isinstance(exc.code, int) else 0
        kind: ErrorKind | None = ErrorKind.THROTTLED if status == 429 else None
        code = next((r for r in reasons if r), "") or (str(status) if status else type(exc).__name__)
        if kind is None:
            for r in reasons:
                k = _kind_of_code(r)
                # A 403 "forbidden" is auth, but a 403 "rateLimitExceeded"/"quotaExceeded" is not;
                # reasons take precedence over the status code.
                if k is not None:
                    kind, code = k, r
                    break
        if kind is None or (kind is ErrorKind.INVALID and status >= 500):
            kind = _kind_of_status(status)
        scope, location = _scope_and_location(kind, zone, exc.message or "")
        return ProviderError(kind, exc.message or str(exc), scope=scope, code=code, location=location)
    if isinstance(exc, auth_exc.DefaultCredentialsError | auth_exc.RefreshError):
        return ProviderError(
            ErrorKind.AUTH,
            f"GCP credentials: {exc}",
            scope=ErrorScope.CLOUD,
            code=type(exc).__name__,
            location=zone,
        )
    return ProviderError(
        ErrorKind.UNKNOWN, f"{type(exc).__name__}: {exc}", code=type(exc).__name__, location=zone
    )


def _is_transient(exc: BaseException) -> bool:
    if not isinstance(exc, ProviderError):
        return False
    return exc.kind is ErrorKind.THROTTLED or isinstance(exc.__cause__, _TRANSIENT_CAUSES)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, requests.exceptions.Timeout | gexc.DeadlineExceeded)


def _operation_error(op: compute_v1.Operation) -> GceOperationError | None:
    errs = [(e.code, e.message) for e in op.error.errors] if op.error else []
    if not errs and not op.http_error_status_code:
        return None
    if not errs:
        # Some failures carry only an HTTP status on the operation.
        if op.http_error_status_code < 400:
            return None
        errs = [(str(op.http_error_status_code), op.http_error_message or "operation failed")]
    return GceOperationError(errs, op.http_error_status_code)


# ---- provider --------------------------------------------------------------------------------


@dataclass
class _Accepted:
    spec: LaunchSpec
    name: str
    op: compute_v1.Operation | None  # None: the instance already existed


class GcpProvider:
    """launch / list / terminate for one resource pool on Compute Engine."""

    def __init__(
        self,
        cfg: GcpPoolConfig,
        *,
        cluster_id: str,
        pool: str,
        master_url: str,
        credentials: Credentials | None = None,
        max_attempts: int = 4,
        call_timeout_s: float = 60,
        retry_base_s: float = 1.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if not cluster_id or not pool:
            raise ValueError("cluster_id and pool are required")
        if max_attempts < 1 or call_timeout_s <= 0 or retry_base_s < 0:
            raise ValueError("max_attempts >= 1, call_timeout_s > 0 and retry_base_s >= 0 are required")
        self.cfg = cfg
        self.cluster_id = cluster_id
        self.pool = pool
        self.master_url = master_url
        self._credentials = credentials
        self._retry = RetryPolicy(max_attempts, retry_base_s, retry_base_s * 16)
        self._timeout = float(call_timeout_s)
        self._labels = {
            LABEL_MANAGED_BY: MANAGED_BY_VALUE,
            LABEL_CLUSTER: label_value(cluster_id),
            LABEL_POOL: label_value(pool),
        }
        self._lock = threading.Lock()
        # name -> zone of our instances, refreshed by every list; terminate() needs the zone.
        self._zone_of: dict[str, str] = {}
        self._clock = clock or (lambda: datetime.now(UTC))
        self.capacity = CapacityMemory(timedelta(seconds=cfg.capacity_cooldown_s))
        self._instances_client: compute_v1.InstancesClient | None = None
        self._operations_client: compute_v1.ZoneOperationsClient | None = None

    # ---- clients (lazy: building one resolves credentials, which can fail) -----------------

    def _clients(self) -> tuple[compute_v1.InstancesClient, compute_v1.ZoneOperationsClient]:
        with self._lock:
            if self._instances_client is None or self._operations_client is None:
                try:
                    self._instances_client, self._operations_client = self._build_clients()
                except Exception as exc:
                    raise classify_error(exc) from exc
            return self._instances_client, self._operations_client

    def _build_clients(self) -> tuple[compute_v1.InstancesClient, compute_v1.ZoneOperationsClient]:
        creds = self._credentials
        if creds is None and self.cfg.credentials_file:
            creds, _ = google.auth.load_credentials_from_file(
                self.cfg.credentials_file, scopes=[CLOUD_PLATFORM_SCOPE]
            )
        opts = ClientOptions(api_endpoint=self.cfg.api_endpoint) if self.cfg.api_endpoint else None
        # The operations client is built here rather than taken from the instances transport:
        # the transport's own one ignores api_endpoint and would poll the real API.
        return (
            compute_v1.InstancesClient(credentials=creds, client_options=opts, transport="rest"),
            compute_v1.ZoneOperationsClient(credentials=creds, client_options=opts, transport="rest"),
        )

    def _call(self, what: str, zone: str, fn: Callable[[], T], *, deadline: float | None = None) -> T:
        """One API call: errors classified, transient ones retried (bounded, jittered)."""

        def attempt() -> T:
            try:
                return fn()
            except ProviderError:
                raise
            except Exception as exc:
                raise classify_error(exc, zone) from exc

        def on_retry(r: RetryAttempt) -> None:
            log.warning(
                "event=gcp_call_retry call=%s zone=%s attempt=%d pool=%s error=%s",
                what,
                zone,
                r.attempt,
                self.pool,
                r.error,
            )

        return call_with_retries(attempt, policy=self._retry, is_transient=_is_transient, on_retry=on_retry,
                                 deadline=deadline)

    # ---- launch ----------------------------------------------------------------------------

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        unique: dict[str, LaunchSpec] = {}
        for s in specs:
            unique.setdefault(s.launch_id, s)
        if not unique:
            return LaunchResult(())
        try:
            # Launch ids already on an instance were launched by an earlier call whose result was
            # lost (crash, timeout); returning them keeps launch idempotent across zones too.
            existing = {
                i.launch_id: i
                for i in self._list_all()
                if i.launch_id and i.state is not CloudState.TERMINATED
            }
        except ProviderError as err:
            log.warning("event=gcp_launch_failed pool=%s stage=list error=%s", self.pool, err)
            return LaunchResult((), err)

        launched: list[CloudInstance] = [existing[lid] for lid in unique if lid in existing]
        remaining = [s for lid, s in unique.items() if lid not in existing]
        key = self.cfg.capacity_key
        now = self._clock()
        zones = self.capacity.available(self.cfg.zones, key, now)
        cooling = [c for z in self.cfg.zones if (c := self.capacity.cooling(z, key, now))]
        if cooling and remaining:
            log.info("event=gcp_launch_zones_cooling pool=%s machine=%r zones=%s", self.pool, key,
                     ",".join(f"{c.location}@{c.until.isoformat()}" for c in cooling))
        if remaining and not zones:
            err = all_cooling_error(cooling, key, "zone")
            log.warning("event=gcp_launch_stopped pool=%s kind=%s error=%s", self.pool, err.kind.value, err)
            return LaunchResult(tuple(launched), err)
        capacity_err: ProviderError | None = None
        for zone in zones:
            if not remaining:
                break
            # A probe first: one insert tells whether the zone has room before the others follow.
            probe, rest = remaining[:1], remaining[1:]
            got, left, err = self._launch_in_zone(zone, probe)
            if err is None and rest:
                more, left, err = self._launch_in_zone(zone, rest)
                got = got + more
            else:
                left = left + rest
            remaining = left
            launched.extend(got)
            if got:
                self.capacity.succeeded(zone, key)
            if err is None:
                continue
            if err.kind is ErrorKind.CAPACITY:
                self.capacity.exhausted(zone, key, err, self._clock())
                capacity_err = err
                log.info(
                    "event=gcp_zone_exhausted pool=%s zone=%s code=%s remaining=%d",
                    self.pool,
                    zone,
                    err.code,
                    len(remaining),
                )
                continue
            if err.kind is ErrorKind.QUOTA and err.scope is ErrorScope.CLOUD:
                err = ProviderError(err.kind, err.args[0], scope=err.scope, code=err.code, location=self.cfg.project)
            log.warning(
                "event=gcp_launch_stopped pool=%s zone=%s kind=%s code=%s launched=%d error=%s",
                self.pool,
                zone,
                err.kind.value,
                err.code,
                len(launched),
                err,
            )
            return LaunchResult(tuple(launched), err)
        error: ProviderError | None = None
        if remaining:
            assert capacity_err is not None
            error = ProviderError(
                ErrorKind.CAPACITY,
                f"no capacity for {len(remaining)} instance(s) in any configured zone "
                f"({', '.join(zones)}{'; cooling: ' + ', '.join(c.location for c in cooling) if cooling else ''}); "
                f"last: {capacity_err.args[0]}",
                scope=ErrorScope.REGION,
                code=capacity_err.code,
                location=capacity_err.location,
            )
        return LaunchResult(tuple(launched), error)

    def capacity_cooldowns(self) -> list[Cooldown]:
        """The zones this provider skips now, and until when (shown on the pool)."""
        return self.capacity.snapshot(self._clock())

    def _launch_in_zone(
        self, zone: str, specs: list[LaunchSpec]
    ) -> tuple[list[CloudInstance], list[LaunchSpec], ProviderError | None]:
        """Insert every spec in `zone`, then wait for the operations together.

        Returns what launched, the specs left for the next zone (capacity) and the error that
        decides what happens next (capacity: next zone; anything else: stop).
        """
        accepted: list[_Accepted] = []
        leftover: list[LaunchSpec] = []
        error: ProviderError | None = None
        for i, spec in enumerate(specs):
            try:
                accepted.append(self._insert(spec, zone))
            except ProviderError as err:
                error = err
                leftover = specs[i:]
                break

        launched: list[CloudInstance] = []
        deadline = time.monotonic() + self._timeout
        for acc in accepted:
            op = acc.op
            if op is not None:
                try:
                    op = self._wait(zone, op, deadline)
                except ProviderError as err:
                    # The insert was accepted; whether it succeeds is unknown. Report it pending:
                    # list() tells the truth on the next tick.
                    log.warning(
                        "event=gcp_operation_unknown pool=%s zone=%s instance=%s launch_id=%s error=%s",
                        self.pool,
                        zone,
                        acc.name,
                        acc.spec.launch_id,
                        err,
                    )
                    launched.append(self._assumed(acc.spec, acc.name, zone))
                    continue
                if op.status != compute_v1.Operation.Status.DONE:
                    log.warning(
                        "event=gcp_operation_slow pool=%s zone=%s instance=%s launch_id=%s operation=%s",
                        self.pool,
                        zone,
                        acc.name,
                        acc.spec.launch_id,
                        op.name,
                    )
                    launched.append(self._assumed(acc.spec, acc.name, zone))
                    continue
                op_err = _operation_error(op)
                if op_err is not None:
                    err = classify_error(op_err, zone)
                    log.info(
                        "event=gcp_insert_failed pool=%s zone=%s instance=%s launch_id=%s kind=%s code=%s",
                        self.pool,
                        zone,
                        acc.name,
                        acc.spec.launch_id,
                        err.kind.value,
                        err.code,
                    )
                    if err.kind is ErrorKind.CAPACITY:
                        leftover.append(acc.spec)
                    # A stopping error outranks a capacity one: the launch must not go on.
                    if error is None or error.kind is ErrorKind.CAPACITY:
                        error = err
                    continue
            launched.append(self._describe(acc.spec, acc.name, zone))
            log.info(
                "event=gcp_instance_launched pool=%s zone=%s instance=%s launch_id=%s",
                self.pool,
                zone,
                acc.name,
                acc.spec.launch_id,
            )
        return launched, leftover, error

    def _insert(self, spec: LaunchSpec, zone: str) -> _Accepted:
        instances, _ = self._clients()
        name = instance_name(self.cfg.name_prefix, self.cluster_id, spec.launch_id)
        request = compute_v1.InsertInstanceRequest(
            project=self.cfg.project,
            zone=zone,
            instance_resource=self._instance_resource(spec, name, zone),
            request_id=request_id(spec.launch_id, zone),
        )
        try:
            op = self._call(
                "insert",
                zone,
                lambda: instances.insert_unary(request=request, retry=None, timeout=self._timeout),
            )
        except ProviderError as err:
            if isinstance(err.__cause__, gexc.Conflict) and self._is_ours(name, zone, spec.launch_id):
                # Same name, same launch: an earlier insert of this launch got through.
                return _Accepted(spec, name, None)
            raise
        with self._lock:
            self._zone_of[name] = zone
        return _Accepted(spec, name, op)

    def _is_ours(self, name: str, zone: str, launch_id: str) -> bool:
        try:
            inst = self._get(name, zone)
        except ProviderError:
            return False
        return self._launch_id_of(inst) == launch_id

    def _wait(self, zone: str, op: compute_v1.Operation, deadline: float) -> compute_v1.Operation:
        """Wait for a zone operation until it is DONE or `deadline` (monotonic) passes."""
        _, operations = self._clients()
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() >= deadline:
                return op
            name = op.name

            def wait_once(name: str = name) -> compute_v1.Operation:
                budget = max(0.1, min(self._timeout, deadline - time.monotonic()))
                return operations.wait(
                    project=self.cfg.project, zone=zone, operation=name, retry=None, timeout=budget
                )

            try:
                op = self._call("operations.wait", zone, wait_once, deadline=deadline)
            except ProviderError as err:
                if _is_timeout(err):
                    return op
                raise
        return op

    def _instance_resource(self, spec: LaunchSpec, name: str, zone: str) -> compute_v1.Instance:
        cfg = self.cfg
        labels = {**cfg.labels, **self._labels, LABEL_LAUNCH_ID: label_value(spec.launch_id)}
        metadata = compute_v1.Metadata(
            items=[
                compute_v1.Items(key=METADATA_USER_DATA, value=spec.user_data),
                compute_v1.Items(key=METADATA_MASTER, value=self.master_url),
                compute_v1.Items(key=METADATA_CLUSTER, value=self.cluster_id),
                compute_v1.Items(key=METADATA_POOL, value=self.pool),
                compute_v1.Items(key=METADATA_LAUNCH_ID, value=spec.launch_id),
            ]
        )
        scheduling = compute_v1.Scheduling()
        if cfg.gpu_num > 0 or cfg.is_spot:
            # GPUs cannot live-migrate; spot/preemptible VMs must terminate on maintenance too.
            scheduling.on_host_maintenance = "TERMINATE"
        if cfg.spot:
            scheduling.provisioning_model = "SPOT"
        if cfg.preemptible:
            scheduling.preemptible = True
        if cfg.is_spot:
            scheduling.automatic_restart = False
            # Delete rather than stop on preemption: a stopped VM holds its disk (and costs) and
            # would never come back as an agent.
            scheduling.instance_termination_action = "DELETE"

        nic = compute_v1.NetworkInterface(network=cfg.network)
        if cfg.subnetwork:
            nic.subnetwork = (
                cfg.subnetwork
                if "/" in cfg.subnetwork
                else f"regions/{_region_of(zone)}/subnetworks/{cfg.subnetwork}"
            )
        if cfg.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]

        disk_type = (
            cfg.boot_disk_type
            if "/" in cfg.boot_disk_type
            else f"zones/{zone}/diskTypes/{cfg.boot_disk_type}"
        )
        boot = compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,  # the API default is False: the disk would outlive the instance
            type_="PERSISTENT",
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=cfg.boot_disk_source_image,
                disk_size_gb=cfg.boot_disk_size_gb,
                disk_type=disk_type,
                labels=labels,
            ),
        )
        machine_type = (
            cfg.machine_type if "/" in cfg.machine_type else f"zones/{zone}/machineTypes/{cfg.machine_type}"
        )
        inst = compute_v1.Instance(
            name=name,
            machine_type=machine_type,
            labels=labels,
            metadata=metadata,
            scheduling=scheduling,
            network_interfaces=[nic],
            disks=[boot],
        )
        if cfg.gpu_num > 0 and cfg.gpu_type:
            accel = cfg.gpu_type if "/" in cfg.gpu_type else f"zones/{zone}/acceleratorTypes/{cfg.gpu_type}"
            inst.guest_accelerators = [
                compute_v1.AcceleratorConfig(accelerator_type=accel, accelerator_count=cfg.gpu_num)
            ]
        if cfg.service_account_email:
            inst.service_accounts = [
                compute_v1.ServiceAccount(
                    email=cfg.service_account_email, scopes=list(cfg.service_account_scopes)
                )
            ]
        if cfg.network_tags:
            inst.tags = compute_v1.Tags(items=list(cfg.network_tags))
        return inst

    def _describe(self, spec: LaunchSpec, name: str, zone: str) -> CloudInstance:
        try:
            inst = self._get(name, zone)
        except ProviderError as err:
            log.warning(
                "event=gcp_describe_failed pool=%s zone=%s instance=%s error=%s", self.pool, zone, name, err
            )
            return self._assumed(spec, name, zone)
        return self._to_cloud_instance(inst)

    def _assumed(self, spec: LaunchSpec, name: str, zone: str) -> CloudInstance:
        """What we know of an accepted insert without reading it back."""
        return CloudInstance(
            id=name,
            state=CloudState.PENDING,
            launched_at=datetime.now(UTC),
            launch_id=spec.launch_id,
            location=zone,
            instance_type=_last_segment(self.cfg.machine_type),
            spot=self.cfg.is_spot,
            tags={
                TAG_MANAGED_BY: MANAGED_BY_VALUE,
                TAG_CLUSTER: self.cluster_id,
                TAG_POOL: self.pool,
                TAG_LAUNCH_ID: spec.launch_id,
                TAG_MASTER: self.master_url,
            },
        )

    def _get(self, name: str, zone: str) -> compute_v1.Instance:
        instances, _ = self._clients()
        return self._call(
            "get",
            zone,
            lambda: instances.get(
                project=self.cfg.project, zone=zone, instance=name, retry=None, timeout=self._timeout
            ),
        )

    # ---- list ------------------------------------------------------------------------------

    def list(self) -> list[CloudInstance]:
        """Every instance of this cluster and pool, powered-off (TERMINATED) and suspended ones
        included: they are ours to delete."""
        return self._list_all()

    def label_filter(self) -> str:
        """The aggregatedList filter selecting this cluster's and pool's instances."""
        return " AND ".join(f'(labels.{k} = "{v}")' for k, v in self._labels.items())

    def _list_all(self) -> list[CloudInstance]:
        """Every instance of this cluster and pool in any zone, whatever its status."""
        instances, _ = self._clients()
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.cfg.project, filter=self.label_filter(), max_results=500
        )

        def fetch() -> list[compute_v1.Instance]:
            found: list[compute_v1.Instance] = []
            # The pager follows nextPageToken with the same retry/timeout settings.
            for _scope, scoped in instances.aggregated_list(
                request=request, retry=None, timeout=self._timeout
            ):
                found.extend(scoped.instances)
            return found

        raw = self._call("aggregatedList", "", fetch)
        out = [ci for ci in (self._to_cloud_instance(i) for i in raw if self._is_mine(i))]
        with self._lock:
            self._zone_of = {ci.id: ci.location for ci in out}
        return out

    def _is_mine(self, inst: compute_v1.Instance) -> bool:
        # The filter selects on sanitized labels; the exact ids in metadata settle collisions
        # such as pools "GPU" and "gpu".
        if any(inst.labels.get(k) != v for k, v in self._labels.items()):
            return False
        md = _metadata(inst)
        return (
            md.get(METADATA_CLUSTER, self.cluster_id) == self.cluster_id
            and md.get(METADATA_POOL, self.pool) == self.pool
        )

    def _launch_id_of(self, inst: compute_v1.Instance) -> str | None:
        return _metadata(inst).get(METADATA_LAUNCH_ID) or inst.labels.get(LABEL_LAUNCH_ID) or None

    def _to_cloud_instance(self, inst: compute_v1.Instance) -> CloudInstance:
        md = _metadata(inst)
        state = _STATE_BY_STATUS.get(inst.status, CloudState.PENDING)
        private_ip = public_ip = None
        if inst.network_interfaces:
            nic = inst.network_interfaces[0]
            private_ip = nic.network_i_p or None
            public_ip = next((ac.nat_i_p for ac in nic.access_configs if ac.nat_i_p), None)
        sched = inst.scheduling
        spot = bool(sched and (sched.provisioning_model == "SPOT" or sched.preemptible))
        tags = {k: v for k, v in inst.labels.items()}
        tags[TAG_MANAGED_BY] = inst.labels.get(LABEL_MANAGED_BY, "")
        tags[TAG_CLUSTER] = md.get(METADATA_CLUSTER) or inst.labels.get(LABEL_CLUSTER, "")
        tags[TAG_POOL] = md.get(METADATA_POOL) or inst.labels.get(LABEL_POOL, "")
        launch_id = self._launch_id_of(inst)
        if launch_id:
            tags[TAG_LAUNCH_ID] = launch_id
        if METADATA_MASTER in md:
            tags[TAG_MASTER] = md[METADATA_MASTER]
        return CloudInstance(
            id=inst.name,
            state=state,
            launched_at=_parse_timestamp(inst.creation_timestamp),
            launch_id=launch_id,
            private_ip=private_ip,
            public_ip=public_ip,
            location=_last_segment(inst.zone),
            instance_type=_last_segment(inst.machine_type),
            spot=spot,
            tags=tags,
        )

    # ---- describe by id ----------------------------------------------------------------------

    def describe(self, ids: Sequence[str]) -> dict[str, CloudInstance | None]:
        """Each instance by name, read with instances.get (which, unlike a list right after an
        insert, sees it at once), or None when no configured zone has it: deleted."""
        out: dict[str, CloudInstance | None] = {}
        for name in dict.fromkeys(ids):
            found = self._locate(name)
            out[name] = self._to_cloud_instance(found[1]) if found is not None and self._is_mine(found[1]) else None
            log.info("event=gcp_described pool=%s instance=%s status=%s", self.pool, name,
                     found[1].status if found is not None else "not_found")
        return out

    def _locate(self, name: str) -> tuple[str, compute_v1.Instance] | None:
        """The zone and resource of an instance: the zone it was last seen in first, then the others.
        None when every zone answers 404; other errors are raised."""
        with self._lock:
            known = self._zone_of.get(name)
        zones = [known] if known else []
        zones += [z for z in self.cfg.zones if z != known]
        for zone in zones:
            try:
                inst = self._get(name, zone)
            except ProviderError as err:
                if isinstance(err.__cause__, gexc.NotFound):
                    continue
                raise
            with self._lock:
                self._zone_of[name] = zone
            return zone, inst
        with self._lock:
            self._zone_of.pop(name, None)
        return None

    # ---- terminate -------------------------------------------------------------------------

    def terminate(self, ids: Sequence[str]) -> None:
        names = list(dict.fromkeys(ids))
        if not names:
            return
        with self._lock:
            unknown = [n for n in names if n not in self._zone_of]
        if unknown:
            self._list_all()  # learn zones
            with self._lock:
                unknown = [n for n in unknown if n not in self._zone_of]
            for name in unknown:
                # A list right after an insert may miss the instance: look it up in each zone, so
                # that a terminate is never skipped for an instance that exists.
                found = self._locate(name)
                if found is not None and not self._is_mine(found[1]):
                    with self._lock:
                        self._zone_of.pop(name, None)  # not ours: never deleted
        instances, _ = self._clients()
        # One requestId per terminate() call: retries of this call are deduplicated by GCE, while
        # a later terminate() of the same instance is a fresh request.
        call_id = uuid.uuid4()
        first_error: ProviderError | None = None
        for name in names:
            with self._lock:
                zone = self._zone_of.get(name)
            if zone is None:
                log.info("event=gcp_terminate_skipped pool=%s instance=%s reason=not_found", self.pool, name)
                continue
            if self.cfg.keep_stopped_disks:
                try:
                    self._keep_disks_if_powered_off(name, zone)
                except ProviderError as err:
                    if isinstance(err.__cause__, gexc.NotFound):
                        with self._lock:
                            self._zone_of.pop(name, None)
                        continue
                    # Not deleted: a later terminate tries again rather than losing the disks.
                    log.warning("event=gcp_keep_disks_failed pool=%s zone=%s instance=%s error=%s",
                                self.pool, zone, name, err)
                    first_error = first_error or err
                    continue
            request = compute_v1.DeleteInstanceRequest(
                project=self.cfg.project,
                zone=zone,
                instance=name,
                request_id=str(uuid.uuid5(call_id, name)),
            )
            try:
                self._call(
                    "delete",
                    zone,
                    lambda request=request: instances.delete_unary(
                        request=request, retry=None, timeout=self._timeout
                    ),
                )
            except ProviderError as err:
                if isinstance(err.__cause__, gexc.NotFound):
                    log.info(
                        "event=gcp_terminate_skipped pool=%s instance=%s reason=already_gone", self.pool, name
                    )
                    with self._lock:
                        self._zone_of.pop(name, None)
                    continue
                log.warning(
                    "event=gcp_terminate_failed pool=%s zone=%s instance=%s error=%s",
                    self.pool,
                    zone,
                    name,
                    err,
                )
                first_error = first_error or err
                continue
            log.info("event=gcp_instance_terminating pool=%s zone=%s instance=%s", self.pool, zone, name)
        if first_error is not None:
            raise first_error


    def _keep_disks_if_powered_off(self, name: str, zone: str) -> None:
        """For a powered-off VM, turn autoDelete off on each of its disks (waiting for each
        operation), so that deleting the VM keeps them. A running VM is left as is."""
        inst = self._get(name, zone)
        if inst.status not in _POWERED_OFF:
            return
        instances, _ = self._clients()
        deadline = time.monotonic() + self._timeout
        kept = []
        for disk in inst.disks:
            if disk.auto_delete:
                op = self._call(
                    "setDiskAutoDelete",
                    zone,
                    lambda disk=disk: instances.set_disk_auto_delete_unary(
                        project=self.cfg.project, zone=zone, instance=name, auto_delete=False,
                        device_name=disk.device_name, retry=None, timeout=self._timeout,
                    ),
                )
                done = self._wait(zone, op, deadline)
                if done.status != compute_v1.Operation.Status.DONE:
                    raise ProviderError(ErrorKind.UNKNOWN, f"setDiskAutoDelete on {name} did not finish in time",
                                        location=zone)
                error = _operation_error(done)
                if error is not None:
                    raise classify_error(error, zone)
            kept.append(_last_segment(disk.source) or disk.device_name)
        log.info("event=gcp_stopped_instance_disks_kept pool=%s zone=%s instance=%s status=%s disks=%s",
                 self.pool, zone, name, inst.status, kept)


def _metadata(inst: compute_v1.Instance) -> dict[str, str]:
    if not inst.metadata:
        return {}
    return {it.key: it.value for it in inst.metadata.items}


def _parse_timestamp(ts: str) -> datetime:
    if not ts:
        return datetime.now(UTC)
    dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).astimezone(UTC)


def _build(cfg: GcpPoolConfig, ctx: ProviderContext) -> BuiltProvider:
    slots = cfg.instance_slots if cfg.instance_slots is not None else cfg.gpu_num
    return BuiltProvider(GcpProvider(cfg, cluster_id=ctx.cluster_id, pool=ctx.pool, master_url=ctx.master_url), slots)


# GCE metadata values allow 256 KiB.
PROVIDER_TYPE = ProviderType(name="gcp", config=GcpPoolConfig, build=_build, user_data=UserDataKind.CLOUD_INIT,
                             user_data_limit=256 * 1024)
