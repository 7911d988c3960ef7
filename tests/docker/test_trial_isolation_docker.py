"""Issue 27, item 1 under the Docker runtime: the probe of tests/integration/test_trial_isolation.py
in a container. The container runs as its user's uid (not root, not privileged, no capabilities,
no_new_privileges) and sees no host path but its task directory, its checkpoint storage and the
agent's read-only container_mounts: every secret is missing (ENOENT) or refused (EACCES). An
experiment that asks for more (a bind mount of the state dir, a device, a capability) is refused
unless the master allows it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import yaml

from tests.docker.conftest import Engine
from tests.docker.images import host_mounts, image_path_env
from tests.integration.conftest import Cluster, model_files, trial_config
from tests.integration.test_trial_isolation import isolated_cluster, probe_secrets

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="the agent gives task directories to task users")]


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest, docker_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setenv("DOCKER_HOST", docker_engine.socket_url)
    monkeypatch.setenv("DET_AGENT_CONTAINER_MOUNTS", ",".join(host_mounts()))
    with isolated_cluster(request, runtime="docker", image=docker_engine.image) as c:
        yield c


def test_a_non_admins_container_reads_none_of_the_clusters_secrets(cluster: Cluster) -> None:
    env = {"PATH": image_path_env().split("=", 1)[1]}
    uid, results = probe_secrets(cluster, env)  # no capabilities, no_new_privs: checked there
    assert uid != 0
    # The state dir exists in the container only as the empty scaffolding Docker makes on the way to
    # the task directory's mount point (agents/local-N/tasks/<task>); nothing of the host's is in it.
    assert results.pop("state_dir") in ("READ", "ENOENT")
    assert results["admin_password"] == results["credential_0"] == results["token_secret"] == "ENOENT"
    assert set(results.values()) <= {"EACCES", "ENOENT"}, results


def test_a_config_asking_for_host_access_is_refused(cluster: Cluster) -> None:
    for extra, field in (({"bind_mounts": [{"host_path": str(cluster.state), "container_path": "/state"}]},
                          "config.bind_mounts"),
                         ({"resources": {"devices": [{"host_path": "/dev/mem", "container_path": "/dev/mem"}]}},
                          "config.resources.devices"),
                         ({"environment": {"add_capabilities": ["SYS_ADMIN"]}}, "config.environment.add_capabilities")):
        assert cluster.client is not None
        r = cluster.client.post("/api/v1/experiments", json={
            "config": yaml.safe_dump(trial_config("greedy", **extra)), "modelDefinition": model_files()})
        assert r.status_code == 400 and field in r.text and "allow_task_host_access" in r.text, r.text

