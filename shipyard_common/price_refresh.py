"""Refresh the price table (shipyard_common/prices.json) from the clouds' own price lists.

    python -m shipyard_common.price_refresh --aws-offer FILE|URL [--aws-spot FILE|URL] \\
        [--gcp-skus FILE|URL] [--out shipyard_common/prices.json]

Inputs, in the clouds' formats:

- `--aws-offer`: the AWS Pricing API's EC2 offer file (`{"products": {sku: {"attributes": ...}},
  "terms": {"OnDemand": {sku: ...}}}`, e.g. https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/
  AmazonEC2/current/us-east-1/index.json) or a GetProducts answer (`{"PriceList": [json, ...]}`):
  Linux, shared tenancy, no pre-installed software, capacity status Used, hourly USD;
- `--aws-spot`: an EC2 DescribeSpotPriceHistory answer (`{"SpotPriceHistory": [...]}`): the median
  over the region's zones of each type's Linux/UNIX price becomes its spot estimate;
- `--gcp-skus`: the Cloud Billing Catalog's Compute Engine SKUs (`{"skus": [...]}`, services/
  6F81-5844-456A/skus): a machine type's price is its vCPUs x the family's core SKU + its GB x the
  RAM SKU (+ its bundled GPUs x the GPU SKU), on demand and spot ("Preemptible" usage); attachable
  GPUs are priced per GPU.

Only the types of the catalogue (shipyard_common/clouds.py) are written; a price the inputs lack
keeps its current value. Nothing here is read by the master at run time.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from shipyard_common import clouds

Table = dict[str, dict[str, dict[str, dict[str, Any]]]]

# GCP billing SKU words for an accelerator -> its accelerator type name.
_GCP_GPU_NAMES = {"t4": "nvidia-tesla-t4", "v100": "nvidia-tesla-v100", "a100": "nvidia-tesla-a100",
                  "l4": "nvidia-l4"}
_GCP_CORE_RAM = re.compile(r"^(?:spot preemptible )?(?:preemptible )?(?P<family>[a-z][0-9a-z]*) "
                           r"(?:predefined )?instance (?P<what>core|ram) running in ")
_GCP_GPU = re.compile(r"^(?:spot preemptible )?(?:preemptible )?nvidia (?:tesla )?(?P<gpu>[a-z0-9]+) gpu running in ")


def read_document(source: str) -> Any:
    """JSON from a file path or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=60) as resp:  # noqa: S310 (an operator's URL)
            return json.load(resp)
    with open(source, encoding="utf-8") as f:
        return json.load(f)


# ---- AWS -----------------------------------------------------------------------------------------


def _aws_products(doc: dict[str, Any]) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    """(attributes, on-demand terms) of each product, from an offer file or a GetProducts answer."""
    if "PriceList" in doc:
        for item in doc["PriceList"]:
            item = json.loads(item) if isinstance(item, str) else item
            yield item.get("product", {}).get("attributes", {}), item.get("terms", {}).get("OnDemand", {})
        return
    on_demand = doc.get("terms", {}).get("OnDemand", {})
    for sku, product in doc.get("products", {}).items():
        yield product.get("attributes", {}), on_demand.get(sku, {})


def _hourly_usd(terms: dict[str, Any]) -> Optional[float]:
    for term in terms.values():
        for dim in term.get("priceDimensions", {}).values():
            usd = dim.get("pricePerUnit", {}).get("USD")
            if dim.get("unit") in ("Hrs", "Hours") and usd is not None and float(usd) > 0:
                return round(float(usd), 4)
    return None


def aws_on_demand(doc: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(region, instance type) -> on-demand USD/h of Linux, shared tenancy, no extra software."""
    out: dict[tuple[str, str], float] = {}
    for attrs, terms in _aws_products(doc):
        itype, region = attrs.get("instanceType"), attrs.get("regionCode")
        if (itype not in clouds.AWS_INSTANCE_TYPES or not region or attrs.get("operatingSystem") != "Linux"
                or attrs.get("tenancy", "Shared") != "Shared" or attrs.get("preInstalledSw", "NA") != "NA"
                or attrs.get("capacitystatus", "Used") != "Used" or attrs.get("licenseModel", "No License required")
                != "No License required"):
            continue
        usd = _hourly_usd(terms)
        if usd is not None:
            out[(region, itype)] = usd
    return out


def aws_spot(doc: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(region, instance type) -> the median Linux/UNIX spot price over the region's zones."""
    seen: dict[tuple[str, str], list[float]] = {}
    for row in doc.get("SpotPriceHistory", []):
        itype, zone = row.get("InstanceType"), row.get("AvailabilityZone", "")
        if itype in clouds.AWS_INSTANCE_TYPES and row.get("ProductDescription") == "Linux/UNIX" and zone:
            seen.setdefault((zone.rstrip("abcdefghijklmnopqrstuvwxyz"), itype), []).append(float(row["SpotPrice"]))
    return {key: round(statistics.median(prices), 4) for key, prices in seen.items()}


# ---- GCP -----------------------------------------------------------------------------------------


def _unit_price(sku: dict[str, Any]) -> Optional[float]:
    for info in sku.get("pricingInfo", []):
        rates = info.get("pricingExpression", {}).get("tieredRates", [])
        if rates:
            money = rates[-1].get("unitPrice", {})
            return int(money.get("units", 0) or 0) + int(money.get("nanos", 0) or 0) / 1e9
    return None


def gcp_components(doc: dict[str, Any]) -> dict[tuple[str, bool, str, str], float]:
    """(region, spot, kind, name) -> USD per unit-hour, kind "core"/"ram" (name: the family, e.g.
    "n1") or "gpu" (name: the accelerator type)."""
    out: dict[tuple[str, bool, str, str], float] = {}
    for sku in doc.get("skus", []):
        category = sku.get("category", {})
        usage = category.get("usageType")
        if category.get("resourceFamily") != "Compute" or usage not in ("OnDemand", "Preemptible"):
            continue
        text = sku.get("description", "").lower()
        core_ram, gpu = _GCP_CORE_RAM.match(text), _GCP_GPU.match(text)
        if core_ram:
            key: tuple[str, str] = (core_ram["what"], core_ram["family"])
        elif gpu and gpu["gpu"] in _GCP_GPU_NAMES:
            key = ("gpu", _GCP_GPU_NAMES[gpu["gpu"]])
        else:
            continue
        price = _unit_price(sku)
        for region in sku.get("serviceRegions", []):
            if price is not None:
                out[(region, usage == "Preemptible", *key)] = price
    return out


def gcp_prices(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Optional[float]]]:
    """(region, machine type or gpu:<accelerator>) -> {"on_demand", "spot"} from the SKUs' parts."""
    parts = gcp_components(doc)
    regions = {r for r, *_ in parts}
    out: dict[tuple[str, str], dict[str, Optional[float]]] = {}
    for region in regions:
        for name, t in clouds.GCP_MACHINE_TYPES.items():
            family = name.split("-", 1)[0]
            prices = {}
            for spot in (False, True):
                core, ram = parts.get((region, spot, "core", family)), parts.get((region, spot, "ram", family))
                gpu = parts.get((region, spot, "gpu", t.gpu_model)) if t.gpus else 0.0
                ok = core is not None and ram is not None and gpu is not None
                prices["spot" if spot else "on_demand"] = (
                    round(t.vcpus * core + t.memory_gb * ram + t.gpus * gpu, 4) if ok else None)  # type: ignore[operator]
            if prices["on_demand"] is not None:
                out[(region, name)] = prices
        for gpu_name in clouds.GCP_ATTACHABLE_GPUS:
            od, sp = parts.get((region, False, "gpu", gpu_name)), parts.get((region, True, "gpu", gpu_name))
            if od is not None:
                out[(region, clouds.GPU_KEY_PREFIX + gpu_name)] = {
                    "on_demand": round(od, 4), "spot": None if sp is None else round(sp, 4)}
    return out


# ---- the table -----------------------------------------------------------------------------------


def merge(table: Table, cloud: str, prices: dict[tuple[str, str], dict[str, Optional[float]]]) -> int:
    """Write `prices` into `table` (a spot price the input lacks keeps the current one, still marked
    estimated); how many entries were written."""
    for (region, name), new in prices.items():
        entry = table.setdefault(cloud, {}).setdefault(region, {}).setdefault(name, {})
        entry["on_demand"] = new["on_demand"]
        if new.get("spot") is not None:
            entry["spot"] = new["spot"]
            entry.pop("spot_estimated", None)
        elif "spot" not in entry:
            entry["spot"] = round(new["on_demand"] * clouds.SPOT_ESTIMATE_RATIO, 4)  # type: ignore[operator]
            entry["spot_estimated"] = True
    return len(prices)


def refresh(table: Table, aws_offer: Optional[Any] = None, aws_spot_history: Optional[Any] = None,
            gcp_skus: Optional[Any] = None) -> dict[str, int]:
    """Update `table` from the given documents; entries written per input."""
    written = {}
    if aws_offer is not None:
        spot = aws_spot(aws_spot_history) if aws_spot_history is not None else {}
        od = aws_on_demand(aws_offer)
        written["aws"] = merge(table, "aws", {k: {"on_demand": v, "spot": spot.get(k)} for k, v in od.items()})
    if gcp_skus is not None:
        written["gcp"] = merge(table, "gcp", gcp_prices(gcp_skus))
    return written


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard_common.price_refresh", description=__doc__.split("\n")[0])
    parser.add_argument("--aws-offer", help="AWS Pricing API offer file or GetProducts JSON (file or URL)")
    parser.add_argument("--aws-spot", help="EC2 DescribeSpotPriceHistory JSON (file or URL)")
    parser.add_argument("--gcp-skus", help="Cloud Billing Catalog Compute Engine SKUs JSON (file or URL)")
    parser.add_argument("--out", type=Path, default=clouds.PRICES_FILE, help="the table to rewrite")
    args = parser.parse_args(argv)
    if not (args.aws_offer or args.gcp_skus):
        parser.error("give --aws-offer and/or --gcp-skus")
    try:
        table = json.loads(args.out.read_text()) if args.out.exists() else {}
        written = refresh(table, read_document(args.aws_offer) if args.aws_offer else None,
                          read_document(args.aws_spot) if args.aws_spot else None,
                          read_document(args.gcp_skus) if args.gcp_skus else None)
    except (OSError, ValueError, KeyError) as e:
        print(f"price_refresh: {e}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: " + ", ".join(f"{n} {cloud} prices" for cloud, n in written.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
