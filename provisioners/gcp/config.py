"""A pool's Compute Engine settings: the `provider:` section of a `type: gcp` pool, less the elastic
settings.

Checked like every settings section (shipyard_common/settings.py): every problem is reported at once,
with its path in the section (`zones[1]`, `labels.team`). This module imports no GCP SDK: the master's
API workers validate every pool's section to show its effective settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from provisioners.base import InstanceSummary, ProviderSettings
from provisioners.capacity import DEFAULT_CAPACITY_COOLDOWN_S
from provisioners.gcp.names import CLOUD_PLATFORM_SCOPE, RESERVED_LABEL_PREFIX, last_segment
from shipyard_common import clouds
from shipyard_common.settings import boolean, check_all, http_url, integer, str_mapping, text, text_list

_NAME_PREFIX_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_RESOURCE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")
_NETWORK_TAG_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_GPUS = 16
MAX_CUSTOM_LABELS = 64 - 4  # GCE allows 64 labels; Shipyard writes 4


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


ResourceRef = Annotated[str, text(), AfterValidator(_resource_ref)]


class GcpPoolConfig(ProviderSettings):
    """One resource pool's Compute Engine settings."""

    TYPE = "gcp"

    project: Annotated[str, text(), AfterValidator(_project)]
    zones: Annotated[tuple[str, ...], text_list(item=_zone_problem), AfterValidator(_some_zones)]  # failover order
    machine_type: ResourceRef
    boot_disk_source_image: Annotated[str, text()]
    gpu_type: Annotated[str | None, text(optional=True), AfterValidator(_resource_ref)] = None
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
                and data.get("instance_slots") is None:
            return {**data, "instance_slots": gpus}
        return data

    @model_validator(mode="after")
    def _fields_agree(self) -> GcpPoolConfig:
        problems = []
        if self.gpu_num > 0 and self.gpu_type is None:
            problems.append(("gpu_type", f"required when gpu_num is {self.gpu_num}"))
        if self.gpu_num == 0 and self.gpu_type is not None:
            problems.append(("gpu_num", f"must be at least 1 when gpu_type is {self.gpu_type!r}"))
        if self.gpu_type is None and self.instance_slots is None:
            problems.append(("instance_slots", "required for a CPU pool (gpu_num is 0)"))
        if self.spot and self.preemptible:
            problems.append(("preemptible", "choose spot or preemptible, not both"))
        check_all(problems)
        return self

    @property
    def is_spot(self) -> bool:
        return self.spot or self.preemptible

    def summary(self) -> InstanceSummary:
        return InstanceSummary(self.zones[0], self.boot_disk_source_image, last_segment(self.machine_type),
                               self.is_spot, self.instance_slots)

    @property
    def capacity_key(self) -> str:
        """What a zone's capacity is short of: the machine type, its GPUs and whether it is spot."""
        gpus = f" + {self.gpu_num}x {last_segment(self.gpu_type)}" if self.gpu_num and self.gpu_type else ""
        return f"{last_segment(self.machine_type)}{gpus}{' (spot)' if self.is_spot else ''}"

