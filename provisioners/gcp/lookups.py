"""The read side of a pool's instances on Compute Engine: the API clients, the call wrapper every
call goes through (errors classified, transient ones retried), and the lookups: get, list (by the
Shipyard labels, in every zone) and describe (by name). `GcpProvider` (provider.py) adds the writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

import google.auth
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from provisioners.base import (
    MANAGED_BY_VALUE,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_MASTER,
    TAG_POOL,
    CloudInstance,
    CloudState,
    ProviderError,
)
from provisioners.gcp.config import GcpPoolConfig
from provisioners.gcp.errors import classify_error, is_transient
from provisioners.gcp.names import (
    CLOUD_PLATFORM_SCOPE,
    LABEL_CLUSTER,
    LABEL_LAUNCH_ID,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    METADATA_CLUSTER,
    METADATA_LAUNCH_ID,
    METADATA_MASTER,
    METADATA_POOL,
    label_value,
    last_segment,
)
from provisioners.retry import RetryAttempt, RetryPolicy, call_with_retries

log = logging.getLogger("shipyard.provisioners.gcp")

# google-cloud-compute logs whole request bodies at DEBUG, and insert bodies carry the user-data
# (with an instance-bound token). Keep its loggers above DEBUG unless someone configured them.
_compute_log = logging.getLogger("google.cloud.compute_v1")
if _compute_log.level == logging.NOTSET:
    _compute_log.setLevel(logging.INFO)

T = TypeVar("T")

STATE_BY_STATUS = {
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


class GceReader:
    """The clients, the call wrapper and the lookups of one pool's instances; holds no state that
    matters (the zone of each instance is a cache the next list refreshes)."""

    def __init__(self, cfg: GcpPoolConfig, *, cluster_id: str, pool: str, credentials: Credentials | None,
                 retry: RetryPolicy, call_timeout_s: float) -> None:
        self.cfg = cfg
        self.cluster_id = cluster_id
        self.pool = pool
        self._credentials = credentials
        self._retry = retry
        self._timeout = float(call_timeout_s)
        self._labels = {
            LABEL_MANAGED_BY: MANAGED_BY_VALUE,
            LABEL_CLUSTER: label_value(cluster_id),
            LABEL_POOL: label_value(pool),
        }
        self._lock = threading.Lock()
        # name -> zone of our instances, refreshed by every list; terminate() needs the zone.
        self._zone_of: dict[str, str] = {}
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

        return call_with_retries(attempt, policy=self._retry, is_transient=is_transient, on_retry=on_retry,
                                 deadline=deadline)

    # ---- get -------------------------------------------------------------------------------

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
        md = metadata(inst)
        return (
            md.get(METADATA_CLUSTER, self.cluster_id) == self.cluster_id
            and md.get(METADATA_POOL, self.pool) == self.pool
        )

    def _launch_id_of(self, inst: compute_v1.Instance) -> str | None:
        return metadata(inst).get(METADATA_LAUNCH_ID) or inst.labels.get(LABEL_LAUNCH_ID) or None

    def _to_cloud_instance(self, inst: compute_v1.Instance) -> CloudInstance:
        md = metadata(inst)
        state = STATE_BY_STATUS.get(inst.status, CloudState.PENDING)
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
            location=last_segment(inst.zone),
            instance_type=last_segment(inst.machine_type),
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


def metadata(inst: compute_v1.Instance) -> dict[str, str]:
    if not inst.metadata:
        return {}
    return {it.key: it.value for it in inst.metadata.items}


def _parse_timestamp(ts: str) -> datetime:
    if not ts:
        return datetime.now(UTC)
    dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).astimezone(UTC)
