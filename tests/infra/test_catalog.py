"""infra/catalog.py and infra/settings.py read the one catalogue of types and prices and the one
project-id rule (shipyard_common/clouds.py) that the providers and the web UI read too."""

from __future__ import annotations

import pytest

from infra import catalog
from infra.settings import DeployInputError, GcpSettings
from shipyard_common import clouds


def test_the_catalog_is_the_shared_one() -> None:
    assert catalog.AWS_INSTANCE_TYPES is clouds.AWS_INSTANCE_TYPES
    assert catalog.GCP_MACHINE_TYPES is clouds.GCP_MACHINE_TYPES
    assert catalog.GCP_ATTACHABLE_GPUS is clouds.GCP_ATTACHABLE_GPUS
    assert catalog.gcp_agent_cost("a2-highgpu-1g", None, 0) == clouds.on_demand_usd_per_hour("a2-highgpu-1g")
    assert catalog.gcp_agent_cost("n1-standard-8", "nvidia-tesla-t4", 2) == pytest.approx(0.38 + 2 * 0.35)


def _gcp(project: str) -> GcpSettings:
    return GcpSettings(cluster_id="ml-prod", project=project, inbound_cidr="203.0.113.0/24")


@pytest.mark.parametrize("project", ["abcdef", "my-project-1", "a" + "b" * 29])
def test_project_ids_gcp_accepts(project: str) -> None:
    assert _gcp(project).project == project


@pytest.mark.parametrize("project", ["abcde", "my-project-", "1project", "my_project", "example.com:my-project"])
def test_project_ids_gcp_refuses(project: str) -> None:
    with pytest.raises(DeployInputError, match=f"--project: '{project}' is not a GCP project id"):
        _gcp(project)
