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

Prices per region (on demand and a spot estimate) are in `prices.json` beside this module, read by
`regional_price`: the scale decider of a pool with several instance types chooses the cheapest by
them. `python -m shipyard_common.price_refresh` rewrites that file from the clouds' own price lists
(the AWS Pricing API's offer or GetProducts JSON, EC2 DescribeSpotPriceHistory, the GCP Cloud Billing
Catalog's SKUs). As shipped, it holds the list prices above for the home regions and spot estimates of
`SPOT_ESTIMATE_RATIO` of them (marked `"spot_estimated": true`) until refreshed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional


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
    # 12 vCPU + 85 GB + 1 GPU = $3.673385, the 2g 24 + 170 + 2 = $7.34677, the 4g 48 + 340 + 4 =
    # $14.69354, the 8g 96 vCPU + 680 GB + 8 GPUs = $29.387078.
    ("g2-standard-4", 4, 16, 1, "nvidia-l4", 0.7068),
    ("g2-standard-8", 8, 32, 1, "nvidia-l4", 0.8536),
    ("a2-highgpu-1g", 12, 85, 1, "nvidia-tesla-a100", 3.6734),
    ("a2-highgpu-2g", 24, 170, 2, "nvidia-tesla-a100", 7.3468),
    ("a2-highgpu-4g", 48, 340, 4, "nvidia-tesla-a100", 14.6935),
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


# ---- prices per region ---------------------------------------------------------------------------

PRICES_FILE = Path(__file__).with_name("prices.json")
HOME_REGION = {"aws": "us-east-1", "gcp": "us-central1"}
# Spot's usual discount, for the estimate shipped before a refresh (AWS and GCP both advertise
# "up to 90%" off; 65% off is typical of GPU types): spot = on-demand x this.
SPOT_ESTIMATE_RATIO = 0.35
GPU_KEY_PREFIX = "gpu:"  # GCP attachable accelerators in the table: "gpu:nvidia-tesla-t4"


@dataclass(frozen=True)
class RegionalPrice:
    """USD per hour of one type in one region. `region` is where the price is from: the home region's
    when the asked one is not in the table (`fallback` true)."""

    on_demand: float
    spot: Optional[float]
    region: str
    fallback: bool = False

    def usd_per_hour(self, spot: bool) -> Optional[float]:
        return self.spot if spot else self.on_demand


@lru_cache(maxsize=4)
def load_prices(path: Path = PRICES_FILE) -> dict[str, Any]:
    """The price table: {"aws"|"gcp": {region: {type: {"on_demand": x, "spot": y}}}} (cached)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _entry(cloud: str, region: str, key: str, table: dict[str, Any]) -> Optional[tuple[dict[str, Any], str]]:
    by_region = table.get(cloud, {})
    for where in (region, HOME_REGION[cloud]):
        entry = by_region.get(where, {}).get(key)
        if entry is not None and entry.get("on_demand") is not None:
            return entry, where
    return None


def regional_price(cloud: str, region: str, instance_type: str,
                   table: Optional[dict[str, Any]] = None) -> Optional[RegionalPrice]:
    """The price of an AWS instance type or a GCP machine type (or `gpu:<accelerator>`) in `region`
    (a GCP zone is taken for its region), else the home region's; None when the table has neither."""
    if cloud == "gcp" and GCP_ZONE.match(region):
        region = gcp_region(region)
    found = _entry(cloud, region, instance_type, load_prices() if table is None else table)
    if found is None:
        return None
    entry, where = found
    spot = entry.get("spot")
    return RegionalPrice(float(entry["on_demand"]), None if spot is None else float(spot), where, where != region)


def gcp_vm_price(region: str, machine_type: str, gpu_type: Optional[str], gpu_num: int,
                 table: Optional[dict[str, Any]] = None) -> Optional[RegionalPrice]:
    """A GCP VM's price: its machine type and `gpu_num` attached accelerators; None if one is unknown."""
    machine = regional_price("gcp", region, machine_type, table)
    if machine is None or not gpu_num or not gpu_type:
        return machine
    gpu = regional_price("gcp", region, GPU_KEY_PREFIX + gpu_type, table)
    if gpu is None:
        return None
    spot = None if machine.spot is None or gpu.spot is None else machine.spot + gpu.spot * gpu_num
    return RegionalPrice(round(machine.on_demand + gpu.on_demand * gpu_num, 4),
                         None if spot is None else round(spot, 4), machine.region, machine.fallback or gpu.fallback)
