"""The strict boot (tests/e2e/container_boot.py): a pool's instance, launched by the master
through moto (AWS) or the GCE fake (GCP), boots its unmodified user-data in a clean Debian bullseye
machine (Python 3.9, the oldest the agent supports; systemd and cloud-init, nothing of Shipyard):
cloud-init installs the packages, the boot script reads the instance's id from the metadata
service at the cloud's own address (IMDSv2 at 169.254.169.254; metadata.google.internal), fetches
the agent from the master, installs what the distribution lacks, and systemd starts the agent,
which registers and runs a trial that imports the harness the agent shipped.

Needs a Docker engine (tests/docker/conftest.py; with CI=true a missing one fails), debootstrap and
the Debian mirror (the image is built once and cached outside the repository)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.docker.conftest import docker_engine  # noqa: F401 (the engine fixture)
from tests.e2e.boot import Cloud, FakeMetadataServer, GceFakeCloud, MotoCloud
from tests.e2e.cloud_image import ImageUnavailable, ensure_image
from tests.e2e.conftest import AGENT_OPTIONS, E2E, TRAIN_PY, aws_pool, default_subnet
from tests.e2e.container_boot import ROOT_KEY, ContainerBootHarness, metadata_address
from tests.e2e.test_elastic_pools import assert_agent_registered, assert_ran_on, trial_logs
from tests.pg import missing_part
from tests.provisioners.conftest import Ec2FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture
def cloud_metadata() -> Iterator[FakeMetadataServer]:
    with metadata_address() as server:
        yield server


def gcp_pool(endpoint: str) -> dict[str, Any]:
    return {"name": "gcp", "provider": {
        "type": "gcp", "project": "shipyard-e2e", "zones": ["us-central1-a"], "machine_type": "e2-standard-4",
        "instance_slots": 1, "boot_disk_source_image": "projects/debian-cloud/global/images/family/debian-11",
        "api_endpoint": endpoint, "min_instances": 0, "max_instances": 1, "max_idle_agent_period": "60s",
        "agent": dict(AGENT_OPTIONS)}}


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_agent_boots_unmodified_in_a_clean_python39_machine_and_trains(
    provider: str, request: pytest.FixtureRequest, e2e: E2E, docker_engine: object,  # noqa: F811
    cloud_metadata: FakeMetadataServer,
) -> None:
    client = docker_engine.client  # type: ignore[attr-defined]
    try:
        image = ensure_image(client, "bullseye")
    except ImageUnavailable as e:
        missing_part(f"the clean bullseye image cannot be built: {e}")
    cloud: Cloud
    if provider == "aws":
        moto_url: str = request.getfixturevalue("moto_reset")
        ec2_faults: Ec2FaultProxy = request.getfixturevalue("ec2_faults")
        subnet = default_subnet(moto_url, request.getfixturevalue("aws_session"))
        e2e.start_master([aws_pool("aws", ec2_faults.url, request.getfixturevalue("moto_image"), subnet,
                                   max_instances=1, max_idle_agent_period="60s")], "aws")
        cloud = MotoCloud(moto_url)
    else:
        fake = request.getfixturevalue("gce_fake")
        e2e.start_master([gcp_pool(fake.endpoint)], "gcp", module="tests.e2e.gce_fake_master")
        cloud = GceFakeCloud(fake)
    harness = ContainerBootHarness(cloud, e2e.tmp / "instances", client=client, image=image,
                                   metadata=cloud_metadata)
    e2e.harnesses.append(harness.start())

    # The trial says who it runs as: on a cloud host's layout the agent (root) runs it as its
    # owner's unprivileged uid, as a real user's trial would.
    trial_id = e2e.create_experiment(provider, "import os\nprint('trial uid', os.getuid(), flush=True)\n"
                                     + TRAIN_PY)["trialIds"][0]
    inst = harness.wait_for(
        lambda: next((i for i in harness.instances.values() if i.state == "running"), None), 900,
        "the instance booted by cloud-init with its agent's unit active")
    # The metadata service at the cloud's own address: IMDSv2 (a session token first, then the
    # instance id with it) on AWS; the instance name with Metadata-Flavor on GCE.
    hits = [(h.method, h.path, h.status) for h in cloud_metadata.hits_for(ROOT_KEY)]
    if provider == "aws":
        assert hits[:2] == [("PUT", "/latest/api/token", 200), ("GET", "/latest/meta-data/instance-id", 200)]
    else:
        assert hits[:1] == [("GET", "/computeMetadata/v1/instance/name", 200)]
    # The agent runs on the image's own Python 3.9, from the code its master served.
    rc, out = harness.exec(inst.id, ["sh", "-c", "pid=$(systemctl show -p MainPID --value shipyard-agent.service);"
                                     " readlink -f /proc/$pid/exe; python3 --version"])
    assert rc == 0, out
    exe, version = out.split()[0], out.split()[-1]
    assert version.startswith("3.9."), out
    rc, agent_py = harness.exec(inst.id, [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    assert agent_py.strip() == "3.9", agent_py

    e2e.wait_trial_completed(trial_id, 300, harness)
    trial = e2e.trial(trial_id)
    assert trial["state"] == "STATE_COMPLETED"
    assert_agent_registered(e2e, inst, provider)
    assert_ran_on(e2e, trial_id, inst.id)
    uids = [int(e["log"].split()[-1]) for e in trial_logs(e2e, trial_id) if e["log"].startswith("trial uid")]
    assert uids and all(uid >= 200000 for uid in uids), uids  # task_uid_base + the owner's id, not root
    # The bootstrap token only in its 0600 file, never in a log.
    rc, out = harness.exec(inst.id, ["stat", "-c", "%a", "/etc/shipyard/agent-token"])
    assert out.strip() == "600", out
    rc, token = harness.exec(inst.id, ["cat", "/etc/shipyard/agent-token"])
    harness.collect_logs(inst)
    assert token.strip() and token.strip() not in inst.boot_log + inst.agent_log
