"""`det deploy`'s master in the emulated boot of tests/e2e/boot.py, and what the strict boot of the
master (tests/e2e/test_strict_master_boot.py, which imports the stack helpers below) shares with it.

The stack helpers (`aws_stack`, `gcp_stack`) make in the fakes what the Pulumi stack would have
created (addresses, subnet, security group, instance profile, bucket, the secret), ship the release
`det deploy` ships (cli/deploy_release.py: this checkout's wheel and its pins) to the emulated bucket
(moto's S3, gcp-storage-emulator), and launch the master's instance with its rendered user-data. The
secret store: AWS Secrets Manager is moto's; for GCP there is no Secret Manager emulator, so a small
fake below serves both the GCE metadata token endpoint (GCE_METADATA_HOST, as google-auth reads it)
and Secret Manager's `versions/latest:access`. The database is a throwaway PostgreSQL (what RDS and
Cloud SQL are): its URL is the secret's.

Here the master boots emulated (cloud-init's `packages` skipped, the dependencies its pip would
download are this virtualenv's: PYTHONPATH, PIP_NO_INDEX=1), which is fast enough for the one thing
the strict boot does not cover: `det deploy aws upgrade` while a trial trains (about 40 s). The first
boot itself, both clouds, is the strict boot's.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import httpx
import pytest
import yaml

from cli import deploy_cloud, deploy_release
from infra import DEPLOY_TAG, render
from infra.settings import AwsSettings, GcpSettings
from tests.conftest import ADMIN_PASSWORD
from tests.e2e.boot import (
    _AWS_STATES,
    _GCE_STATES,
    BootHarness,
    CloudView,
    EmulatedInstance,
    GceFakeCloud,
    MotoCloud,
)
from tests.e2e.conftest import AGENT_OPTIONS, REGION, TRAIN_PY, default_subnet, wait_for
from tests.infra.conftest import dependencies_dir
from tests.pg import free_port

if TYPE_CHECKING:
    from tests.fakes.gce import GceFake
    from tests.pg import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.timeout(300)]


class DeployMotoCloud(MotoCloud):
    """The cluster's instances by the deployment's tag: the master (which carries no managed-by tag)
    and the agents its pools launch."""

    def __init__(self, endpoint_url: str, cluster_id: str) -> None:
        super().__init__(endpoint_url, REGION)
        self.cluster_id = cluster_id

    def instances(self) -> list[CloudView]:
        resp = self.ec2.describe_instances(Filters=[{"Name": f"tag:{DEPLOY_TAG}", "Values": [self.cluster_id]}])
        return [CloudView(i["InstanceId"], _AWS_STATES.get(i["State"]["Name"], "gone"))
                for r in resp["Reservations"] for i in r["Instances"]]


class DeployGceCloud(GceFakeCloud):
    def __init__(self, fake: Any, cluster_id: str) -> None:
        super().__init__(fake)
        self.cluster_id = cluster_id

    def instances(self) -> list[CloudView]:
        return [CloudView(i["name"], _GCE_STATES.get(i.get("status", ""), "gone")) for i in self.fake.instances
                if i.get("labels", {}).get(DEPLOY_TAG) == self.cluster_id]


class EnvHarness(BootHarness):
    """The emulated instances see `extra_env` (endpoints of the fakes, moto's credentials), as a
    real instance sees its cloud through its instance role and the real endpoints."""

    def __init__(self, *args: Any, extra_env: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extra_env = extra_env

    def _base_env(self, inst: EmulatedInstance) -> dict[str, str]:
        return {**super()._base_env(inst), **self.extra_env}


class FakeGcpIdentity:
    """GCE metadata (ping, service account, token, project) and Secret Manager's access call."""

    TOKEN = "fake-access-token"

    def __init__(self, project: str) -> None:
        self.project = project
        self.secrets: dict[str, str] = {}  # projects/P/secrets/NAME -> payload
        self.accessed: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def host(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        path = path.split("?", 1)[0]
        sa = "/computeMetadata/v1/instance/service-accounts/default/"
        if path.startswith("/computeMetadata/"):
            if headers.get("metadata-flavor") != "Google":
                return 403, "Missing Metadata-Flavor:Google header"
            if path == sa:
                return 200, {"email": f"master@{self.project}.iam.gserviceaccount.com", "aliases": ["default"],
                             "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
            if path == sa + "token":
                return 200, {"access_token": self.TOKEN, "expires_in": 3600, "token_type": "Bearer"}
            if path == "/computeMetadata/v1/project/project-id":
                return 200, self.project
            return 404, "not found"
        if path.startswith("/v1/") and path.endswith("/versions/latest:access"):
            if headers.get("authorization") != f"Bearer {self.TOKEN}":
                return 401, "no token"
            name = path.removeprefix("/v1/").removesuffix("/versions/latest:access")
            if name not in self.secrets:
                return 404, "no such secret"
            self.accessed.append(name)
            data = base64.b64encode(self.secrets[name].encode()).decode()
            return 200, {"name": f"{name}/versions/1", "payload": {"data": data}}
        return 200, ""  # the metadata server's ping (GET /)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = fake._answer(self.path, {k.lower(): v for k, v in self.headers.items()})
                data = (json.dumps(body) if isinstance(body, dict) else str(body)).encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


# ---- helpers -----------------------------------------------------------------------------------


def master_of(harness: BootHarness, master_id: str, url: str, timeout: float = 150) -> EmulatedInstance:
    """The master's emulated instance, once its det-master answers."""
    def up() -> EmulatedInstance | None:
        inst = harness.instances.get(master_id)
        if inst is None or inst.state != "running":
            return None
        try:
            return inst if httpx.get(url + "/info", timeout=2).status_code == 200 else None
        except httpx.HTTPError:
            return None

    return harness.wait_for(up, timeout, "the master installed from the bucket and started")


def run_trial(url: str, pool: str, harness: BootHarness, master: EmulatedInstance, timeout: float = 60) -> int:
    r = httpx.post(url + "/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD}, timeout=30)
    assert r.status_code == 200, r.text  # the admin password came from the secret store
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    config = {"name": "deploy-e2e", "entrypoint": "python3 train.py",
              "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True,
                           "max_length": {"batches": 2}},
              "resources": {"slots_per_trial": 1, "resource_pool": pool}, "max_restarts": 0}
    files = [{"path": "train.py", "type": 48, "content": base64.b64encode(TRAIN_PY.encode()).decode(),
              "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0}]
    r = httpx.post(url + "/api/v1/experiments", headers=headers, timeout=30,
                   json={"config": yaml.safe_dump(config), "modelDefinition": files, "activate": True})
    assert r.status_code == 200, r.text
    trial_id = r.json()["experiment"]["trialIds"][0]

    def done() -> bool:
        state = httpx.get(f"{url}/api/v1/trials/{trial_id}", headers=headers, timeout=30).json()["trial"]["state"]
        if state in ("STATE_ERROR", "STATE_CANCELED"):
            r = httpx.get(f"{url}/api/v1/trials/{trial_id}/logs", headers=headers, timeout=30)
            raise AssertionError(f"trial {trial_id} ended {state}\n{r.text[-3000:]}\n{master.agent_log[-3000:]}")
        return state == "STATE_COMPLETED"

    try:
        harness.wait_for(done, timeout, f"trial {trial_id} completed")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{master.agent_log[-4000:]}") from None
    return trial_id


def agents_of(harness: BootHarness, master_id: str) -> list[EmulatedInstance]:
    return [i for i in harness.instances.values() if i.id != master_id]


def assert_no_secret_in(user_data: str, *secrets: str) -> None:
    for s in secrets:
        assert s not in user_data


def gcs_server(bucket: str) -> tuple[str, Any]:
    """gcp-storage-emulator with the checkpoint bucket the stack would have created."""
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    host = f"http://127.0.0.1:{port}"
    client = storage.Client(project="shipyard-e2e", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": host})
    client.create_bucket(bucket)
    return host, server


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[deploy_release.Release, Path]:
    """The release `det deploy` would ship, and the dependencies its pip would download."""
    return (deploy_release.build_release(tmp_path_factory.mktemp("release")),
            dependencies_dir(tmp_path_factory.mktemp("deps")))


def index_env(deps: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(deps), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[str]:
    server: PostgresServer = request.getfixturevalue("postgres_server")
    yield server.create_database()


# ---- AWS -------------------------------------------------------------------------------------------


@dataclass
class AwsCluster:
    """A `det deploy aws` cluster booted from its rendered user-data: the stack's resources made in
    moto, the release shipped to its bucket, the master's instance launched and booted."""

    cid: str
    url: str
    master_id: str
    settings: AwsSettings
    facts: render.AwsFacts
    harness: BootHarness
    master: EmulatedInstance

    def outputs(self) -> dict[str, Any]:
        """The stack outputs `det deploy aws upgrade` reads."""
        return {"cluster_id": self.cid, "region": REGION, "checkpoint_bucket": self.facts.bucket,
                "master_instance_id": self.master_id}


@dataclass
class AwsStack:
    """What the stack would have created (in moto), the release shipped to its bucket, and the
    master's instance launched with its rendered user-data (not booted yet)."""

    cid: str
    port: int
    master_id: str
    settings: AwsSettings
    facts: render.AwsFacts
    user_data: str
    env: dict[str, str]  # what the instance sees of its cloud: moto's endpoints and credentials


def aws_stack(cid: str, moto_reset: str, aws_session: boto3.Session, moto_image: str, pg: str,
              release: deploy_release.Release, monkeypatch: pytest.MonkeyPatch,
              env_image: str | None = None) -> AwsStack:
    """`env_image`: the pools run trials in Docker with this image (`--cpu-env-image`); without it,
    as processes."""
    port = free_port()
    ec2 = aws_session.client("ec2", region_name=REGION, endpoint_url=moto_reset)
    iam = aws_session.client("iam", region_name=REGION, endpoint_url=moto_reset)
    sm = aws_session.client("secretsmanager", region_name=REGION, endpoint_url=moto_reset)
    # What the stack would have created, in moto.
    subnet = default_subnet(moto_reset, aws_session)
    vpc = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["VpcId"]
    sg = ec2.create_security_group(GroupName=f"shipyard-{cid}-agents", Description="agents", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="e2e-key")
    aws_session.client("s3", region_name=REGION, endpoint_url=moto_reset).create_bucket(Bucket=f"shipyard-{cid}-ckpt")
    iam.create_role(RoleName=f"shipyard-{cid}-agent", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName=f"shipyard-{cid}-agent")
    secret_arn = sm.create_secret(Name=f"shipyard/{cid}/master",
                                  SecretString=render.secret_payload(ADMIN_PASSWORD, pg))["ARN"]

    s = AwsSettings(cluster_id=cid, keypair="e2e-key", inbound_cidr="203.0.113.0/24", port=port,
                    agent_ami=moto_image, aux_ami=moto_image, max_dynamic_agents=1, max_idle_agent_period="5m",
                    **({"container_runtime": "docker", "cpu_env_image": env_image} if env_image
                       else {"container_runtime": "process"}))
    facts = render.AwsFacts(master_private_ip="127.0.0.1", bucket=f"shipyard-{cid}-ckpt", subnet_ids=(subnet,),
                            agent_security_group_id=sg, agent_instance_profile=f"shipyard-{cid}-agent",
                            secret_id=secret_arn, endpoint_url=moto_reset, agent_options=dict(AGENT_OPTIONS),
                            host="127.0.0.1")
    user_data = render.master_user_data("aws", render.aws_master_config(s, facts), secret_id=secret_arn,
                                        region=REGION, package=s.shipyard_package, cluster_id=cid)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_reset)
    deploy_release.ship("aws", facts.bucket, release, cluster_id=cid, region=REGION)
    assert_no_secret_in(user_data, ADMIN_PASSWORD, pg)
    master_id = ec2.run_instances(
        ImageId=moto_image, InstanceType=s.master_instance_type, MinCount=1, MaxCount=1, SubnetId=subnet,
        UserData=user_data, TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": k, "Value": v} for k, v in {**s.all_tags, "Name": f"shipyard-{cid}-master"}.items()]}],
    )["Instances"][0]["InstanceId"]
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL_SECRETS_MANAGER": moto_reset, "AWS_ENDPOINT_URL_S3": moto_reset}
    return AwsStack(cid, port, master_id, s, facts, user_data, env)


@contextlib.contextmanager
def aws_cluster(cid: str, tmp_path: Path, moto_reset: str, aws_session: boto3.Session, moto_image: str, pg: str,
                shipped: tuple[deploy_release.Release, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsCluster]:
    st = aws_stack(cid, moto_reset, aws_session, moto_image, pg, shipped[0], monkeypatch)
    harness = EnvHarness(DeployMotoCloud(moto_reset, cid), tmp_path / "instances",
                         extra_env={**st.env, **index_env(shipped[1])}).start()
    try:
        url = f"http://127.0.0.1:{st.port}"
        yield AwsCluster(cid, url, st.master_id, st.settings, st.facts, harness, master_of(harness, st.master_id, url))
    finally:
        harness.stop()


# ---- AWS: `det deploy aws upgrade` while a trial trains ---------------------------------------------
#
# The release of a new version goes to the bucket, the master's instance is stopped and started through
# EC2 (moto), its unit's ExecStartPre installs the new release before det-master starts again, and the
# trial, which kept training on its agent meanwhile, finishes in its first run with every metric it
# reported exactly once. The one thing the test adds to the cloud's behaviour is time: moto stops an
# instance at once, so the CLI's stop call returns once the emulated instance has powered down (a real
# stop takes a while) before the CLI goes on to start it.

UPGRADE_STEPS = 40

# Reports a training metric every 0.4 s for UPGRADE_STEPS steps (about 16 s: longer than the master's
# restart), then its validation.
UPGRADE_TRAIN_PY = f"""\
import time
from harness import core

with core.init() as ctx:
    for op in ctx.searcher.operations():
        for step in range(1, {UPGRADE_STEPS} + 1):
            ctx.train.report_training_metrics(step, {{"loss": 1.0 / step}})
            time.sleep(0.4)
        ctx.train.report_validation_metrics({UPGRADE_STEPS}, {{"loss": 0.125}})
        op.report_completed(0.125)
print("e2e trial done", flush=True)
"""


def bumped_wheel(wheel: Path, version: str, out: Path) -> Path:
    """The same wheel as another version: its dist-info renamed, METADATA's Version and RECORD's
    hashes rewritten, as a build of the next version would be."""
    name, old = wheel.name.split("-")[:2]
    old_info, new_info = f"{name}-{old}.dist-info/", f"{name}-{version}.dist-info/"
    target = out / wheel.name.replace(f"-{old}-", f"-{version}-")
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as src:
        for item in src.infolist():
            data = src.read(item)
            path = item.filename.replace(old_info, new_info, 1)
            if path == new_info + "METADATA":
                data = data.replace(f"\nVersion: {old}\n".encode(), f"\nVersion: {version}\n".encode(), 1)
            files[path] = data
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        if path == new_info + "RECORD":
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([new_info + "RECORD", "", ""])
    files[new_info + "RECORD"] = record.getvalue().encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for path, data in files.items():
            dst.writestr(path, data)
    return target


class StopTakesTime:
    """moto's EC2 client for the CLI, whose stop returns once the emulated instance is down."""

    def __init__(self, ec2: Any, cluster: AwsCluster) -> None:
        self._ec2, self._cluster = ec2, cluster

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ec2, name)

    def stop_instances(self, **kwargs: Any) -> Any:
        answer = self._ec2.stop_instances(**kwargs)
        self._cluster.harness.wait_for(lambda: self._cluster.master.state == "stopped", 60,
                                       "the master's instance powered down")
        return answer


def submit_long_trial(url: str, headers: dict[str, str]) -> int:
    config = {"name": "upgrade-e2e", "entrypoint": "python3 train.py",
              "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True,
                           "max_length": {"batches": UPGRADE_STEPS}},
              "resources": {"slots_per_trial": 1, "resource_pool": render.COMPUTE_POOL}, "max_restarts": 0,
              # The bucket's keys (moto's): this harness's agents are processes with no instance role
              # to ask, and a task never inherits its agent's credentials (shipyard_common/host_env.py).
              "environment": {"environment_variables": ["AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing"]}}
    files = [{"path": "train.py", "type": 48, "content": base64.b64encode(UPGRADE_TRAIN_PY.encode()).decode(),
              "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0}]
    r = httpx.post(url + "/api/v1/experiments", headers=headers, timeout=30,
                   json={"config": yaml.safe_dump(config), "modelDefinition": files, "activate": True})
    assert r.status_code == 200, r.text
    return int(r.json()["experiment"]["trialIds"][0])


def training_steps(url: str, headers: dict[str, str], trial_id: int) -> list[tuple[int, int]]:
    r = httpx.get(f"{url}/api/v1/trials/{trial_id}/metrics", headers=headers, params={"group": "training"},
                  timeout=30)
    r.raise_for_status()
    return [(m["stepsCompleted"], m["trialRunId"]) for m in r.json()["metrics"]]


def test_upgrade_restarts_the_master_on_the_new_release_and_the_trial_loses_no_metric(
    tmp_path: Path, moto_reset: str, aws_session: boto3.Session, moto_image: str, pg: str,
    shipped: tuple[deploy_release.Release, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = shipped[0]
    new_version = old.version + ".post1"
    with aws_cluster("e2e-upgrade", tmp_path, moto_reset, aws_session, moto_image, pg, shipped, monkeypatch) as c:
        r = httpx.post(c.url + "/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD},
                       timeout=30)
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        trial_id = submit_long_trial(c.url, headers)
        wait_for(lambda: len(training_steps(c.url, headers, trial_id)) >= 3, 120, "the trial reporting metrics")

        # `upgrade` as the CLI runs it, with the next version's wheel as this checkout's build.
        def build(out: Path) -> deploy_release.Release:
            (out / "constraints.txt").write_bytes(old.constraints.read_bytes())
            return deploy_release.Release(new_version, bumped_wheel(old.wheel, new_version, out),
                                          out / "constraints.txt")

        monkeypatch.setattr(deploy_cloud, "build_release", build)
        ec2 = aws_session.client("ec2", region_name=REGION, endpoint_url=moto_reset)
        monkeypatch.setattr(deploy_cloud, "_ec2", lambda region: StopTakesTime(ec2, c))
        during = len(training_steps(c.url, headers, trial_id))
        assert deploy_cloud.upgrade("aws", c.outputs(), wait_s=120, poll_s=0.5) == new_version

        c.harness.wait_for(lambda: c.master.starts == 2 and c.master.state == "running", 180,
                           "the master started again")
        assert f"event=release_installed version={new_version}" in c.master.agent_log
        master_of(c.harness, c.master_id, c.url)  # answering again

        def done() -> bool:
            t = httpx.get(f"{c.url}/api/v1/trials/{trial_id}", headers=headers, timeout=30).json()["trial"]
            assert t["state"] not in ("STATE_ERROR", "STATE_CANCELED"), t
            return t["state"] == "STATE_COMPLETED"

        wait_for(done, 120, f"trial {trial_id} completed")
        trial = httpx.get(f"{c.url}/api/v1/trials/{trial_id}", headers=headers, timeout=30).json()["trial"]
        assert trial["restarts"] == 0
        steps = training_steps(c.url, headers, trial_id)
        assert during < UPGRADE_STEPS, "the upgrade ran after the trial had finished: it proves nothing"
        assert steps == [(step, 1) for step in range(1, UPGRADE_STEPS + 1)]  # each once, from the first run


# ---- GCP -------------------------------------------------------------------------------------------


@dataclass
class GcpStack:
    """The GCP twin of AwsStack: the identity and Secret Manager fake holding the secret, the GCS
    emulator holding the release, the master's instance in the GCE fake with its user-data."""

    cid: str
    port: int
    master_id: str
    settings: GcpSettings
    facts: render.GcpFacts
    identity: FakeGcpIdentity
    gcs: tuple[str, Any]
    env: dict[str, str]

    def stop(self) -> None:
        self.identity.stop()
        self.gcs[1].stop()


def gcp_stack(cid: str, gce_fake: GceFake, pg: str, release: deploy_release.Release,
              monkeypatch: pytest.MonkeyPatch) -> GcpStack:
    project, zone = "shipyard-e2e", "us-central1-a"
    port = free_port()
    identity = FakeGcpIdentity(project)
    secret_name = f"projects/{project}/secrets/{cid}-master"
    identity.secrets[secret_name] = render.secret_payload(ADMIN_PASSWORD, pg)
    gcs = gcs_server(f"{project}-{cid}-ckpt")

    s = GcpSettings(cluster_id=cid, project=project, zone=zone, inbound_cidr="203.0.113.0/24", port=port,
                    max_dynamic_agents=1, max_idle_agent_period="5m", container_runtime="process")
    facts = render.GcpFacts(master_private_ip="127.0.0.1", bucket=f"{project}-{cid}-ckpt",
                            network=f"projects/{project}/global/networks/{cid}-net",
                            subnetwork=f"regions/{s.region}/subnetworks/{cid}-subnet",
                            agent_service_account=f"{cid}-agent@{project}.iam.gserviceaccount.com",
                            secret_id=secret_name, api_endpoint=gce_fake.endpoint,
                            agent_options=dict(AGENT_OPTIONS), host="127.0.0.1")
    config = render.gcp_master_config(s, facts)
    user_data = render.master_user_data("gcp", config, secret_id=secret_name, region=s.region,
                                        package=s.shipyard_package, cluster_id=cid)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs[0])
    deploy_release.ship("gcp", facts.bucket, release, cluster_id=cid, project=project)
    assert_no_secret_in(user_data, ADMIN_PASSWORD, pg)
    gce_fake.add_instance(project=project, zone=zone, name=f"{cid}-master", labels=s.all_tags,
                          metadata={"user-data": user_data})
    env = {"GCE_METADATA_HOST": identity.host, "GCE_METADATA_IP": identity.host,
           "SHIPYARD_SECRET_MANAGER_URL": f"http://{identity.host}", "STORAGE_EMULATOR_HOST": gcs[0]}
    return GcpStack(cid, port, f"{cid}-master", s, facts, identity, gcs, env)
