"""The options Determined users reach for in `det deploy aws|gcp` (issue 26): each parsed and checked by
the CLI (one line naming the flag), rendered into master.yaml (checked by the master's own loader) and
into the Pulumi programs (under mocks)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from control_plane.config import load_config
from infra import render
from infra.aws import program as aws_program
from infra.gcp import program as gcp_program
from tests.cli.conftest import (  # noqa: F401 (fixtures)
    Det,
    cli_env,  # noqa: F401
    det,
)
from tests.infra.conftest import ADMIN_PASSWORD, DB_PASSWORD, run
from tests.infra.test_deploy_cli import AWS_OK, GCP_OK, moto_env, no_pulumi  # noqa: F401
from tests.infra.test_programs import SECRET_SIG, aws_settings, gcp_settings, of_type, one
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401
from tests.tls_certs import self_signed

SH = shutil.which("sh") or "/bin/sh"  # looked up before a test empties PATH
SYSTEM_PATH = os.environ.get("PATH", "/usr/bin:/bin")
TLS_KEY = "-----BEGIN PRIVATE KEY-----\nnot-a-real-key\n-----END PRIVATE KEY-----\n"


def _one_line(r: Any, expected: str) -> None:
    assert r.code == 1 and r.out == "", r.out
    assert r.err.count("\n") == 1 and r.err.startswith("det: error: ") and expected in r.err, r.err


def _render(det: Det, cloud: str, tmp_path: Path, *argv: str) -> dict[str, Any]:  # noqa: F811
    ok = AWS_OK if cloud == "aws" else GCP_OK
    r = det("deploy", cloud, "render", *ok, *argv, "--out", str(tmp_path / "out"))
    assert r.code == 0, r.err
    return dict(yaml.safe_load((tmp_path / "out" / "master.yaml").read_text()))


# ---- TLS -------------------------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path / "tls", names=("det.example.com",), ips=())


def test_tls_flags_are_checked_as_a_pair(det: Det, no_pulumi: None, tmp_path: Path,  # noqa: F811
                                         pair: tuple[Path, Path]) -> None:
    cert, key = pair
    _, other_key = self_signed(tmp_path / "other", stem="other")
    name = ["--master-cert-name", "det.example.com"]
    _one_line(det("deploy", "aws", "up", *AWS_OK, "--master-tls-cert", str(cert), *name),
              "--master-tls-key: required with --master-tls-cert")
    _one_line(det("deploy", "aws", "up", *AWS_OK, "--master-tls-cert", str(cert), "--master-tls-key", str(other_key),
                  *name), f"--master-tls-key: {other_key} does not go with {cert}")
    _one_line(det("deploy", "gcp", "up", *GCP_OK, "--master-tls-cert", str(key), "--master-tls-key", str(key), *name),
              "--master-tls-cert: ")
    _one_line(det("deploy", "gcp", "up", *GCP_OK, "--master-tls-cert", str(tmp_path / "nope.pem"),
                  "--master-tls-key", str(key), *name), "--master-tls-cert: cannot read")
    _one_line(det("deploy", "aws", "up", *AWS_OK, "--master-tls-cert", str(cert), "--master-tls-key", str(key)),
              "--master-cert-name: required with --master-tls-cert")
    _one_line(det("deploy", "aws", "up", *AWS_OK, "--master-cert-name", "det.example.com"),
              "--master-cert-name: only applies with --master-tls-cert")
    _one_line(det("deploy", "aws", "up", *AWS_OK, "--master-tls-cert", str(cert), "--master-tls-key", str(key),
                  "--master-cert-name", "not a name"), "--master-cert-name: 'not a name' is not a DNS name")


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_tls_master_serves_https_and_agents_trust_it(det: Det, no_pulumi: None, tmp_path: Path,  # noqa: F811
                                                     pair: tuple[Path, Path], cloud: str) -> None:
    cert, key = pair
    config = _render(det, cloud, tmp_path, "--master-tls-cert", str(cert), "--master-tls-key", str(key),
                     "--master-cert-name", "det.example.com")
    assert config["security"] == {"tls": {"cert": render.TLS_CERT_PATH, "key": render.TLS_KEY_PATH}}
    assert config["master_url"] == "https://det.example.com:8080"
    out = (tmp_path / "out").iterdir()
    assert not any("PRIVATE KEY" in p.read_text() for p in out)  # the key only travels in the secret store
    # The master's loader accepts it once the start program has written the pair.
    config["security"]["tls"] = {"cert": str(cert), "key": str(key)}
    path = tmp_path / "master.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, env={})
    assert loaded.tls and loaded.advertised_url == "https://det.example.com:8080"
    for pool in config["resource_pools"]:
        script = pool["provider"]["startup_script"]
        assert cert.read_text().strip() in script and "det.example.com" in script
    # The agents' startup script, run in a scratch root: the name maps to the master's private
    # address, the unit trusts the certificate besides the system's CAs.
    _run_startup_script(config["resource_pools"][0]["provider"]["startup_script"], tmp_path / "root",
                        "10.0.0.10" if cloud == "aws" else "10.10.0.10", cert)


def _run_startup_script(script: str, root: Path, master_ip: str, cert: Path) -> None:
    """Run the script with its absolute paths moved under `root` (no root needed)."""
    for d in ("etc/ssl/certs", "etc/systemd/system"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/ssl/certs/ca-certificates.crt").write_text("SYSTEM-CAS\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    moved = script.replace(" /etc/", f" {root}/etc/").replace(">/etc/", f">{root}/etc/")
    env = {"PATH": SYSTEM_PATH}
    proc = subprocess.run([SH, "-c", moved], capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (root / "etc/hosts").read_text().splitlines()[-1] == f"{master_ip} det.example.com"
    bundle = (root / "etc/shipyard/master-trust.pem").read_text()
    assert bundle.startswith(cert.read_text().strip()) and bundle.endswith("SYSTEM-CAS\n")
    dropin = (root / "etc/systemd/system/shipyard-agent.service.d/master-tls.conf").read_text()
    assert f"Environment=SSL_CERT_FILE={render.AGENT_TRUST_BUNDLE}" in dropin
    subprocess.run([SH, "-c", moved], check=True, timeout=30, env=env)  # twice: one hosts line still
    assert (root / "etc/hosts").read_text().count("det.example.com") == 1


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_tls_programs_keep_the_key_secret(pair: tuple[Path, Path], cloud: str) -> None:
    cert, _ = pair
    extra = {"master_tls_cert": cert.read_text(), "master_cert_name": "det.example.com"}
    if cloud == "aws":
        s = aws_settings(**extra)
        rec, out = run(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD,
                                                 tls_key=TLS_KEY))
        user_data = one(rec, "ec2/instance:Instance").inputs["userData"]
        version = one(rec, "SecretVersion").inputs["secretString"]
    else:
        g = gcp_settings(**extra)
        rec, out = run(lambda: gcp_program.build(g, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD,
                                                 tls_key=TLS_KEY))
        user_data = one(rec, "compute/instance:Instance").inputs["metadata"]["user-data"]
        version = one(rec, "SecretVersion").inputs["secretData"]
    assert out["master_url"].startswith("https://")
    assert render.user_data_config(user_data)["security"]["tls"]["key"] == render.TLS_KEY_PATH
    assert isinstance(version, dict) and set(version) == {SECRET_SIG, "value"}
    payload = json.loads(version["value"])
    assert payload["tls_key"] == TLS_KEY and payload["tls_cert"] == cert.read_text()
    assert not [r.type for r in rec.resources if "not-a-real-key" in r.text and not r.type.endswith("SecretVersion")]


def test_the_start_program_writes_the_pair_for_root_only(moto_env: str, tmp_path: Path) -> None:  # noqa: F811
    sm = boto3.client("secretsmanager", region_name="us-east-1")
    arn = sm.create_secret(Name="shipyard/ml-prod/master", SecretString=render.secret_payload(
        "admin-pw-123", "postgresql+psycopg2://u:p@db:5432/shipyard", tls_cert="CERT", tls_key=TLS_KEY))["ARN"]
    start = tmp_path / "start.py"
    start.write_text(render.start_program("aws", arn, "us-east-1"))
    fake_master = tmp_path / "det-master"
    fake_master.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                           "print(json.dumps({'argv': sys.argv[1:], 'admin': os.environ['SHIPYARD_ADMIN_PASSWORD']}))\n")
    fake_master.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.run([sys.executable, str(start), "--det-master", str(fake_master), "--config", "/dev/null",
                           "--state-dir", str(state)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AWS_ENDPOINT_URL": moto_env})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["admin"] == "admin-pw-123"
    key = state / "master-tls-key.pem"
    assert key.read_text() == TLS_KEY and (state / "master-tls-cert.pem").read_text() == "CERT"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


# ---- scheduler, preemption, max agent starting period -------------------------------------------------


def test_scheduler_types_are_the_masters_policies() -> None:
    from control_plane.core.scheduling import POLICIES
    from infra.settings import SCHEDULER_TYPES

    assert set(SCHEDULER_TYPES) == set(POLICIES)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_scheduler_preemption_and_starting_period_reach_both_pools(det: Det, no_pulumi: None,  # noqa: F811
                                                                   tmp_path: Path, cloud: str) -> None:
    config = _render(det, cloud, tmp_path, "--scheduler-type", "fair_share", "--no-preemption-enabled",
                     "--max-agent-starting-period", "45m")
    path = tmp_path / "master.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, env={})
    for pool in loaded.resource_pools:
        assert pool.scheduler.type == "fair_share" and pool.scheduler.preemption is False
        settings = pool.settings()
        assert settings is not None and settings.elastic.max_agent_starting_period.total_seconds() == 45 * 60
    config = _render(det, cloud, tmp_path, "--preemption-enabled")
    assert {p["scheduler"]["type"] for p in config["resource_pools"]} == {"priority"}
    assert all(p["scheduler"]["preemption"] is True for p in config["resource_pools"])
    assert all(p["provider"]["max_agent_starting_period"] == "20m" for p in config["resource_pools"])


@pytest.mark.parametrize(("argv", "expected"), [
    (["--scheduler-type", "round_robin"], "--scheduler-type: 'round_robin' is not one of priority, fair_share"),
    (["--max-agent-starting-period", "soon"], "--max-agent-starting-period: 'soon' is not a duration"),
])
def test_bad_scheduler_flags_are_one_line(det: Det, no_pulumi: None, argv: list[str], expected: str) -> None:  # noqa: F811
    _one_line(det("deploy", "gcp", "up", *GCP_OK, *argv), expected)


# ---- an existing network ---------------------------------------------------------------------------

SUBNETS = ["subnet-0a1b2c3d4e5f60718", "subnet-0a1b2c3d4e5f60719"]


def test_aws_existing_vpc_creates_no_network_and_the_pools_use_its_subnets() -> None:
    s = aws_settings(vpc_id="vpc-0123456789abcdef0", subnet_ids=tuple(SUBNETS))
    rec, _ = run(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    for kind in ("ec2/vpc:Vpc", "ec2/subnet:Subnet", "InternetGateway", "RouteTable"):
        assert not of_type(rec, kind), kind
    assert one(rec, "rds/subnetGroup:SubnetGroup").inputs["subnetIds"] == SUBNETS
    assert one(rec, "ec2/networkInterface:NetworkInterface").inputs["subnetId"] == SUBNETS[0]
    assert {sg.inputs["vpcId"] for sg in of_type(rec, "SecurityGroup")} == {"vpc-0123456789abcdef0"}
    user_data = one(rec, "ec2/instance:Instance").inputs["userData"]
    for pool in render.user_data_config(user_data)["resource_pools"]:
        assert pool["provider"]["subnet_ids"] == SUBNETS
    statements = json.loads(next(r for r in of_type(rec, "RolePolicy") if r.name.endswith("-master")).inputs["policy"])
    [in_vpc] = [st for st in statements["Statement"] if st["Sid"] == "RunInTheClusterVpc"]
    assert in_vpc["Condition"]["ArnLike"]["ec2:Vpc"].endswith(":vpc/vpc-0123456789abcdef0")


def test_gcp_existing_network_creates_none_and_the_pools_use_it() -> None:
    s = gcp_settings(network="shared-vpc", subnetwork="ml-subnet")
    rec, _ = run(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    assert not of_type(rec, "compute/network:Network") and not of_type(rec, "compute/subnetwork:Subnetwork")
    networks = {fw.inputs["network"] for fw in of_type(rec, "Firewall")}
    assert networks == {"projects/my-project-1/global/networks/shared-vpc"}
    master = one(rec, "compute/instance:Instance").inputs
    assert master["networkInterfaces"][0]["subnetwork"] == "projects/my-project-1/regions/us-central1/subnetworks/ml-subnet"
    for pool in render.user_data_config(master["metadata"]["user-data"])["resource_pools"]:
        assert pool["provider"]["network"] == "projects/my-project-1/global/networks/shared-vpc"
        assert pool["provider"]["subnetwork"] == "regions/us-central1/subnetworks/ml-subnet"


@pytest.mark.parametrize(("cloud", "argv", "expected"), [
    ("aws", ["--vpc-id", "vpc-0123456789abcdef0", "--subnet-id", SUBNETS[0]], "--subnet-id: give two or more subnets"),
    ("aws", ["--subnet-id", SUBNETS[0], "--subnet-id", SUBNETS[1]], "--subnet-id: only applies with --vpc-id"),
    ("aws", ["--vpc-id", "vpc-0123456789abcdef0", "--default-vpc"], "--vpc-id: give --vpc-id or --default-vpc"),
    ("aws", ["--vpc-id", "my-vpc"], "--vpc-id: 'my-vpc' is not a VPC id"),
    ("aws", ["--vpc-id", "vpc-0123456789abcdef0", "--subnet-id", "sn-1", "--subnet-id", SUBNETS[1]],
     "--subnet-id: 'sn-1' is not a subnet id"),
    ("gcp", ["--network", "shared-vpc"], "--subnetwork: required with --network"),
    ("gcp", ["--subnetwork", "ml"], "--network: required with --subnetwork"),
    ("gcp", ["--network", "Shared_VPC", "--subnetwork", "ml"], "--network: 'Shared_VPC' is not a GCP resource name"),
])
def test_bad_network_flags_are_one_line(det: Det, no_pulumi: None, cloud: str, argv: list[str],  # noqa: F811
                                        expected: str) -> None:
    _one_line(det("deploy", cloud, "up", *(AWS_OK if cloud == "aws" else GCP_OK), *argv), expected)


def test_render_names_the_existing_network(det: Det, no_pulumi: None, tmp_path: Path) -> None:  # noqa: F811
    config = _render(det, "aws", tmp_path, "--vpc-id", "vpc-0123456789abcdef0", "--subnet-id", SUBNETS[0],
                     "--subnet-id", SUBNETS[1])
    assert config["resource_pools"][0]["provider"]["subnet_ids"] == SUBNETS
    config = _render(det, "gcp", tmp_path, "--network", "shared-vpc", "--subnetwork", "ml-subnet")
    assert config["resource_pools"][0]["provider"]["subnetwork"] == "regions/us-central1/subnetworks/ml-subnet"


def _two_subnets(ec2: Any, vpc: str, zones: tuple[str, str]) -> list[str]:
    return [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=z)["Subnet"]["SubnetId"]
            for i, z in enumerate(zones)]


def test_aws_existing_network_is_checked_before_anything_is_created(moto_env: str) -> None:  # noqa: F811
    from cli import deploy_cloud
    from cli.errors import CliError

    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    good = _two_subnets(ec2, vpc, ("us-east-1a", "us-east-1b"))
    deploy_cloud.check_aws_network(aws_settings(vpc_id=vpc, subnet_ids=tuple(good)))
    one_zone = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone="us-east-1c")["Subnet"]
                ["SubnetId"] for i in (5, 6)]
    with pytest.raises(CliError, match="--subnet-id: the subnets are all in one availability zone"):
        deploy_cloud.check_aws_network(aws_settings(vpc_id=vpc, subnet_ids=tuple(one_zone)))
    other = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    [foreign] = [ec2.create_subnet(VpcId=other, CidrBlock="10.8.1.0/24")["Subnet"]["SubnetId"]]
    with pytest.raises(CliError, match=f"--subnet-id: {foreign} not in {vpc}"):
        deploy_cloud.check_aws_network(aws_settings(vpc_id=vpc, subnet_ids=(good[0], foreign)))
    with pytest.raises(CliError, match="--vpc-id: vpc-0123456789abcdef0 not found in us-east-1"):
        deploy_cloud.check_aws_network(aws_settings(vpc_id="vpc-0123456789abcdef0", subnet_ids=tuple(good)))


# ---- --profile -----------------------------------------------------------------------------------


def test_profile_is_checked_and_used_by_every_aws_call(det: Det, no_pulumi: None, moto_env: str,  # noqa: F811
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli import deploy_cloud

    config = tmp_path / "aws-config"
    config.write_text("[profile ops]\nregion = us-east-1\n")
    creds = tmp_path / "aws-credentials"
    creds.write_text("[ops]\naws_access_key_id = ops-key\naws_secret_access_key = ops-secret\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    # setenv first: monkeypatch records the variable's absence, so whatever the command sets is
    # removed after the test (a bare delenv of an unset name records nothing, and the profile then
    # leaked into every later test of this worker).
    monkeypatch.setenv("AWS_PROFILE", "unset")
    monkeypatch.delenv("AWS_PROFILE")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # likewise boto3's default session
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    _one_line(det("deploy", "aws", "up", *AWS_OK, "--profile", "nope"), "--profile: no AWS profile 'nope'")
    _one_line(det("deploy", "aws", "down", "--cluster-id", "ml-prod", "--yes", "--profile", "nope"),
              "--profile: no AWS profile 'nope'")
    assert "AWS_PROFILE" not in os.environ
    r = det("deploy", "aws", "describe", "--cluster-id", "ml-prod", "--profile", "ops", "--state-dir", str(tmp_path))
    assert r.code == 1 and "no stack 'ml-prod'" in r.err
    assert os.environ["AWS_PROFILE"] == "ops"
    # The CLI's own boto3 calls now sign with the profile's keys (moto accepts any).
    assert boto3.Session().get_credentials().access_key == "ops-key"  # type: ignore[union-attr]
    assert deploy_cloud.aws_instances("us-east-1", "ml-prod") == []


# ---- GCP --keypath, --min-cpu-platform-master/-agent ------------------------------------------------------

PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHdTwQ3mJt0x2B9qk1f3b5a7c9e1g3i5k7m9o1q3s5u7 ops@laptop"


def test_gcp_keypath_and_cpu_platforms_reach_master_and_agents(det: Det, no_pulumi: None,  # noqa: F811
                                                               tmp_path: Path) -> None:
    from provisioners.factory import COMMON_KEYS
    from provisioners.gcp import GcpPoolConfig

    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(PUBKEY + "\n")
    config = _render(det, "gcp", tmp_path, "--keypath", str(pub), "--min-cpu-platform-agent", "Intel Ice Lake")
    for pool in config["resource_pools"]:
        cfg = GcpPoolConfig.from_dict({k: v for k, v in pool["provider"].items() if k not in COMMON_KEYS})
        assert cfg.ssh_keys == (f"shipyard:{PUBKEY}",) and cfg.min_cpu_platform == "Intel Ice Lake"
    s = gcp_settings(ssh_public_key=PUBKEY, min_cpu_platform_master="AMD Milan")
    rec, _ = run(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    master = one(rec, "compute/instance:Instance").inputs
    assert master["metadata"]["ssh-keys"] == f"shipyard:{PUBKEY}" and master["metadata"]["enable-oslogin"] == "FALSE"
    assert master["minCpuPlatform"] == "AMD Milan"
    rec, _ = run(lambda: gcp_program.build(gcp_settings(), db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    master = one(rec, "compute/instance:Instance").inputs
    assert master["metadata"]["enable-oslogin"] == "TRUE" and "ssh-keys" not in master["metadata"]
    assert "minCpuPlatform" not in master


@pytest.mark.integration
def test_gcp_agents_launch_with_the_key_and_the_cpu_platform() -> None:
    from tests.provisioners.test_gcp import make_provider, metadata_of, running_gce_fake, specs

    with running_gce_fake() as fake:
        prov = make_provider(fake, ssh_keys=[f"shipyard:{PUBKEY}"], min_cpu_platform="Intel Ice Lake")
        (inst,) = prov.launch(specs("launch-0001")).launched
        body = fake.sent[inst.id]
    assert metadata_of(body)["ssh-keys"] == f"shipyard:{PUBKEY}" and body["minCpuPlatform"] == "Intel Ice Lake"


@pytest.mark.parametrize(("argv", "expected"), [
    (["--keypath", "/nonexistent/key.pub"], "--keypath: cannot read /nonexistent/key.pub"),
    (["--min-cpu-platform-agent", "skylake"], "--min-cpu-platform-agent: 'skylake' is not a CPU platform name"),
])
def test_bad_gcp_host_flags_are_one_line(det: Det, no_pulumi: None, argv: list[str], expected: str) -> None:  # noqa: F811
    _one_line(det("deploy", "gcp", "up", *GCP_OK, *argv), expected)


def test_keypath_refuses_a_private_key_and_junk(det: Det, no_pulumi: None, tmp_path: Path) -> None:  # noqa: F811
    private = tmp_path / "id_ed25519"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n")
    _one_line(det("deploy", "gcp", "up", *GCP_OK, "--keypath", str(private)), "--keypath: ")
    junk = tmp_path / "junk.pub"
    junk.write_text("hello\n")
    _one_line(det("deploy", "gcp", "up", *GCP_OK, "--keypath", str(junk)), "--keypath: not an OpenSSH public key")


# ---- the log group -----------------------------------------------------------------------------------


def test_down_keeps_the_log_group_unless_asked_not_to(det: Det, no_pulumi: None, tmp_path: Path) -> None:  # noqa: F811
    from tests.infra.test_programs import _retained

    for retain in (True, False):
        s = aws_settings(retain_log_group=retain)
        _, kept = _retained(lambda s=s: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
        assert ("aws:cloudwatch/logGroup:LogGroup" in kept) is retain
        assert "aws:s3/bucket:Bucket" in kept
    from cli import deploy_cloud
    from cli.main import build_parser

    args = build_parser().parse_args(["deploy", "aws", "up", *AWS_OK, "--no-retain-log-group"])
    assert deploy_cloud.settings_from_args("aws", args).retain_log_group is False  # type: ignore[union-attr]
    args = build_parser().parse_args(["deploy", "aws", "up", *AWS_OK])
    assert deploy_cloud.settings_from_args("aws", args).retain_log_group is True  # type: ignore[union-attr]
