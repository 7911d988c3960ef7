"""What `det deploy` knows about the clouds without asking them: regions, zones, instance types,
GPUs and database tiers, with on-demand list prices in USD per hour.

Flags are checked against these tables before any cloud call, so a typo is one line at once rather
than a half-created stack. Prices are list prices of us-east-1 (AWS) and us-central1 (GCP), Linux,
on demand, rounded; other regions differ by a few percent. They feed the cost estimate of `describe`
and the README; the cloud's bill is the reference. Extend the tables when a type is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

HOURS_PER_MONTH = 730


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


# ---- AWS -------------------------------------------------------------------------------------

AWS_REGIONS: tuple[str, ...] = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1",
    "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2",
)

AWS_INSTANCE_TYPES: dict[str, InstanceType] = _types(
    ("t3.medium", 2, 4, 0, "", 0.0416),
    ("t3.large", 2, 8, 0, "", 0.0832),
    ("t3.xlarge", 4, 16, 0, "", 0.1664),
    ("m6i.large", 2, 8, 0, "", 0.096),
    ("m6i.xlarge", 4, 16, 0, "", 0.192),
    ("m6i.2xlarge", 8, 32, 0, "", 0.384),
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

# RDS for PostgreSQL, single-AZ; storage (gp3) is billed per GB-month on top.
AWS_DB_CLASSES: dict[str, float] = {
    "db.t4g.micro": 0.016,
    "db.t4g.small": 0.032,
    "db.t4g.medium": 0.065,
    "db.t4g.large": 0.129,
    "db.m6g.large": 0.152,
    "db.m6i.large": 0.171,
}
AWS_DB_STORAGE_USD_PER_GB_MONTH = 0.115
# An Elastic IP attached to a running instance is billed like any public IPv4 address.
AWS_PUBLIC_IPV4_USD_PER_HOUR = 0.005

# ---- GCP -------------------------------------------------------------------------------------

# Zone -> the accelerator types it offers (a subset of GCE's, for the GPUs det deploy knows).
GCP_ZONES: dict[str, frozenset[str]] = {
    "us-central1-a": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4", "nvidia-tesla-a100"}),
    "us-central1-b": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4", "nvidia-tesla-a100"}),
    "us-central1-c": frozenset({"nvidia-tesla-t4", "nvidia-l4", "nvidia-tesla-a100"}),
    "us-central1-f": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-a100"}),
    "us-east1-c": frozenset({"nvidia-tesla-t4", "nvidia-l4"}),
    "us-east1-d": frozenset({"nvidia-tesla-t4", "nvidia-l4"}),
    "us-east4-a": frozenset({"nvidia-tesla-t4", "nvidia-l4"}),
    "us-west1-a": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4"}),
    "us-west1-b": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-a100"}),
    "europe-west4-a": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4", "nvidia-tesla-a100"}),
    "europe-west4-b": frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-a100"}),
    "europe-west1-b": frozenset({"nvidia-tesla-t4", "nvidia-l4"}),
    "asia-east1-a": frozenset({"nvidia-tesla-t4", "nvidia-l4"}),
    "asia-northeast1-a": frozenset({"nvidia-tesla-t4", "nvidia-tesla-a100"}),
}

GCP_MACHINE_TYPES: dict[str, InstanceType] = _types(
    ("e2-standard-2", 2, 8, 0, "", 0.067),
    ("e2-standard-4", 4, 16, 0, "", 0.134),
    ("e2-standard-8", 8, 32, 0, "", 0.268),
    ("n2-standard-2", 2, 8, 0, "", 0.0971),
    ("n2-standard-4", 4, 16, 0, "", 0.1942),
    ("n1-standard-4", 4, 15, 0, "", 0.19),
    ("n1-standard-8", 8, 30, 0, "", 0.38),
    ("n1-standard-16", 16, 60, 0, "", 0.76),
    # Accelerator-optimized types come with their GPUs (price included).
    ("g2-standard-4", 4, 16, 1, "nvidia-l4", 0.7068),
    ("g2-standard-8", 8, 32, 1, "nvidia-l4", 0.8536),
    ("a2-highgpu-1g", 12, 85, 1, "nvidia-tesla-a100", 3.6734),
)

# GPUs attached to N1 machines: price per GPU per hour.
GCP_ATTACHABLE_GPUS: dict[str, float] = {
    "nvidia-tesla-t4": 0.35,
    "nvidia-tesla-v100": 2.48,
}
GCP_MAX_GPUS_PER_VM = 8

# Cloud SQL for PostgreSQL (Enterprise edition), zonal; SSD storage is billed per GB-month on top.
GCP_SQL_TIERS: dict[str, float] = {
    "db-f1-micro": 0.0105,
    "db-g1-small": 0.035,
    "db-custom-1-3840": 0.0676,
    "db-custom-2-7680": 0.1352,
    "db-custom-4-15360": 0.2704,
}
GCP_SQL_STORAGE_USD_PER_GB_MONTH = 0.17
GCP_STATIC_IP_USD_PER_HOUR = 0.005


def gcp_region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def gcp_gpu_of(machine_type: str) -> str:
    """The accelerator an accelerator-optimized machine type comes with ("" for others)."""
    t = GCP_MACHINE_TYPES.get(machine_type)
    return t.gpu_model if t else ""


# ---- cost at rest ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostLine:
    what: str
    usd_per_hour: float


def aws_cost_at_rest(master_type: str, db_class: str, db_storage_gb: int) -> list[CostLine]:
    """What a cluster with no agent running costs per hour: the master, its public address, the
    database and its storage (S3 and logs are billed by use)."""
    return [
        CostLine(f"master {master_type}", AWS_INSTANCE_TYPES[master_type].usd_per_hour),
        CostLine("master public IPv4 address", AWS_PUBLIC_IPV4_USD_PER_HOUR),
        CostLine(f"database {db_class}", AWS_DB_CLASSES[db_class]),
        CostLine(f"database storage {db_storage_gb} GB",
                 db_storage_gb * AWS_DB_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH),
    ]


def gcp_cost_at_rest(master_type: str, db_tier: str, db_storage_gb: int) -> list[CostLine]:
    return [
        CostLine(f"master {master_type}", GCP_MACHINE_TYPES[master_type].usd_per_hour),
        CostLine("master static IP address", GCP_STATIC_IP_USD_PER_HOUR),
        CostLine(f"database {db_tier}", GCP_SQL_TIERS[db_tier]),
        CostLine(f"database storage {db_storage_gb} GB",
                 db_storage_gb * GCP_SQL_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH),
    ]


def aws_agent_cost(instance_type: str) -> float:
    return AWS_INSTANCE_TYPES[instance_type].usd_per_hour


def gcp_agent_cost(machine_type: str, gpu_type: str | None, gpu_num: int) -> float:
    base = GCP_MACHINE_TYPES[machine_type].usd_per_hour
    if gpu_type and gpu_type in GCP_ATTACHABLE_GPUS:
        base += GCP_ATTACHABLE_GPUS[gpu_type] * gpu_num
    return base
