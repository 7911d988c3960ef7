"""What `det deploy` knows about the clouds without asking them: regions, zones and database tiers,
with on-demand list prices in USD per hour; the instance types, GPUs and their prices come from
shipyard_common/clouds.py, which the master's web UI reads too.

Flags are checked against these tables before any cloud call, so a typo is one line at once rather
than a half-created stack. Prices are list prices of us-east-1 (AWS) and us-central1 (GCP), Linux,
on demand, rounded; other regions differ by a few percent. They feed the cost estimate of `describe`
and the README; the cloud's bill is the reference. Extend the tables when a type is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from shipyard_common.clouds import AWS_INSTANCE_TYPES as AWS_INSTANCE_TYPES
from shipyard_common.clouds import GCP_ATTACHABLE_GPUS as GCP_ATTACHABLE_GPUS
from shipyard_common.clouds import GCP_MACHINE_TYPES as GCP_MACHINE_TYPES
from shipyard_common.clouds import GCP_MAX_GPUS_PER_VM as GCP_MAX_GPUS_PER_VM
from shipyard_common.clouds import InstanceType as InstanceType
from shipyard_common.clouds import gcp_gpu_of as gcp_gpu_of
from shipyard_common.clouds import gcp_region as gcp_region

HOURS_PER_MONTH = 730


# ---- AWS -------------------------------------------------------------------------------------

AWS_REGIONS: tuple[str, ...] = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1",
    "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2",
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
# EFS (`--shared-fs efs`), Standard storage class, elastic throughput: billed per GB stored (and per GB
# read or written), nothing for an empty file system.
AWS_EFS_USD_PER_GB_MONTH = 0.30

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
# Filestore (`--shared-fs filestore`), basic HDD tier: billed per GiB provisioned, 1 TiB at least.
GCP_FILESTORE_USD_PER_GB_MONTH = 0.20
FILESTORE_MIN_GB = 1024


# ---- cost at rest ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostLine:
    what: str
    usd_per_hour: float


def aws_cost_at_rest(master_type: str, db_class: str, db_storage_gb: int, *, efs: bool = False) -> list[CostLine]:
    """What a cluster with no agent running costs per hour: the master, its public address, the
    database and its storage (S3, EFS and logs are billed by use: an EFS line says its rate)."""
    shared = [CostLine(f"EFS (${AWS_EFS_USD_PER_GB_MONTH:.2f}/GB-month stored)", 0.0)] if efs else []
    return [
        CostLine(f"master {master_type}", AWS_INSTANCE_TYPES[master_type].usd_per_hour),
        CostLine("master public IPv4 address", AWS_PUBLIC_IPV4_USD_PER_HOUR),
        CostLine(f"database {db_class}", AWS_DB_CLASSES[db_class]),
        CostLine(f"database storage {db_storage_gb} GB",
                 db_storage_gb * AWS_DB_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH),
        *shared,
    ]


def gcp_cost_at_rest(master_type: str, db_tier: str, db_storage_gb: int, *, filestore_gb: int = 0) -> list[CostLine]:
    """As on AWS; a Filestore instance is billed by its provisioned capacity, used or not."""
    shared = ([CostLine(f"Filestore {filestore_gb} GB", filestore_gb * GCP_FILESTORE_USD_PER_GB_MONTH / HOURS_PER_MONTH)]
              if filestore_gb else [])
    return [
        CostLine(f"master {master_type}", GCP_MACHINE_TYPES[master_type].usd_per_hour),
        CostLine("master static IP address", GCP_STATIC_IP_USD_PER_HOUR),
        CostLine(f"database {db_tier}", GCP_SQL_TIERS[db_tier]),
        CostLine(f"database storage {db_storage_gb} GB",
                 db_storage_gb * GCP_SQL_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH),
        *shared,
    ]


def aws_agent_cost(instance_type: str) -> float:
    return AWS_INSTANCE_TYPES[instance_type].usd_per_hour


def gcp_agent_cost(machine_type: str, gpu_type: str | None, gpu_num: int) -> float:
    base = GCP_MACHINE_TYPES[machine_type].usd_per_hour
    if gpu_type and gpu_type in GCP_ATTACHABLE_GPUS:
        base += GCP_ATTACHABLE_GPUS[gpu_type] * gpu_num
    return base
