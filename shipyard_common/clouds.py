"""What Shipyard knows about the clouds without asking them: instance types with their GPUs and
on-demand list prices, and GCP's rules for project ids, zone names and labels. The one home of these facts:

- `infra` (`det deploy`) checks its flags against the types and estimates a cluster's cost
  (infra/catalog.py adds the regions, zones and database tiers it deploys into);
- the web UI's cluster page (control_plane/services/dashboard.py) shows an instance's $/h;
- the GCP provider checks a pool's `project`, `zones` and `labels` with the patterns below, as
  `det deploy gcp` checks its `--project` and `--add-tag`.

Prices are list prices in USD per hour of us-east-1 (AWS) and us-central1 (GCP), Linux, on demand,
rounded to 4 decimals; other regions differ by a few percent and the cloud's bill is the reference.
A type not listed has no price (shown as unknown, never guessed). Extend the tables when one is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gb: float
    gpus: int
    gpu_model: str  # "" without GPUs
    usd_per_hour: float


def _types(*rows: tuple[str, int, float, int, str, float]) -> dict[str, InstanceType]:
    return {r[0]: InstanceType(*r) for r in rows}


# ---- AWS -----------------------------------------------------------------------------------------

AWS_INSTANCE_TYPES: dict[str, InstanceType] = _types(
    ("t3.medium", 2, 4, 0, "", 0.0416),
    ("t3.large", 2, 8, 0, "", 0.0832),
    ("t3.xlarge", 4, 16, 0, "", 0.1664),
    ("m5.large", 2, 8, 0, "", 0.096),
    ("m5.xlarge", 4, 16, 0, "", 0.192),
    ("m6i.large", 2, 8, 0, "", 0.096),
    ("m6i.xlarge", 4, 16, 0, "", 0.192),
    ("m6i.2xlarge", 8, 32, 0, "", 0.384),
    ("c5.xlarge", 4, 8, 0, "", 0.17),
    ("c6i.xlarge", 4, 8, 0, "", 0.17),
    ("c6i.2xlarge", 8, 16, 0, "", 0.34),
    ("g4dn.xlarge", 4, 16, 1, "T4", 0.526),
    ("g4dn.2xlarge", 8, 32, 1, "T4", 0.752),
    ("g4dn.12xlarge", 48, 192, 4, "T4", 3.912),
    ("g5.xlarge", 4, 16, 1, "A10G", 1.006),
    ("g5.2xlarge", 8, 32, 1, "A10G", 1.212),
    ("g5.12xlarge", 48, 192, 4, "A10G", 5.672),
    ("g6.xlarge", 4, 16, 1, "L4", 0.8048),
    ("g6.12xlarge", 48, 192, 4, "L4", 4.6016),
    ("p3.2xlarge", 8, 61, 1, "V100", 3.06),
    ("p3.8xlarge", 32, 244, 4, "V100", 12.24),
    ("p4d.24xlarge", 96, 1152, 8, "A100", 32.7726),
)

# ---- GCP -----------------------------------------------------------------------------------------

GCP_MACHINE_TYPES: dict[str, InstanceType] = _types(
    ("e2-standard-2", 2, 8, 0, "", 0.067),
    ("e2-standard-4", 4, 16, 0, "", 0.134),
    ("e2-standard-8", 8, 32, 0, "", 0.268),
    ("n2-standard-2", 2, 8, 0, "", 0.0971),
    ("n2-standard-4", 4, 16, 0, "", 0.1942),
    ("n1-standard-4", 4, 15, 0, "", 0.19),
    ("n1-standard-8", 8, 30, 0, "", 0.38),
    ("n1-standard-16", 16, 60, 0, "", 0.76),
    # Accelerator-optimized types come with their GPUs (price included). A2 is priced by its parts
    # (us-central1: vCPU $0.031611, GB $0.004237, A100 40GB $2.933908 an hour): the 1g is
    # 12 vCPU + 85 GB + 1 GPU = $3.673385, the 8g 96 vCPU + 680 GB + 8 GPUs = $29.387078.
    ("g2-standard-4", 4, 16, 1, "nvidia-l4", 0.7068),
    ("g2-standard-8", 8, 32, 1, "nvidia-l4", 0.8536),
    ("a2-highgpu-1g", 12, 85, 1, "nvidia-tesla-a100", 3.6734),
    ("a2-highgpu-8g", 96, 680, 8, "nvidia-tesla-a100", 29.3871),
)

# GPUs attached to N1 machines: price per GPU per hour.
GCP_ATTACHABLE_GPUS: dict[str, float] = {
    "nvidia-tesla-t4": 0.35,
    "nvidia-tesla-v100": 2.48,
}
GCP_MAX_GPUS_PER_VM = 8

# A project id: 6 to 30 lowercase letters, digits and hyphens, starting with a letter, not ending with
# a hyphen (https://cloud.google.com/resource-manager/docs/creating-managing-projects).
GCP_PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# Older projects of a Workspace domain carry the domain: `example.com:my-project`. The API accepts
# them; `det deploy` does not create them.
GCP_DOMAIN_SCOPED_PROJECT_ID = re.compile(r"^[a-z][-a-z0-9.]*[a-z0-9]:[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# A zone name: region (`us-central1`, `europe-west4`, `northamerica-northeast1`) and a letter.
GCP_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
# Labels: keys are lowercase letters, digits, '_' and '-', starting with a letter; values the same
# (may be empty); both at most 63 characters.
GCP_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
GCP_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def is_gcp_project_id(value: str, *, domain_scoped: bool = False) -> bool:
    """Whether `value` is a GCP project id (with `domain_scoped`, also `example.com:my-project`)."""
    return bool(GCP_PROJECT_ID.match(value) or (domain_scoped and GCP_DOMAIN_SCOPED_PROJECT_ID.match(value)))


def gcp_region(zone: str) -> str:
    """`us-central1` of `us-central1-a`."""
    return zone.rsplit("-", 1)[0]


def gcp_gpu_of(machine_type: str) -> str:
    """The accelerator an accelerator-optimized machine type comes with ("" for others)."""
    t = GCP_MACHINE_TYPES.get(machine_type)
    return t.gpu_model if t else ""


def aws_gpus(instance_type: str) -> int | None:
    """The GPUs of an AWS instance type (0 for one without); None for a type these tables do not
    know (the provider then asks DescribeInstanceTypes)."""
    known = AWS_INSTANCE_TYPES.get(instance_type)
    return known.gpus if known else None


def on_demand_usd_per_hour(instance_type: str) -> float | None:
    """The on-demand list price of an AWS instance type or a GCP machine type (without attached
    GPUs); None for a type these tables do not know."""
    known = AWS_INSTANCE_TYPES.get(instance_type) or GCP_MACHINE_TYPES.get(instance_type)
    return known.usd_per_hour if known else None
