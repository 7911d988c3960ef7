"""shipyard_common/clouds.py: the one catalogue of instance types and prices, and GCP's name rules."""

from __future__ import annotations

import pytest

from shipyard_common import clouds


@pytest.mark.parametrize(("project", "ok"), [
    ("my-project-1", True),
    ("abcdef", True),  # 6 characters, the shortest
    ("a" + "b" * 29, True),  # 30, the longest
    ("abcde", False),
    ("a" + "b" * 30, False),
    ("1project", False),
    ("my-project-", False),
    ("My-Project", False),
    ("my_project", False),
    ("example.com:my-project", False),
])
def test_project_ids(project: str, ok: bool) -> None:
    assert clouds.is_gcp_project_id(project) is ok


def test_domain_scoped_project_ids_only_when_asked() -> None:
    assert clouds.is_gcp_project_id("example.com:my-project", domain_scoped=True)
    assert not clouds.is_gcp_project_id("example.com:my-project-", domain_scoped=True)


def test_zones_and_regions() -> None:
    assert all(clouds.GCP_ZONE.match(z) for z in ("us-central1-a", "europe-west4-b", "northamerica-northeast1-c"))
    assert not any(clouds.GCP_ZONE.match(z) for z in ("us-central1", "us-central1-ab", "US-central1-a"))
    assert clouds.gcp_region("europe-west4-b") == "europe-west4"


def test_prices_of_both_clouds_and_unknown_types() -> None:
    assert clouds.on_demand_usd_per_hour("g4dn.xlarge") == 0.526
    # A2 priced by its parts (12 vCPU, 85 GB, one A100 40GB): $3.673385 an hour, rounded.
    assert clouds.on_demand_usd_per_hour("a2-highgpu-1g") == 3.6734
    assert clouds.on_demand_usd_per_hour("no-such-type") is None


def test_the_tables_agree_with_themselves() -> None:
    for table in (clouds.AWS_INSTANCE_TYPES, clouds.GCP_MACHINE_TYPES):
        for name, t in table.items():
            assert t.name == name and t.usd_per_hour > 0 and t.vcpus > 0
            assert bool(t.gpus) == bool(t.gpu_model), name
    assert not set(clouds.AWS_INSTANCE_TYPES) & set(clouds.GCP_MACHINE_TYPES)  # one lookup serves both
    assert clouds.gcp_gpu_of("a2-highgpu-8g") == "nvidia-tesla-a100" and clouds.gcp_gpu_of("n1-standard-8") == ""
