"""A pool's Compute Engine settings: the `provider:` section of a `type: gcp` pool, less the elastic
settings.

Checked like every settings section (shipyard_common/settings.py): every problem is reported at once,
with its path in the section (`zones[1]`, `labels.team`). This module imports no GCP SDK: the master's
API workers validate every pool's section to show its effective settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from provisioners.base import Capacity, InstanceOffer, InstanceSummary, ProviderSettings, capacity_of
from provisioners.capacity import DEFAULT_CAPACITY_COOLDOWN_S
from provisioners.gcp.names import CLOUD_PLATFORM_SCOPE, RESERVED_LABEL_PREFIX, last_segment
from shipyard_common import clouds
from shipyard_common.settings import (
    StrictSettings,
    boolean,
    check_all,
    http_url,
    integer,
    str_mapping,
    text,
    text_list,
)

_NAME_PREFIX_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_RESOURCE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")
_NETWORK_TAG_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_GPUS = 16
MAX_CUSTOM_LABELS = 64 - 5  # GCE allows 64 labels; Shipyard writes 5


def _project(value: str) -> str:
    if not clouds.is_gcp_project_id(value, domain_scoped=True):
        raise ValueError(f"{value!r} is not a GCP project id (6 to 30 lowercase letters, digits and '-', "
                         "starting with a letter, not ending with '-')")
    return value


def _zone_problem(zone: str) -> str | None:
    return None if clouds.GCP_ZONE.match(zone) else f"{zone!r} is not a zone name (expected e.g. us-central1-a)"


def _some_zones(zones: tuple[str, ...]) -> tuple[str, ...]:
    if not zones:
        raise ValueError("at least one zone is required")
    return zones


def _resource_ref(value: Any) -> Any:
    """A short name (n1-standard-8, nvidia-tesla-t4, pd-ssd) or a resource path/URL."""
    if isinstance(value, str) and value.strip() and "/" not in value and not _RESOURCE_NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a valid resource name")
    return value


def _network_tag_problem(tag: str) -> str | None:
    return None if _NETWORK_TAG_RE.match(tag) else f"{tag!r} is not a valid network tag"


def _label_problem(key: Any, value: Any) -> str | None:
    if not isinstance(key, str) or not clouds.GCP_LABEL_KEY.match(key):
        return "keys are lowercase letters, digits, '_' and '-', starting with a letter"
    if key.startswith(RESERVED_LABEL_PREFIX):
        return f"keys starting with {RESERVED_LABEL_PREFIX!r} are reserved"
    if not isinstance(value, str) or not clouds.GCP_LABEL_VALUE.match(value):
        return f"{value!r} is not a valid label value ([a-z0-9_-], at most 63)"
    return None


def _at_most_custom_labels(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > MAX_CUSTOM_LABELS:
        raise ValueError(f"at most {MAX_CUSTOM_LABELS} custom labels")
    return labels


def _name_prefix(value: str) -> str:
    if not _NAME_PREFIX_RE.match(value):
        raise ValueError(f"{value!r}: lowercase letters, digits and '-', starting with a letter, at most 40")
    return value


def _machine_list(value: Any) -> Any:
    if value is None or isinstance(value, tuple):
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty list of {machine_type, gpu_type, gpu_num, instance_slots}")
    return tuple(value)


ResourceRef = Annotated[str, text(), AfterValidator(_resource_ref)]
GpuRef = Annotated[str | None, text(optional=True), AfterValidator(_resource_ref)]


class GcpMachine(StrictSettings):
    """One entry of `machine_types`: a machine type with its attached accelerators, as the single
    type's `machine_type`, `gpu_type`, `gpu_num` and `instance_slots` say it."""

    machine_type: ResourceRef
    gpu_type: GpuRef = None
    gpu_num: Annotated[int, integer(0, MAX_GPUS)] = 0
    # Default: gpu_num, else the GPUs an accelerator-optimized type comes with (a2-, g2-).
    instance_slots: Annotated[int | None, integer(1, 1024, optional=True)] = None

    @model_validator(mode="after")
    def _fields_agree(self) -> GcpMachine:
        problems = []
        if self.gpu_num > 0 and self.gpu_type is None:
            problems.append(("gpu_type", f"required when gpu_num is {self.gpu_num}"))
        if self.gpu_num == 0 and self.gpu_type is not None:
            problems.append(("gpu_num", f"must be at least 1 when gpu_type is {self.gpu_type!r}"))
        if self.slots is None and not problems:
            problems.append(("instance_slots", f"required for {self.machine_type!r} (no GPUs)"))
        check_all(problems)
        return self

    @property
    def name(self) -> str:
        return last_segment(self.machine_type)

    @property
    def slots(self) -> int | None:
        bundled = clouds.GCP_MACHINE_TYPES.get(self.name)
        return self.instance_slots or self.gpu_num or (bundled.gpus if bundled else 0) or None

    @property
    def key(self) -> str:
        """How the pool names this choice: the machine type, with its attached GPUs if any."""
        return f"{self.name} + {self.gpu_num}x {last_segment(self.gpu_type)}" if self.gpu_num and self.gpu_type \
            else self.name


class GcpPoolConfig(ProviderSettings):
    """One resource pool's Compute Engine settings."""

    TYPE = "gcp"

    project: Annotated[str, text(), AfterValidator(_project)]
    zones: Annotated[tuple[str, ...], text_list(item=_zone_problem), AfterValidator(_some_zones)]  # failover order
    # One machine type (`machine_type` with `gpu_type`, `gpu_num`, `instance_slots`) or several
    # (`machine_types`, each entry its own: the cheapest combination that fits is launched).
    machine_type: Annotated[str | None, text(optional=True), AfterValidator(_resource_ref)] = None
    machine_types: Annotated[tuple[GcpMachine, ...] | None, BeforeValidator(_machine_list)] = None
    # spot | on-demand | spot-then-on-demand; None: `spot` says (true: spot, false: on-demand).
    capacity: Annotated[str | None, text(optional=True)] = None
    boot_disk_source_image: Annotated[str, text()]
    gpu_type: GpuRef = None
    gpu_num: Annotated[int, integer(0, MAX_GPUS)] = 0
    instance_slots: Annotated[int | None, integer(1, 1024, optional=True)] = None  # default: gpu_num
    spot: Annotated[bool, boolean()] = False  # provisioningModel SPOT, deleted on preemption
    preemptible: Annotated[bool, boolean()] = False  # legacy preemptible VMs, also deleted on preemption
    network: Annotated[str, text()] = "global/networks/default"
    subnetwork: Annotated[str | None, text(optional=True)] = None  # "name", "regions/R/subnetworks/name" or a path
    external_ip: Annotated[bool, boolean()] = True
    service_account_email: Annotated[str | None, text(optional=True)] = "default"  # None: no service account
    service_account_scopes: Annotated[tuple[str, ...], text_list()] = (CLOUD_PLATFORM_SCOPE,)
    network_tags: Annotated[tuple[str, ...], text_list(item=_network_tag_problem)] = ()
    labels: Annotated[
        dict[str, str], str_mapping(_label_problem, what="label keys to values"), AfterValidator(_at_most_custom_labels)
    ] = Field(default_factory=dict)
    boot_disk_size_gb: Annotated[int, integer(10, 65536)] = 100
    boot_disk_type: ResourceRef = "pd-ssd"
    name_prefix: Annotated[str, text(), AfterValidator(_name_prefix)] = "shipyard"
    api_endpoint: Annotated[str | None, http_url(optional=True)] = None  # e.g. a local fake; None: the real API
    # A service-account JSON file; None: application default credentials.
    credentials_file: Annotated[str | None, text(optional=True)] = None
    # A zone that answered "no capacity" is skipped by later launches for this long (0: never).
    capacity_cooldown_s: Annotated[int, integer(0, 86400)] = DEFAULT_CAPACITY_COOLDOWN_S
    # A VM found powered off (TERMINATED, STOPPED, SUSPENDED: not by this master) is still deleted;
    # true keeps its disks (autoDelete turned off first), false deletes them with it.
    keep_stopped_disks: Annotated[bool, boolean()] = False
    # The least CPU generation the VMs get (e.g. "Intel Ice Lake"); None: whatever the zone has.
    min_cpu_platform: Annotated[str | None, text(optional=True)] = None
    # Lines of the `ssh-keys` metadata key ("USER:ssh-ed25519 AAAA... comment"): SSH access without OS Login.
    ssh_keys: Annotated[tuple[str, ...], text_list()] = ()

    @model_validator(mode="before")
    @classmethod
    def _slots_default_to_gpus(cls, data: Any) -> Any:
        gpus = data.get("gpu_num") if isinstance(data, dict) else None
        if isinstance(gpus, int) and not isinstance(gpus, bool) and 0 < gpus <= MAX_GPUS \
                and data.get("instance_slots") is None and data.get("machine_types") is None:
            return {**data, "instance_slots": gpus}
        return data

    @model_validator(mode="after")
    def _fields_agree(self) -> GcpPoolConfig:
        problems = []
        if self.gpu_num > 0 and self.gpu_type is None and self.machine_types is None:
            problems.append(("gpu_type", f"required when gpu_num is {self.gpu_num}"))
        if self.gpu_num == 0 and self.gpu_type is not None and self.machine_types is None:
            problems.append(("gpu_num", f"must be at least 1 when gpu_type is {self.gpu_type!r}"))
        if self.machine_types is None and self.gpu_type is None and self.instance_slots is None:
            problems.append(("instance_slots", "required for a CPU pool (gpu_num is 0)"))
        if self.spot and self.preemptible:
            problems.append(("preemptible", "choose spot or preemptible, not both"))
        mode, capacity_problem = capacity_of(self.capacity, self.spot, "spot" in self.model_fields_set)
        if capacity_problem:
            problems.append(("capacity", capacity_problem))
        elif self.preemptible and mode is not Capacity.SPOT and self.capacity is not None:
            problems.append(("capacity", "contradicts preemptible: true (preemptible VMs are spot capacity)"))
        if self.machine_type is None and not self.machine_types:
            problems.append(("machine_type", "required (or machine_types: a list of machine types)"))
        if self.machine_types is not None:
            problems += [(name, "set it per entry of machine_types") for name in ("machine_type", "gpu_type",
                         "gpu_num", "instance_slots") if name in self.model_fields_set]
            keys = [m.key for m in self.machine_types]
            problems += [(f"machine_types[{i}]", f"duplicate {k!r}") for i, k in enumerate(keys) if k in keys[:i]]
        check_all(problems)
        return self

    @property
    def capacity_mode(self) -> Capacity:
        mode, _ = capacity_of(self.capacity, self.spot or self.preemptible, False)
        return mode or Capacity.ON_DEMAND

    @property
    def is_spot(self) -> bool:
        return self.capacity_mode is not Capacity.ON_DEMAND

    @property
    def machines(self) -> tuple[GcpMachine, ...]:
        """The machine types the pool may launch (the single-type fields are a list of one)."""
        if self.machine_types is not None:
            return self.machine_types
        return (GcpMachine.model_construct(machine_type=self.machine_type, gpu_type=self.gpu_type,
                                           gpu_num=self.gpu_num, instance_slots=self.instance_slots),)

    def offers(self) -> tuple[InstanceOffer, ...]:
        """Every machine in every capacity the pool buys, priced for its first zone's region."""
        out = []
        for m in self.machines:
            price = clouds.gcp_vm_price(self.zones[0], m.name, last_segment(m.gpu_type) if m.gpu_type else None,
                                        m.gpu_num)
            for spot in self.capacity_mode.spot_choices:
                out.append(InstanceOffer(m.key, m.slots or 0, spot, price.usd_per_hour(spot) if price else None))
        return tuple(out)

    def summary(self) -> InstanceSummary:
        several = self.machine_types is not None
        slots = max((m.slots or 0) for m in self.machines) if several else self.instance_slots
        return InstanceSummary(self.zones[0], self.boot_disk_source_image, ", ".join(m.key for m in self.machines),
                               self.is_spot, slots, self.offers() if several or self.capacity else (),
                               self.capacity_mode.value)
