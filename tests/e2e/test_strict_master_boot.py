"""The strict boot of `det deploy`'s master: the user-data infra/render.py writes for `det deploy aws`
and `det deploy gcp` runs unmodified in a clean Debian bookworm machine (tests/e2e/cloud_image.py:
Python 3.11 from Debian, systemd as PID 1, cloud-init, nothing of Shipyard), booted by
tests/e2e/container_boot.py. cloud-init installs the `packages` from the Debian mirror, writes the
files and runs the boot script, which creates the venv, fetches the release `det deploy` shipped
(cli/deploy_release.py: this checkout's wheel and its pins) from the emulated bucket and installs
it with pip; systemd starts shipyard-master.service, whose start program reads the passwords from
the secret store and execs det-master, which reaches a throwaway PostgreSQL (what RDS and Cloud SQL
are), answers on its port, launches an agent through moto (the GCE fake) whose own user-data boots
in a second clean machine (Debian bullseye, Python 3.9), whose boot installs its cloud's storage
client (boto3 / google-cloud-storage, at the agent constraints' pins) in the agent's venv, and a Core
API trial runs there and completes with its checkpoint in the cluster's bucket (moto's S3 / the GCS
emulator) and its output in the master's trial log API (shipped by that agent). A boot whose wheel is missing from the bucket fails.

On AWS the pools run trials in Docker, the cloud default (`container_runtime: docker`): the agent's
cloud-init installs Debian's docker.io, shipyard-docker-setup starts the engine, which pulls the
pool's environment image (`--cpu-env-image`) from a stand-in registry (tests/e2e/registry.py: a
`docker save` of the bullseye image, python3 and nothing of Shipyard) and the trial runs in a
container of it, the harness's libraries supplied by the agent (`container_harness_libs`). On GCP
the pools keep the process runtime (one Docker boot is enough for the suite's time).

What stands in, and how the machine is pointed at it (never by changing the user-data):
- the cloud API: moto's server / the GCE fake, at the endpoints the rendered master.yaml names;
- the metadata service and the secret store: for AWS, moto's Secrets Manager and S3 with moto's
  credentials (what the instance role would give); for GCP, FakeGcpIdentity (the metadata token,
  Secret Manager's access call) and gcp-storage-emulator. The master's machine gets their addresses
  as systemd's DefaultEnvironment (a drop-in in /etc/systemd/system.conf.d the test mounts), so
  cloud-init's runcmd and the master's unit both see them; the agent reads its identity (and on AWS
  its instance role's credentials, moto's, from IMDS's iam/security-credentials) from the metadata
  address 169.254.169.254 as on the cloud; on GCP the agent's machine gets the GCS emulator's address
  (STORAGE_EMULATOR_HOST) by the same kind of drop-in, which its trials inherit;
- the package index: a wheelhouse of exactly the release's pins (tests/e2e/wheelhouse.py), mounted
  read-only and named by PIP_NO_INDEX/PIP_FIND_LINKS in the same drop-in. Debian's apt downloads
  are kept in a cache outside the repository between runs (a local mirror would do the same);
- the image registry: the stand-in above, on 127.0.0.1 (an insecure registry to Docker by default).

One machine setting that is not a stand-in: the machines share this host's network namespace, so
the agent's machine gets an /etc/docker/daemon.json (DOCKER_DAEMON_JSON) that keeps its engine off
that network, where a VM's engine would have its own.

Needs a Docker engine, debootstrap and the Debian mirror (both images are built once and cached).
Measured on the 2-core test machine with warm caches: AWS 261 s, GCP 220 s (the master answers
after ~105 s: cloud-init ~65 s of which pip ~45 s; the agent's boot ~55 s), the failing boot 65 s,
before the containers were killed rather than removed at teardown (their removal, 20-75 s on the
vfs driver, now runs in the background and is waited for once, at the module's end). Since, with the
trial checkpointing to the bucket: AWS 89-143 s, GCP 100-128 s, the failing boot 55-72 s per test
body, teardown under 1 s, 30-50 s once at the module's end (busy shared cores). AWS with Docker:
146-252 s per body (the same code with the process runtime, run between them: 114 s; ~17 s of the
difference after the master answers: docker.io's install, the pull, the harness's libraries for the
image's Python), 366 s with cold caches (Debian's bullseye downloads, the image's `docker save`)."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from agent_bootstrap.cloud_init import agent_constraints
from cli import deploy_release
from infra import release as release_layout
from infra import render
from tests.conftest import ADMIN_PASSWORD
from tests.docker.conftest import docker_engine  # noqa: F401 (the engine fixture)
from tests.e2e.boot import Cloud, EmulatedInstance, FakeMetadataServer
from tests.e2e.cloud_image import CACHE_DIR, ImageUnavailable, ensure_image
from tests.e2e.conftest import REGION
from tests.e2e.container_boot import ContainerBootHarness, join_removals, metadata_address
from tests.e2e.registry import SavedImageRegistry, saved_image
from tests.e2e.test_deploy_boot import (
    DeployGceCloud,
    DeployMotoCloud,
    agents_of,
    aws_stack,
    gcp_stack,
    master_of,
    pg,  # noqa: F401 (the database fixture)
)
from tests.e2e.wheelhouse import WheelhouseUnavailable, ensure_wheelhouse
from tests.pg import missing_part

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.timeout(900)]

WHEELHOUSE = "/var/cache/shipyard-wheelhouse"
MASTER_UNIT = "shipyard-master.service"
# The machine shares this host's network namespace (host networking), where a Docker engine's
# defaults add a docker0 bridge (172.17.0.1/16 and its route), ip_forward, the DOCKER chains and a
# MASQUERADE rule, all left behind when it stops. On a cloud VM they would be the VM's own; here the machine's platform keeps the
# engine off the network, as the image keeps systemd-networkd off it (tests/e2e/cloud_image.py).
# Tasks use the host's network (agent/runtime/docker.py), so nothing they need is lost.
DOCKER_DAEMON_JSON = {"bridge": "none", "iptables": False, "ip-forward": False, "ip-masq": False}


class DeployContainerHarness(ContainerBootHarness):
    """The cluster's machines as clean containers: the master's from the bookworm image with its
    stand-ins' addresses in systemd's environment, the agents' from the bullseye image as in the
    agent's strict boot. The master never reads its own identity from the metadata address, so it
    may run beside the one agent that does."""

    def __init__(self, cloud: Cloud, root: Path, *, client: Any, metadata: FakeMetadataServer, master_id: str,
                 master_image: str, agent_image: str, master_env: dict[str, str], wheelhouse: Path) -> None:
        super().__init__(cloud, root, client=client, image=agent_image, metadata=metadata)
        self.master_id = master_id
        self.master_image = master_image
        self.master_env = {**master_env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE}
        self.wheelhouse = wheelhouse

    def image_for(self, inst: EmulatedInstance) -> str:
        return self.master_image if inst.id == self.master_id else self.image

    def unit_for(self, inst: EmulatedInstance) -> str:
        return MASTER_UNIT if inst.id == self.master_id else super().unit_for(inst)

    def asks_identity(self, inst: EmulatedInstance) -> bool:
        return inst.id != self.master_id

    def machine_binds(self, inst: EmulatedInstance) -> dict[str, dict[str, str]]:
        if inst.id != self.master_id:
            # The agents' machines: where the bucket is (GCP: the emulator; on AWS the storage
            # config names moto's endpoint and the credentials come from IMDS, as on EC2), Debian's
            # downloads kept between runs, and the engine's settings for a shared network.
            binds = {str(apt_cache("bullseye")): {"bind": "/var/cache/apt/archives", "mode": "rw"}}
            env = {k: v for k, v in self.master_env.items() if k == "STORAGE_EMULATOR_HOST"}
            if env:
                binds[str(stand_ins_dropin(inst, env))] = {"bind": "/etc/systemd/system.conf.d", "mode": "ro"}
            if "docker.io" in inst.doc.get("packages", []):
                daemon_json = inst.sandbox / "daemon.json"
                daemon_json.write_text(json.dumps(DOCKER_DAEMON_JSON))
                binds[str(daemon_json)] = {"bind": "/etc/docker/daemon.json", "mode": "ro"}
            return binds
        conf = stand_ins_dropin(inst, self.master_env)
        return {str(conf): {"bind": "/etc/systemd/system.conf.d", "mode": "ro"},
                str(self.wheelhouse): {"bind": WHEELHOUSE, "mode": "ro"},
                str(apt_cache("bookworm")): {"bind": "/var/cache/apt/archives", "mode": "rw"}}


def apt_cache(suite: str) -> Path:
    """Debian's downloads for `suite`, kept outside the repository between runs (a local mirror would do the same)."""
    apt = CACHE_DIR.parent / f"apt-archives-{suite}"
    (apt / "partial").mkdir(parents=True, exist_ok=True)
    return apt


def stand_ins_dropin(inst: EmulatedInstance, env: dict[str, str]) -> Path:
    """A systemd system.conf.d with `env` as the machine's DefaultEnvironment (the stand-ins' addresses)."""
    conf = inst.sandbox / "system.conf.d"
    conf.mkdir(parents=True, exist_ok=True)
    pairs = " ".join(f'"{k}={v}"' for k, v in sorted(env.items()))
    (conf / "90-stand-ins.conf").write_text(f"[Manager]\nDefaultEnvironment={pairs}\n")
    return conf


@pytest.fixture(scope="module", autouse=True)
def container_removals(docker_engine: Any) -> Iterator[None]:  # noqa: F811
    """The killed machines' containers are removed in the background while the next test runs; the
    module waits for them once, at its end, before the engine stops."""
    yield
    join_removals()


@pytest.fixture(scope="module")
def shipped_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[deploy_release.Release, Path]:
    """The release `det deploy` ships, and the wheelhouse standing in for the index its pins come from."""
    rel = deploy_release.build_release(tmp_path_factory.mktemp("release"))
    try:
        return rel, ensure_wheelhouse(rel.constraints)
    except WheelhouseUnavailable as e:
        missing_part(str(e))


@pytest.fixture
def images(docker_engine: Any) -> tuple[Any, str, str]:  # noqa: F811
    """(docker client, the master's bookworm image, the agents' bullseye image)."""
    client = docker_engine.client
    try:
        return client, ensure_image(client, "bookworm"), ensure_image(client, "bullseye")
    except ImageUnavailable as e:
        missing_part(f"a clean image cannot be built: {e}")


@pytest.fixture
def env_registry(images: tuple[Any, str, str]) -> Iterator[SavedImageRegistry]:
    """The stand-in registry of the pools' environment image: a clean Debian bullseye root with its
    python3 and nothing of Shipyard (the agents' own clean image, `docker save`d once and cached)."""
    client, _, bullseye = images
    registry = SavedImageRegistry(saved_image(client, bullseye, CACHE_DIR.parent / "registry-images"),
                                  "shipyard-e2e/debian-python", "bullseye")
    with registry.running():
        yield registry


@pytest.fixture
def cloud_metadata() -> Iterator[FakeMetadataServer]:
    with metadata_address() as server:
        yield server


@dataclass
class Machines:
    """What every strict master boot starts from: the engine, both images, the metadata address,
    the release and its wheelhouse."""

    client: Any
    bookworm: str
    bullseye: str
    metadata: FakeMetadataServer
    release: deploy_release.Release
    wheelhouse: Path

    def harness(self, cloud: Cloud, tmp_path: Path, master_id: str, env: dict[str, str]) -> DeployContainerHarness:
        return DeployContainerHarness(cloud, tmp_path / "instances", client=self.client, metadata=self.metadata,
                                      master_id=master_id, master_image=self.bookworm, agent_image=self.bullseye,
                                      master_env=env, wheelhouse=self.wheelhouse).start()


@pytest.fixture
def machines(images: tuple[Any, str, str], cloud_metadata: FakeMetadataServer,
             shipped_release: tuple[deploy_release.Release, Path]) -> Machines:
    return Machines(*images, cloud_metadata, *shipped_release)


def assert_master_machine(harness: DeployContainerHarness, master: EmulatedInstance, version: str) -> None:
    """The master runs the shipped wheel, on the image's own Debian Python 3.11, under systemd."""
    assert f"event=release_installed version={version}" in master.boot_log
    rc, out = harness.exec(master.id, ["sh", "-c", f"pid=$(systemctl show -p MainPID --value {MASTER_UNIT});"
                                       " readlink -f /proc/$pid/exe; cat /proc/$pid/cmdline | tr '\\0' ' '"])
    assert rc == 0, out
    assert out.split()[0] == "/usr/bin/python3.11", out  # the venv's python is Debian's
    assert "/opt/shipyard-master/bin/det-master" in out, out
    rc, out = harness.exec(master.id, ["/opt/shipyard-master/bin/pip", "show", "shipyard"])
    assert f"Version: {version}" in out, out
    harness.collect_logs(master)
    assert "event=secret_read" in master.agent_log
    assert ADMIN_PASSWORD not in master.boot_log + master.agent_log


TRIAL_LINE = "a trial on a strictly booted agent"
# The trial: a Core API loop that checkpoints to the cluster's storage (the bucket) from the agent.
CHECKPOINTING_TRAIN_PY = """\
from harness import core

print("a trial on a strictly booted agent")
with core.init() as ctx:
    for op in ctx.searcher.operations():
        with ctx.checkpoint.store_path({"steps_completed": op.length}) as (path, uuid):
            (path / "model.txt").write_text("trained on a strictly booted agent\\n")
        ctx.train.report_validation_metrics(op.length, {"loss": 0.125})
        op.report_completed(0.125)
"""


def run_checkpointing_trial(url: str, harness: DeployContainerHarness, master: EmulatedInstance) -> tuple[str, int]:
    """Run CHECKPOINTING_TRAIN_PY on the compute pool to its end: (its checkpoint's uuid, the trial's id)."""
    headers = {"Authorization": "Bearer " + httpx.post(f"{url}/api/v1/auth/login", timeout=30, json={
        "username": "admin", "password": ADMIN_PASSWORD}).json()["token"]}
    config = {"name": "strict-boot", "entrypoint": "python3 train.py", "max_restarts": 0,
              "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 2}},
              "resources": {"slots_per_trial": 1, "resource_pool": render.COMPUTE_POOL}}
    files = [{"path": "train.py", "type": 48, "content": base64.b64encode(CHECKPOINTING_TRAIN_PY.encode()).decode(),
              "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0}]
    r = httpx.post(f"{url}/api/v1/experiments", headers=headers, timeout=30,
                   json={"config": yaml.safe_dump(config), "modelDefinition": files, "activate": True})
    assert r.status_code == 200, r.text
    trial = r.json()["experiment"]["trialIds"][0]

    def ended() -> str | None:
        state = httpx.get(f"{url}/api/v1/trials/{trial}", headers=headers, timeout=30).json()["trial"]["state"]
        return state if state in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED") else None

    def logs() -> str:
        return httpx.get(f"{url}/api/v1/trials/{trial}/logs", headers=headers, timeout=30).text

    state = harness.wait_for(ended, 600, f"trial {trial} ended")
    assert state == "STATE_COMPLETED", f"{state}\n{logs()[-3000:]}\n{master.agent_log[-3000:]}"
    # The trial's own output comes back through the master's log API (what `det trial logs` reads),
    # shipped by the agent from the clean machine.
    try:
        harness.wait_for(lambda: TRIAL_LINE in logs(), 60, f"trial {trial}'s output in its logs")
    except AssertionError:
        [agent] = agents_of(harness, master.id)
        harness.collect_logs(agent)
        raise AssertionError(f"{logs()[-2000:]!r}\nagent: {agent.agent_log[-6000:]}") from None
    r = httpx.get(f"{url}/api/v1/trials/{trial}/checkpoints", headers=headers, timeout=30)
    [ckpt] = r.json()["checkpoints"]
    assert ckpt["state"] == "STATE_COMPLETED", ckpt
    return ckpt["uuid"], trial


def boot_cluster(harness: DeployContainerHarness, master_id: str, port: int, version: str) -> str:
    """Boot the master, check its machine, run a trial on the agent it launches, which checkpoints
    from the agent's own interpreter: the checkpoint's uuid."""
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{port}"
    master = master_of(harness, master_id, url, timeout=600)
    boot_s = time.monotonic() - t0
    print(f"master answered after {boot_s:.1f}s")
    assert_master_machine(harness, master, version)
    uuid, trial = run_checkpointing_trial(url, harness, master)
    [agent] = agents_of(harness, master_id)
    harness.collect_logs(agent)
    assert re.search(rf"event=task_start .* trial={trial}\b", agent.agent_log), agent.agent_log[-3000:]  # ran there
    # The storage client came from the boot's venv (Debian's python3 has none), pinned as constraints say.
    client = {"aws": "boto3", "gcp": "google-cloud-storage"}[harness.cloud.provider]
    rc, out = harness.exec(agent.id, ["/opt/shipyard-venv/bin/python", "-m", "pip", "list", "--format=freeze"])
    assert f"{client}=={agent_constraints((3, 9))[client]}" in out.splitlines(), out
    return uuid


def assert_ran_in_a_container(harness: DeployContainerHarness, agent: EmulatedInstance, image: str) -> None:
    """The trial ran in a container of `image` on the agent's own engine (the one its boot
    installed and shipyard-docker-setup started), which pulled it."""
    assert "event=docker_ready" in agent.boot_log, agent.boot_log[-3000:]
    assert re.search(rf"event=task_container_started .* image='{re.escape(image)}'", agent.agent_log), \
        agent.agent_log[-3000:]
    rc, out = harness.exec(agent.id, ["docker", "info", "--format", "{{.Driver}} {{.CgroupDriver}}"])
    print(f"the agent's engine: storage driver, cgroup driver: {out.strip()}")
    rc, out = harness.exec(agent.id, ["sh", "-c", "docker network ls --filter driver=bridge -q"])
    assert rc == 0 and out.strip() == "", out  # the agent's engine made no bridge on the network it shares with this host
    rc, out = harness.exec(agent.id, ["sh", "-c", "docker images --format '{{.Repository}}:{{.Tag}}';"
                                      " docker events --since 0 --until \"$(date +%s)\" --filter type=container"
                                      " --filter event=start --format '{{.Actor.Attributes.image}}"
                                      " {{.Actor.Attributes.name}}'"])
    assert rc == 0, out
    assert image in out.splitlines(), out  # pulled
    assert re.search(rf"^{re.escape(image)} shipyard-", out, re.M), out  # the trial's container started


def test_aws_master_boots_unmodified_in_a_clean_bookworm_machine_and_runs_a_trial_in_a_container_on_its_agent(
    tmp_path: Path, machines: Machines, moto_reset: str, aws_session: boto3.Session, moto_image: str,
    pg: str, monkeypatch: pytest.MonkeyPatch, env_registry: SavedImageRegistry,  # noqa: F811
) -> None:
    # The pools run trials in Docker (the cloud default), their image named by `--cpu-env-image`.
    st = aws_stack("strict-aws", moto_reset, aws_session, moto_image, pg, machines.release, monkeypatch,
                   env_image=env_registry.image)
    # The agents' instance profile: IMDS hands its trials moto's credentials, as EC2 would the role's.
    machines.metadata.instance_role = (f"{st.cid}-agent", st.env["AWS_ACCESS_KEY_ID"], st.env["AWS_SECRET_ACCESS_KEY"])
    harness = machines.harness(DeployMotoCloud(moto_reset, st.cid), tmp_path, st.master_id, st.env)
    try:
        t0 = time.monotonic()
        uuid = boot_cluster(harness, st.master_id, st.port, machines.release.version)
        print(f"strict aws master boot + trial: {time.monotonic() - t0:.1f}s")
        s3 = aws_session.client("s3", region_name=REGION, endpoint_url=moto_reset)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=st.facts.bucket, Prefix=f"checkpoints/{uuid}/")["Contents"]]
        assert f"checkpoints/{uuid}/model.txt" in keys, keys  # written by the agent, with its instance role
        [agent] = agents_of(harness, st.master_id)
        ec2 = aws_session.client("ec2", region_name=REGION, endpoint_url=moto_reset)
        launched = ec2.describe_instances(InstanceIds=[agent.id])["Reservations"][0]["Instances"][0]
        assert {t["Key"]: t["Value"] for t in launched["Tags"]}["shipyard:pool"] == render.COMPUTE_POOL
        assert_ran_in_a_container(harness, agent, env_registry.image)
        assert env_registry.pulled()
    finally:
        harness.stop()


def test_gcp_master_boots_unmodified_in_a_clean_bookworm_machine_and_runs_a_trial_on_its_agent(
    tmp_path: Path, machines: Machines, gce_fake: Any, pg: str, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    st = gcp_stack("strict-gcp", gce_fake, pg, machines.release, monkeypatch)
    harness = machines.harness(DeployGceCloud(gce_fake, st.cid), tmp_path, st.master_id, st.env)
    try:
        t0 = time.monotonic()
        uuid = boot_cluster(harness, st.master_id, st.port, machines.release.version)
        print(f"strict gcp master boot + trial: {time.monotonic() - t0:.1f}s")
        gcs = storage.Client(project="shipyard-e2e", credentials=AnonymousCredentials(),
                             client_options={"api_endpoint": st.gcs[0]})
        names = [b.name for b in gcs.list_blobs(st.facts.bucket, prefix=f"checkpoints/{uuid}/")]
        assert f"checkpoints/{uuid}/model.txt" in names, names
        assert st.identity.accessed[:1] == [st.facts.secret_id]
        [agent] = agents_of(harness, st.master_id)
        assert agent.id.startswith(render.agent_name_prefix(st.cid) + render.COMPUTE_POOL)
        assert gce_fake.sent[agent.id]["serviceAccounts"][0]["email"] == st.facts.agent_service_account
    finally:
        harness.stop()
        st.stop()


def test_master_boot_fails_when_the_wheel_is_missing_from_the_bucket(
    tmp_path: Path, machines: Machines, moto_reset: str, aws_session: boto3.Session, moto_image: str,
    pg: str, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    rel = machines.release
    st = aws_stack("strict-nowheel", moto_reset, aws_session, moto_image, pg, rel, monkeypatch)
    # `current` names the release, but its wheel is not there (an interrupted upload, a pruned bucket).
    aws_session.client("s3", region_name=REGION, endpoint_url=moto_reset).delete_object(
        Bucket=st.facts.bucket, Key=release_layout.wheel_key(rel.version, rel.wheel.name))
    harness = machines.harness(DeployMotoCloud(moto_reset, st.cid), tmp_path, st.master_id, st.env)
    try:
        with pytest.raises(AssertionError, match="failed to boot: BootError: cloud-init status"):
            master_of(harness, st.master_id, f"http://127.0.0.1:{st.port}", timeout=600)
        master = harness.instances[st.master_id]
        assert (f'event=boot_failed reason="the release object '
                f'{release_layout.wheel_key(rel.version, rel.wheel.name)} is missing') in master.boot_log
        rc, out = harness.exec(st.master_id, ["sh", "-c", "ls /opt/shipyard-master/bin/det-master;"
                                              f" systemctl is-active {MASTER_UNIT}"])
        assert "No such file" in out and "inactive" in out, out  # nothing else was installed or started
        assert not agents_of(harness, st.master_id)
    finally:
        harness.stop()
