"""The price table per region: shipped, read by region with the home region as fallback, and
refreshed from small documents in the clouds' own price-list formats (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shipyard_common import clouds, price_refresh

# An EC2 offer file (AWS Pricing API, AmazonEC2/current/<region>/index.json), cut to three SKUs:
# g4dn.xlarge Linux in us-west-2, the same type with Windows (ignored), and a dedicated-tenancy one.
AWS_OFFER = {
    "formatVersion": "v1.0", "offerCode": "AmazonEC2", "version": "20240501000000",
    "products": {
        "SKU1": {"sku": "SKU1", "productFamily": "Compute Instance", "attributes": {
            "instanceType": "g4dn.xlarge", "regionCode": "us-west-2", "location": "US West (Oregon)",
            "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
            "licenseModel": "No License required"}},
        "SKU2": {"sku": "SKU2", "productFamily": "Compute Instance", "attributes": {
            "instanceType": "g4dn.xlarge", "regionCode": "us-west-2", "operatingSystem": "Windows",
            "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}},
        "SKU3": {"sku": "SKU3", "productFamily": "Compute Instance", "attributes": {
            "instanceType": "g5.xlarge", "regionCode": "us-west-2", "operatingSystem": "Linux",
            "tenancy": "Dedicated", "preInstalledSw": "NA", "capacitystatus": "Used"}},
    },
    "terms": {"OnDemand": {
        "SKU1": {"SKU1.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": "SKU1", "priceDimensions": {
            "SKU1.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "0.5260000000"},
                                           "description": "$0.526 per On Demand Linux g4dn.xlarge Instance Hour"}}}},
        "SKU2": {"SKU2.JRTCKXETXF": {"priceDimensions": {"d": {"unit": "Hrs", "pricePerUnit": {"USD": "0.71"}}}}},
        "SKU3": {"SKU3.JRTCKXETXF": {"priceDimensions": {"d": {"unit": "Hrs", "pricePerUnit": {"USD": "1.1"}}}}},
    }},
}

AWS_SPOT = {"SpotPriceHistory": [
    {"AvailabilityZone": "us-west-2a", "InstanceType": "g4dn.xlarge", "ProductDescription": "Linux/UNIX",
     "SpotPrice": "0.160000", "Timestamp": "2024-05-01T10:00:00+00:00"},
    {"AvailabilityZone": "us-west-2b", "InstanceType": "g4dn.xlarge", "ProductDescription": "Linux/UNIX",
     "SpotPrice": "0.200000", "Timestamp": "2024-05-01T10:00:00+00:00"},
    {"AvailabilityZone": "us-west-2c", "InstanceType": "g4dn.xlarge", "ProductDescription": "Linux/UNIX",
     "SpotPrice": "0.170000", "Timestamp": "2024-05-01T10:00:00+00:00"},
    {"AvailabilityZone": "us-west-2a", "InstanceType": "g4dn.xlarge", "ProductDescription": "Windows",
     "SpotPrice": "0.900000", "Timestamp": "2024-05-01T10:00:00+00:00"},
]}


def _sku(description: str, group: str, usage: str, region: str, units: int, nanos: int, unit: str = "h") -> dict:
    return {
        "name": f"services/6F81-5844-456A/skus/{abs(hash(description + usage)) % 10**8:08d}",
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": [region],
        "pricingInfo": [{"pricingExpression": {"usageUnit": unit, "tieredRates": [
            {"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos}}]}}],
    }


# Cloud Billing Catalog SKUs (services/6F81-5844-456A/skus), the parts of N1 and A2 in europe-west4.
GCP_SKUS = {"skus": [
    _sku("N1 Predefined Instance Core running in Netherlands", "N1Standard", "OnDemand", "europe-west4", 0, 34828000),
    _sku("N1 Predefined Instance Ram running in Netherlands", "N1Standard", "OnDemand", "europe-west4", 0, 4668000,
         "GiBy.h"),
    _sku("Spot Preemptible N1 Predefined Instance Core running in Netherlands", "N1Standard", "Preemptible",
         "europe-west4", 0, 7350000),
    _sku("Spot Preemptible N1 Predefined Instance Ram running in Netherlands", "N1Standard", "Preemptible",
         "europe-west4", 0, 985000, "GiBy.h"),
    _sku("Nvidia Tesla T4 GPU running in Netherlands", "GPU", "OnDemand", "europe-west4", 0, 350000000),
    _sku("Spot Preemptible Nvidia Tesla T4 GPU running in Netherlands", "GPU", "Preemptible", "europe-west4",
         0, 69000000),
    _sku("A2 Instance Core running in Netherlands", "CPU", "OnDemand", "europe-west4", 0, 34806000),
    _sku("A2 Instance Ram running in Netherlands", "RAM", "OnDemand", "europe-west4", 0, 4665000, "GiBy.h"),
    _sku("Nvidia Tesla A100 GPU running in Netherlands", "GPU", "OnDemand", "europe-west4", 3, 230000000),
    _sku("Commitment v1: N1 Cpu in Netherlands for 1 Year", "CPU", "Commit1Yr", "europe-west4", 0, 20000000),
    _sku("N1 Sole Tenancy Instance Core running in Netherlands", "CPU", "OnDemand", "europe-west4", 0, 99000000),
]}


def test_shipped_table_has_every_catalogue_type_in_the_home_regions() -> None:
    for name, t in clouds.AWS_INSTANCE_TYPES.items():
        price = clouds.regional_price("aws", "us-east-1", name)
        assert price is not None and price.on_demand == t.usd_per_hour and not price.fallback
        assert price.spot is not None and price.spot < price.on_demand
    for name in clouds.GCP_MACHINE_TYPES:
        assert clouds.regional_price("gcp", "us-central1-a", name) is not None  # a zone reads its region


def test_unknown_region_falls_back_to_home_and_unknown_type_has_no_price() -> None:
    price = clouds.regional_price("aws", "ap-south-1", "g4dn.xlarge")
    assert price is not None and price.fallback and price.region == "us-east-1"
    assert clouds.regional_price("aws", "us-east-1", "x9.nothing") is None


def test_gcp_vm_price_adds_attached_gpus() -> None:
    vm = clouds.gcp_vm_price("us-central1", "n1-standard-8", "nvidia-tesla-t4", 2)
    assert vm is not None and vm.on_demand == pytest.approx(0.38 + 2 * 0.35)
    assert clouds.gcp_vm_price("us-central1", "n1-standard-8", "nvidia-no-such", 1) is None


def test_refresh_from_aws_pricing_and_gcp_billing_documents(tmp_path: Path) -> None:
    out = tmp_path / "prices.json"
    out.write_text(clouds.PRICES_FILE.read_text())
    files = {}
    for name, doc in (("offer", AWS_OFFER), ("spot", AWS_SPOT), ("skus", GCP_SKUS)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    rc = price_refresh.main(["--aws-offer", str(files["offer"]), "--aws-spot", str(files["spot"]),
                             "--gcp-skus", str(files["skus"]), "--out", str(out)])
    assert rc == 0
    table = json.loads(out.read_text())
    # Linux shared only (the Windows and dedicated SKUs are left out); spot: the median of the zones.
    assert table["aws"]["us-west-2"] == {"g4dn.xlarge": {"on_demand": 0.526, "spot": 0.17}}
    west = clouds.regional_price("aws", "us-west-2", "g4dn.xlarge", table)
    assert west is not None and (west.on_demand, west.spot, west.fallback) == (0.526, 0.17, False)
    # n1-standard-4: 4 vCPUs x $0.034828 + 15 GB x $0.004668 on demand; spot from the Preemptible SKUs.
    n1 = table["gcp"]["europe-west4"]["n1-standard-4"]
    assert n1["on_demand"] == pytest.approx(round(4 * 0.034828 + 15 * 0.004668, 4))
    assert n1["spot"] == pytest.approx(round(4 * 0.00735 + 15 * 0.000985, 4))
    # a2-highgpu-1g: 12 vCPUs + 85 GB + its A100, no spot SKU given: an estimate.
    a2 = table["gcp"]["europe-west4"]["a2-highgpu-1g"]
    assert a2["on_demand"] == pytest.approx(round(12 * 0.034806 + 85 * 0.004665 + 3.23, 4))
    assert a2["spot_estimated"] is True
    assert table["gcp"]["europe-west4"]["gpu:nvidia-tesla-t4"] == {"on_demand": 0.35, "spot": 0.069}
    # The home regions are kept.
    assert table["aws"]["us-east-1"] == json.loads(clouds.PRICES_FILE.read_text())["aws"]["us-east-1"]


def test_get_products_format_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    item = {"product": AWS_OFFER["products"]["SKU1"], "terms": {"OnDemand": AWS_OFFER["terms"]["OnDemand"]["SKU1"]}}
    assert price_refresh.aws_on_demand({"PriceList": [json.dumps(item)]}) == {("us-west-2", "g4dn.xlarge"): 0.526}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert price_refresh.main(["--aws-offer", str(bad), "--out", str(tmp_path / "p.json")]) == 1
    assert capsys.readouterr().err.startswith("price_refresh: ")
