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

The pool's settings are in config.py, the error taxonomy in errors.py, names and labels in names.py,
and the read side (clients, list, describe) in lookups.py, which `GcpProvider` extends with launches
and deletions.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from google.api_core import exceptions as gexc
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from provisioners.base import (
    INSTANCE_NOT_FOUND,
    INSTANCE_STILL_STOPPING,
    MANAGED_BY_VALUE,
    TAG_CAPACITY,
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
    InstanceOffer,
    LaunchChoice,
    LaunchResult,
    LaunchSpec,
    ProviderContext,
    ProviderError,
    label_key,
)
from provisioners.capacity import (
    CapacityMemory,
    Cooldown,
    all_cooling_error,
    choice_key,
    launch_with_failover,
)
from provisioners.gcp.config import GcpMachine, GcpPoolConfig
from provisioners.gcp.errors import classify_error, is_timeout, operation_error
from provisioners.gcp.lookups import GceReader
from provisioners.gcp.names import (
    LABEL_LAUNCH_ID,
    METADATA_CLUSTER,
    METADATA_LAUNCH_ID,
    METADATA_MASTER,
    METADATA_POOL,
    METADATA_USER_DATA,
    instance_name,
    label_value,
    last_segment,
    request_id,
)
from provisioners.retry import RetryPolicy
from shipyard_common import clouds
from shipyard_common.clouds import gcp_region

log = logging.getLogger("shipyard.provisioners.gcp")

# How long a start waits for its operation: long enough for GCE to report no capacity in the zone
# (seconds), short enough not to hold the autoscaler's tick; a start still running then is not an error.
START_WAIT_S = 10.0
# Powered-off statuses: the VM is not running and its disks bill (what keep_stopped_disks is about).
POWERED_OFF = frozenset({"TERMINATED", "STOPPED", "SUSPENDED"})


@dataclass
class _Accepted:
    spec: LaunchSpec
    name: str
    op: compute_v1.Operation | None  # None: the instance already existed


class GcpProvider(GceReader):
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
        super().__init__(cfg, cluster_id=cluster_id, pool=pool, credentials=credentials,
                         retry=RetryPolicy(max_attempts, retry_base_s, retry_base_s * 16), call_timeout_s=call_timeout_s)
        self.master_url = master_url
        self._clock = clock or (lambda: datetime.now(UTC))
        self.capacity = CapacityMemory(timedelta(seconds=cfg.capacity_cooldown_s))

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
        if not remaining:
            return LaunchResult(tuple(launched))
        result = launch_with_failover(remaining, self._default_choices(), self._launch_choice, log, self.pool)
        return LaunchResult((*launched, *result.launched), result.error)

    def offers(self) -> tuple[InstanceOffer, ...]:
        """Each machine type in each capacity the pool buys, with its slots and regional price."""
        return self.cfg.offers()

    def out_of_capacity(self) -> set[LaunchChoice]:
        """The machine types and capacities cooling down in every zone now (the decider plans without them)."""
        now = self._clock()
        return {o.choice for o in self.cfg.offers() if self.capacity.everywhere(self.cfg.zones, choice_key(o.choice), now)}

    def _default_choices(self) -> tuple[LaunchChoice, ...]:
        """A spec without choices: the pool's machine types in their capacities, cheapest first."""
        offers = sorted(self.cfg.offers(), key=lambda o: (o.usd_per_hour is None, o.usd_per_hour or 0))
        return tuple(o.choice for o in offers)

    def _choice(self, spec: LaunchSpec) -> tuple[GcpMachine, bool]:
        """The machine type and whether it is spot that `spec` is launched as."""
        choice = spec.choices[0] if spec.choices else self._default_choices()[0]
        machines = {m.key: m for m in self.cfg.machines}
        return machines.get(choice.instance_type, self.cfg.machines[0]), choice.spot

    def _launch_choice(self, choice: LaunchChoice, remaining: list[LaunchSpec]) -> LaunchResult:
        """Launch every spec as `choice`, zone by zone, skipping zones cooling down for it."""
        launched: list[CloudInstance] = []
        key = choice_key(choice)
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
        return self._launch_across(zones, cooling, remaining, launched, key)

    def _launch_across(self, zones: Sequence[str], cooling: Sequence[Cooldown], remaining: list[LaunchSpec],
                       launched: list[CloudInstance], key: str) -> LaunchResult:
        """Launch `remaining` zone by zone (a probe first in each), adding to `launched`."""
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
                op_err = operation_error(op)
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
            request_id=self._request_id(spec, zone),
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
                if is_timeout(err):
                    return op
                raise
        return op

    def _request_id(self, spec: LaunchSpec, zone: str) -> str:
        """Per zone and per choice: GCE answers a repeated requestId with its first operation, so a
        type tried after another ran out of capacity needs its own (the pool's first keeps the
        plain per-zone id)."""
        if not spec.choices or spec.choices[0] == self._default_choices()[0]:
            return request_id(spec.launch_id, zone)
        return request_id(spec.launch_id, f"{zone}/{choice_key(spec.choices[0])}")

    def _metadata(self, spec: LaunchSpec) -> compute_v1.Metadata:
        items = {METADATA_USER_DATA: spec.user_data, METADATA_MASTER: self.master_url,
                 METADATA_CLUSTER: self.cluster_id, METADATA_POOL: self.pool, METADATA_LAUNCH_ID: spec.launch_id}
        if self.cfg.ssh_keys:
            items["ssh-keys"] = "\n".join(self.cfg.ssh_keys)
        return compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in items.items()])

    def _instance_resource(self, spec: LaunchSpec, name: str, zone: str) -> compute_v1.Instance:
        cfg = self.cfg
        machine, spot = self._choice(spec)
        labels = {**cfg.labels, **self._labels, LABEL_LAUNCH_ID: label_value(spec.launch_id),
                  label_key(TAG_CAPACITY): "spot" if spot else "on-demand"}
        metadata = self._metadata(spec)
        scheduling = compute_v1.Scheduling()
        if machine.gpu_num > 0 or spot or clouds.gcp_gpu_of(machine.name):
            # GPUs cannot live-migrate; spot/preemptible VMs must terminate on maintenance too.
            scheduling.on_host_maintenance = "TERMINATE"
        if spot and cfg.preemptible:
            scheduling.preemptible = True
        elif spot:
            scheduling.provisioning_model = "SPOT"
        if spot:
            scheduling.automatic_restart = False
            # Delete rather than stop on preemption: a stopped VM holds its disk (and costs) and
            # would never come back as an agent.
            scheduling.instance_termination_action = "DELETE"

        nic = compute_v1.NetworkInterface(network=cfg.network)
        if cfg.subnetwork:
            nic.subnetwork = (
                cfg.subnetwork
                if "/" in cfg.subnetwork
                else f"regions/{gcp_region(zone)}/subnetworks/{cfg.subnetwork}"
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
            machine.machine_type if "/" in machine.machine_type
            else f"zones/{zone}/machineTypes/{machine.machine_type}"
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
        if machine.gpu_num > 0 and machine.gpu_type:
            gpu = machine.gpu_type
            accel = gpu if "/" in gpu else f"zones/{zone}/acceleratorTypes/{gpu}"
            inst.guest_accelerators = [
                compute_v1.AcceleratorConfig(accelerator_type=accel, accelerator_count=machine.gpu_num)
            ]
        if cfg.service_account_email:
            inst.service_accounts = [
                compute_v1.ServiceAccount(
                    email=cfg.service_account_email, scopes=list(cfg.service_account_scopes)
                )
            ]
        if cfg.network_tags:
            inst.tags = compute_v1.Tags(items=list(cfg.network_tags))
        if cfg.min_cpu_platform:
            inst.min_cpu_platform = cfg.min_cpu_platform
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
            instance_type=self._choice(spec)[0].name,
            spot=self._choice(spec)[1],
            tags={
                TAG_MANAGED_BY: MANAGED_BY_VALUE,
                TAG_CLUSTER: self.cluster_id,
                TAG_POOL: self.pool,
                TAG_LAUNCH_ID: spec.launch_id,
                TAG_MASTER: self.master_url,
            },
        )

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

    # ---- park (stop keeping the disks) and start again -------------------------------------

    def stop(self, ids: Sequence[str]) -> None:
        """Park instances: instances.stop powers a VM off (TERMINATED) keeping its disks
        (provisioners.base.Parker). Ones already stopping, powered off or suspended, gone or not
        ours are skipped. Does not wait for the operations (list() shows STOPPING, then TERMINATED);
        a refused request is raised."""
        self._park("stop", ids)

    def start(self, ids: Sequence[str]) -> None:
        """Start parked instances again: instances.start (instances.resume for a SUSPENDED one;
        provisioners.base.Parker). Ones provisioning, staging or running are skipped. Waits for the
        operations up to START_WAIT_S, since GCE reports no capacity for a start (the
        ZONE_RESOURCE_POOL_EXHAUSTED family) in its operation: CAPACITY at the instance's zone, as
        for a launch. One still stopping raises UNKNOWN (INSTANCE_STILL_STOPPING, or GCE's
        resourceNotReady), a gone one INVALID with INSTANCE_NOT_FOUND."""
        self._park("start", ids)

    def _park(self, action: str, ids: Sequence[str]) -> None:
        """Request `action` for every instance, then wait for the operations under one deadline: none
        for a stop (a GPU VM takes a minute or more to power off; list() shows it STOPPING, then
        TERMINATED, and the autoscaler's tick must not wait for it), START_WAIT_S for a start (GCE
        reports no capacity in the operation, within seconds). Every instance is tried, the first
        error is raised."""
        deadline = time.monotonic() + (min(self._timeout, START_WAIT_S) if action == "start" else 0.0)
        call_id = uuid.uuid4()  # one requestId per instance of this call: its retries are deduplicated
        accepted: list[tuple[str, str, compute_v1.Operation]] = []
        first_error: ProviderError | None = None
        for name in dict.fromkeys(ids):
            try:
                op = self._park_request(action, name, str(uuid.uuid5(call_id, name)))
            except ProviderError as err:
                log.warning("event=gcp_%s_failed pool=%s instance=%s error=%s", action, self.pool, name, err)
                first_error = first_error or err
                continue
            if op is not None:
                accepted.append((name, *op))
        for name, zone, op in accepted:
            try:
                done = self._wait(zone, op, deadline)
                error = operation_error(done) if done.status == compute_v1.Operation.Status.DONE else None
                if error is not None:
                    raise _named(classify_error(error, zone), f"{action} {name}")
            except ProviderError as err:
                log.warning("event=gcp_%s_failed pool=%s zone=%s instance=%s error=%s", action, self.pool, zone,
                            name, err)
                first_error = first_error or err
                continue
            log.info("event=gcp_instance_%s pool=%s zone=%s instance=%s operation=%s", action, self.pool, zone, name,
                     "done" if done.status == compute_v1.Operation.Status.DONE else "running")
        if first_error is not None:
            raise first_error

    def _park_request(self, action: str, name: str, rid: str) -> tuple[str, compute_v1.Operation] | None:
        """Send one stop or start for an instance of ours, as its status asks; None: nothing to do."""
        found = self._locate(name)
        if found is None or not self._is_mine(found[1]):
            if action == "stop":
                log.info("event=gcp_stop_skipped pool=%s instance=%s reason=not_found", self.pool, name)
                return None
            raise ProviderError(ErrorKind.INVALID, f"start {name}: no such instance in {', '.join(self.cfg.zones)}",
                                scope=ErrorScope.ZONE, code=INSTANCE_NOT_FOUND)
        zone, inst = found
        if action == "stop" and inst.status in (*POWERED_OFF, "STOPPING", "SUSPENDING"):
            log.info("event=gcp_stop_skipped pool=%s instance=%s reason=%s", self.pool, name, inst.status)
            return None
        if action == "start" and inst.status in ("STOPPING", "SUSPENDING"):
            raise ProviderError(ErrorKind.UNKNOWN, f"start {name}: still {inst.status}, start it once stopped",
                                scope=ErrorScope.ZONE, code=INSTANCE_STILL_STOPPING, location=zone)
        if action == "start" and inst.status not in POWERED_OFF:
            log.info("event=gcp_start_skipped pool=%s instance=%s reason=%s", self.pool, name, inst.status)
            return None
        instances, _ = self._clients()
        fields = {"project": self.cfg.project, "zone": zone, "instance": name, "request_id": rid}
        if action == "stop":
            send = partial(instances.stop_unary, request=compute_v1.StopInstanceRequest(**fields))
        elif inst.status == "SUSPENDED":  # a suspended VM is resumed, not started
            send = partial(instances.resume_unary, request=compute_v1.ResumeInstanceRequest(**fields))
        else:
            send = partial(instances.start_unary, request=compute_v1.StartInstanceRequest(**fields))
        try:
            op = self._call(action, zone, lambda: send(retry=None, timeout=self._timeout))
        except ProviderError as err:
            if isinstance(err.__cause__, gexc.NotFound):  # deleted since the lookup
                if action == "stop":
                    return None
                raise ProviderError(ErrorKind.INVALID, f"start {name}: {err.args[0]}", scope=ErrorScope.ZONE,
                                    code=INSTANCE_NOT_FOUND, location=zone) from err.__cause__
            if action == "start" and _not_ready(err):
                raise ProviderError(ErrorKind.UNKNOWN, f"start {name}: {err.args[0]}", scope=ErrorScope.ZONE,
                                    code=err.code, location=zone) from err.__cause__
            raise _named(err, f"{action} {name}") from err.__cause__
        return zone, op

    def _keep_disks_if_powered_off(self, name: str, zone: str) -> None:
        """For a powered-off VM, turn autoDelete off on each of its disks (waiting for each
        operation), so that deleting the VM keeps them. A running VM is left as is."""
        inst = self._get(name, zone)
        if inst.status not in POWERED_OFF:
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
                error = operation_error(done)
                if error is not None:
                    raise classify_error(error, zone)
            kept.append(last_segment(disk.source) or disk.device_name)
        log.info("event=gcp_stopped_instance_disks_kept pool=%s zone=%s instance=%s status=%s disks=%s",
                 self.pool, zone, name, inst.status, kept)


def _named(err: ProviderError, what: str) -> ProviderError:
    """`err` with its message prefixed by what failed (the call and the instance)."""
    named = ProviderError(err.kind, f"{what}: {err.args[0]}", scope=err.scope, code=err.code, location=err.location)
    named.__cause__ = err.__cause__
    return named


def _not_ready(err: ProviderError) -> bool:
    """GCE's refusal to start an instance that is still being stopped (or otherwise not ready)."""
    text = f"{err.code} {err.args[0]}".lower()
    return "resourcenotready" in text or "not ready" in text or "being stopped" in text


def build(cfg: GcpPoolConfig, ctx: ProviderContext) -> BuiltProvider:
    slots = max(m.slots or 0 for m in cfg.machines) if cfg.machine_types is not None else (
        cfg.instance_slots if cfg.instance_slots is not None else cfg.gpu_num)
    return BuiltProvider(GcpProvider(cfg, cluster_id=ctx.cluster_id, pool=ctx.pool, master_url=ctx.master_url), slots)
