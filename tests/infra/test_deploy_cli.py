"""`det deploy aws|gcp`: flag validation (one line, before any cloud call), the missing-CLI message,
`render` (checked by the master's config loader and `cloud-init schema`), `list`/`describe` over a
local state directory, and `down`'s agent sweep against moto."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest

from cli import deploy_cloud
from cli.errors import CliError
from control_plane.config import load_config
from infra import DEPLOY_TAG
from tests.cli.conftest import (  # noqa: F401 (fixtures)
    Det,
    cli_env,  # noqa: F401
    det,
)
from tests.pg import missing_part
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401

CLOUD_INIT = shutil.which("cloud-init")  # looked up before a test empties PATH
AWS_OK = ["--cluster-id", "ml-prod", "--keypair", "ops", "--inbound-cidr", "203.0.113.0/24"]
GCP_OK = ["--cluster-id", "ml-prod", "--project", "my-project-1", "--inbound-cidr", "203.0.113.0/24"]


@pytest.fixture
def no_pulumi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("pulumi") is None


def _without(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


@pytest.mark.parametrize(("cloud", "argv", "expected"), [
    ("aws", _without(AWS_OK, "--cluster-id"), "--cluster-id: required"),
    ("aws", _without(AWS_OK, "--keypair"), "--keypair: required"),
    ("aws", [*AWS_OK[:-1], "10.0.0/8"], "--inbound-cidr: '10.0.0/8' is not a CIDR block"),
    ("aws", [*AWS_OK[:-1], "0.0.0.0/0"], "--inbound-cidr: 0.0.0.0/0 would open SSH to the whole internet"),
    ("aws", [*AWS_OK, "--region", "mars-1"], "--region: unknown AWS region 'mars-1'"),
    ("aws", [*AWS_OK, "--compute-agent-instance-type", "x9.huge"], "--compute-agent-instance-type: unknown instance type"),
    ("aws", [*AWS_OK, "--compute-agent-instance-type", "t3.large"], "has no GPU"),
    ("aws", [*AWS_OK, "--db-password", "short"], "--db-password: too short"),
    ("aws", [*AWS_OK, "--db-password", "has/slash-123"], "--db-password: must not contain '/'"),
    ("aws", [*AWS_OK, "--spot-max-price", "0.5"], "--spot-max-price: only applies with --spot"),
    ("aws", [*AWS_OK, "--min-dynamic-agents", "4", "--max-dynamic-agents", "2"], "--min-dynamic-agents: 4 is more"),
    ("aws", [*AWS_OK, "--add-tag", "novalue"], "--add-tag: 'novalue' is not key=value"),
    ("aws", [*AWS_OK[:1], "Bad_Id", *AWS_OK[2:]], "--cluster-id: 'Bad_Id' must be"),
    ("gcp", _without(GCP_OK, "--project"), "--project: required"),
    ("gcp", [*GCP_OK[:3], "my-project-", *GCP_OK[4:]], "--project: 'my-project-' is not a GCP project id"),
    ("gcp", [*GCP_OK, "--zone", "us-central1-z"], "--zone: unknown GCP zone"),
    ("gcp", [*GCP_OK, "--zone", "us-east1-c", "--gpu-type", "nvidia-tesla-v100"],
     "--gpu-type: 'nvidia-tesla-v100' is not offered in us-east1-c"),
    ("gcp", [*GCP_OK, "--master-instance-type", "n9-mega"], "--master-instance-type: unknown instance type"),
    ("gcp", [*GCP_OK, "--add-tag", "Team=ML"], "--add-tag: 'Team=ML': GCP labels"),
])
def test_bad_flags_are_one_line_before_anything_else(det: Det, no_pulumi: None, cloud: str, argv: list[str],  # noqa: F811
                                                     expected: str) -> None:
    r = det("deploy", cloud, "up", *argv)
    assert r.code == 1 and r.out == ""
    assert r.err.count("\n") == 1 and r.err.startswith("det: error: ") and expected in r.err, r.err
    assert "pulumi" not in r.err  # the flags are checked first


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_up_and_down_without_the_pulumi_cli_stop_at_once(det: Det, no_pulumi: None, tmp_path: Path,  # noqa: F811
                                                          cloud: str) -> None:
    ok = AWS_OK if cloud == "aws" else GCP_OK
    for argv in (["up", *ok], ["down", "--cluster-id", "ml-prod", "--yes"]):
        r = det("deploy", cloud, *argv, "--state-dir", str(tmp_path / "state"))
        assert r.code == 1 and r.err.count("\n") == 1
        assert r.err == f"det: error: {deploy_cloud.PULUMI_MISSING}\n"
        assert "install" in r.err
    assert not (tmp_path / "state").exists()  # nothing was started


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_render_writes_what_the_master_and_agents_boot(det: Det, no_pulumi: None, tmp_path: Path,  # noqa: F811
                                                       cloud: str) -> None:
    ok = AWS_OK if cloud == "aws" else GCP_OK
    r = det("deploy", cloud, "render", *ok, "--max-dynamic-agents", "3", "--out", str(tmp_path / "out"))
    assert r.code == 0, r.err
    assert "At rest: $" in r.out
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["agent-user-data-aux.yaml", "agent-user-data-compute.yaml", "master-user-data.yaml", "master.yaml"]
    config = load_config(tmp_path / "out" / "master.yaml", env={})
    assert [p.name for p in config.resource_pools] == ["compute", "aux"]
    compute = config.resource_pools[0].provider
    assert compute is not None and compute["type"] == cloud and compute["max_instances"] == 3
    assert (compute["tags"] if cloud == "aws" else compute["labels"])[DEPLOY_TAG] == "ml-prod"
    if CLOUD_INIT is None:
        missing_part("cloud-init is not installed (tests/system_deps.sh)")
    for name in names:
        if "user-data" in name:
            proc = subprocess.run([str(CLOUD_INIT), "schema", "--config-file", str(tmp_path / "out" / name)],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0 and "Valid cloud-config" in proc.stdout, proc.stdout + proc.stderr


def _write_stack(state: Path, name: str, outputs: dict[str, Any]) -> None:
    path = state / ".pulumi" / "stacks" / "shipyard" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    resources = [{"type": "pulumi:pulumi:Stack", "outputs": outputs}, {"type": "aws:ec2/vpc:Vpc"}]
    path.write_text(json.dumps({"version": 3, "checkpoint": {"latest": {"resources": resources}}}))


def test_list_reads_a_local_state_directory_without_the_cli(det: Det, no_pulumi: None, tmp_path: Path) -> None:  # noqa: F811
    r = det("deploy", "aws", "list", "--state-dir", str(tmp_path))
    assert r.code == 0 and "No aws cluster" in r.out
    _write_stack(tmp_path, "ml-prod", {"cloud": "aws", "master_url": "http://198.51.100.7:8080"})
    _write_stack(tmp_path, "vision", {"cloud": "gcp", "master_url": "http://203.0.113.9:8080"})
    r = det("deploy", "aws", "list", "--state-dir", str(tmp_path))
    assert r.code == 0 and r.out == "ml-prod  http://198.51.100.7:8080  1 resources\n"
    r = det("deploy", "gcp", "list", "--json", "--backend-url", f"file://{tmp_path}")
    assert json.loads(r.out) == [{"name": "vision", "cloud": "gcp", "master_url": "http://203.0.113.9:8080",
                                  "resources": 1}]
    r = det("deploy", "aws", "list", "--backend-url", "s3://bucket/state")
    assert r.code == 1 and r.err == f"det: error: {deploy_cloud.PULUMI_MISSING}\n"


# ---- against moto: the agent sweep of `down`, and `describe` ------------------------------------


REGION = "us-east-1"


@pytest.fixture
def moto_env(moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    for k, v in {"AWS_ENDPOINT_URL": moto_reset, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    return moto_reset


def _launch(ec2: Any, image: str, tags: dict[str, str], count: int = 1) -> list[str]:
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    resp = ec2.run_instances(ImageId=image, InstanceType="g4dn.xlarge", MinCount=count, MaxCount=count,
                             TagSpecifications=spec)
    return [i["InstanceId"] for i in resp["Instances"]]


def test_down_terminates_every_agent_of_the_cluster_and_nothing_else(moto_env: str, det: Det,  # noqa: F811
                                                                      no_pulumi: None, tmp_path: Path) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    agent_tags = {DEPLOY_TAG: "ml-prod", "shipyard:managed-by": "shipyard", "shipyard:pool": "compute"}
    agents = _launch(ec2, image, agent_tags, count=2)
    [master] = _launch(ec2, image, {DEPLOY_TAG: "ml-prod", "Name": "shipyard-ml-prod-master"})
    [other] = _launch(ec2, image, {**agent_tags, DEPLOY_TAG: "other-cluster"})
    said: list[str] = []
    n = deploy_cloud.terminate_aws_agents(REGION, "ml-prod", wait_s=30, poll_s=0.1, say=said.append)
    assert n == 2 and said and all(a in said[0] for a in agents)
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"]}
    assert {states[a] for a in agents} == {"terminated"}
    assert states[master] == "running" and states[other] == "running"
    assert deploy_cloud.terminate_aws_agents(REGION, "ml-prod", wait_s=1, poll_s=0.1, say=said.append) == 0

    # describe: the stack's outputs (local state) and the cluster's instances by tag.
    from infra.settings import AwsSettings

    s = AwsSettings(cluster_id="ml-prod", keypair="ops", inbound_cidr="203.0.113.0/24")
    _write_stack(tmp_path, "ml-prod", {"cloud": "aws", "cluster_id": "ml-prod", "region": REGION,
                                       "master_url": "http://198.51.100.7:8080", "settings": s.to_json()})
    r = det("deploy", "aws", "describe", "--cluster-id", "ml-prod", "--state-dir", str(tmp_path))
    assert r.code == 0, r.err
    assert "Master:   http://198.51.100.7:8080" in r.out and "At rest:  $0.169/hour" in r.out
    assert "Pool:     compute  g4dn.xlarge (1x T4" in r.out and "Pool:     aux      t3.large" in r.out
    assert f"Instance: {master}  g4dn.xlarge  running  master" in r.out
    assert other not in r.out
    r = det("deploy", "aws", "describe", "--cluster-id", "nope", "--state-dir", str(tmp_path))
    assert r.code == 1 and "no stack 'nope'" in r.err


def test_cluster_id_is_required_for_down_and_describe(det: Det, no_pulumi: None) -> None:  # noqa: F811
    for verb in ("down", "describe"):
        r = det("deploy", "gcp", verb)
        assert r.code == 1 and r.err == "det: error: --cluster-id: required (a name for the cluster, e.g. --cluster-id ml-prod)\n"
    with pytest.raises(CliError, match="not a Pulumi state backend"):
        deploy_cloud.Backend.from_args(type("A", (), {"backend_url": "ftp://x"})())


def test_local_deploy_still_registers(det: Det) -> None:  # noqa: F811
    r = det("deploy", "--help")
    assert r.code == 0 and all(w in r.out for w in ("local", "aws", "gcp"))


# ---- containers on cloud pools ---------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_cloud_pools_run_trials_in_containers_by_default(det: Det, no_pulumi: None, tmp_path: Path,  # noqa: F811
                                                         cloud: str) -> None:
    ok = AWS_OK if cloud == "aws" else GCP_OK
    r = det("deploy", cloud, "render", *ok, "--gpu-env-image", "nvcr.io/nvidia/pytorch:24.07-py3",
            "--out", str(tmp_path / "out"))
    assert r.code == 0, r.err
    config = load_config(tmp_path / "out" / "master.yaml", env={})
    compute, aux = config.resource_pools
    assert compute.container_runtime == aux.container_runtime == "docker"
    assert compute.provider is not None and aux.provider is not None
    assert compute.provider["agent"] == {"container_image_cpu": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                                         "container_image_cuda": "nvcr.io/nvidia/pytorch:24.07-py3"}
    assert aux.provider["agent"]["container_image_cpu"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert "container_image_cuda" not in aux.provider["agent"]
    # The agents' boot installs Docker (and, on GPU hosts, NVIDIA's container toolkit) and runs the
    # agent with the docker runtime and those default images.
    import yaml

    for pool in ("compute", "aux"):
        doc = yaml.safe_load((tmp_path / "out" / f"agent-user-data-{pool}.yaml").read_text())
        assert "docker.io" in doc["packages"] and doc["runcmd"][0] == ["/usr/local/bin/shipyard-docker-setup"]
        agent_yaml = yaml.safe_load(next(f["content"] for f in doc["write_files"]
                                         if f["path"] == "/etc/shipyard/agent.yaml"))
        assert agent_yaml["runtime"] == "docker"
        assert agent_yaml["container_image_cpu"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"

    r = det("deploy", cloud, "render", *ok, "--container-runtime", "process", "--out", str(tmp_path / "p"))
    assert r.code == 0, r.err
    config = load_config(tmp_path / "p" / "master.yaml", env={})
    assert {p.container_runtime for p in config.resource_pools} == {"process"}
    assert "docker.io" not in (tmp_path / "p" / "agent-user-data-compute.yaml").read_text()


@pytest.mark.parametrize("flag", ["--cpu-env-image", "--gpu-env-image"])
def test_a_bad_image_is_one_line(det: Det, no_pulumi: None, flag: str) -> None:  # noqa: F811
    r = det("deploy", "aws", "up", *AWS_OK, flag, "PyTorch latest")
    assert r.code == 1 and r.err == (f"det: error: {flag}: 'PyTorch latest' is not a Docker image reference "
                                     "(e.g. pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime)\n")
