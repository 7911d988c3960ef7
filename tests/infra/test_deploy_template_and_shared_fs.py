"""`det deploy aws|gcp --master-config-template` and `--shared-fs efs|filestore` (issue 26): the template merged
over the rendered master.yaml and checked by the master's own models before any cloud call; the shared file
system declared by the programs (under Pulumi's mocks), mounted by the master's and the agents' boot (a
script run here, twice, against stand-ins of mount and the package manager), pointed at by the checkpoint
storage, priced by `describe`, and kept or deleted by `down` (moto's EFS; Filestore's REST API recorded)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from cli import deploy_cloud
from cli.errors import CliError
from control_plane.config import load_config
from infra import DEPLOY_TAG, catalog, render, settings
from infra.aws import program as aws_program
from infra.gcp import program as gcp_program
from infra.settings import AwsSettings, GcpSettings, settings_from_json
from tests.cli.conftest import (  # noqa: F401 (fixtures)
    Det,
    cli_env,  # noqa: F401
    det,
)
from tests.infra.conftest import ADMIN_PASSWORD, DB_PASSWORD, Recorder, run
from tests.infra.test_deploy_cli import AWS_OK, GCP_OK, moto_env, no_pulumi  # noqa: F401
from tests.infra.test_programs import CID, _retained, aws_settings, gcp_settings, of_type, one
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401

BASH = shutil.which("bash") or "/bin/bash"  # looked up before a test empties PATH
SH = shutil.which("sh") or "/bin/sh"
def template(cloud: str = "aws") -> dict[str, Any]:
    """A template a user might write: master settings, a pool's scheduler and disk, checkpoint GC, a pool
    of their own."""
    disk = "root_volume_size_gb" if cloud == "aws" else "boot_disk_size_gb"
    return {
    "agent_heartbeat_timeout_s": 45,
    "log_level": "debug",
    "checkpoint_storage": {"save_trial_best": 3, "save_experiment_best": 2},
    "resource_pools": [
        {"name": "compute", "description": "V100s for the vision team",
         "scheduler": {"fitting_policy": "worst", "default_priority": 20},
         "provider": {disk: 200}},
        {"name": "on-prem", "description": "our own GPU boxes (agents join by themselves)"},
    ],
    }


TEMPLATE = template()


def _one_line(r: Any, expected: str) -> None:
    assert r.code == 1 and r.out == "", r.out
    assert r.err.count("\n") == 1 and r.err.startswith("det: error: ") and expected in r.err, r.err


def _write(tmp_path: Path, doc: Any, name: str = "template.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def _accepted(tmp_path: Path, config: dict[str, Any]) -> Any:
    path = tmp_path / "accepted-master.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in config.items() if k != "security"}))
    return load_config(path, env={})


# ---- the master config template --------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_render_merges_the_template_over_what_the_flags_render(det: Det, no_pulumi: None, tmp_path: Path,  # noqa: F811
                                                               cloud: str) -> None:
    ok = AWS_OK if cloud == "aws" else GCP_OK
    out = tmp_path / "out"
    r = det("deploy", cloud, "render", *ok, "--master-config-template", str(_write(tmp_path, template(cloud))),
            "--max-dynamic-agents", "7", "--scheduler-type", "fair_share", "--out", str(out))
    assert r.code == 0, r.err
    config = yaml.safe_load((out / "master.yaml").read_text())
    # The master's own loader takes it: what the template set is there, and what the flags set too.
    loaded = _accepted(tmp_path, config)
    assert loaded.agent_heartbeat_timeout_s == 45 and loaded.log_level == "debug"
    assert [p.name for p in loaded.resource_pools] == ["compute", "aux", "on-prem"]
    compute, aux, on_prem = loaded.resource_pools
    assert compute.description == "V100s for the vision team"
    assert (compute.scheduler.type, compute.scheduler.fitting_policy, compute.scheduler.default_priority) == \
        ("fair_share", "worst", 20)
    assert aux.scheduler.fitting_policy == "best" and aux.scheduler.type == "fair_share"
    disk = "root_volume_size_gb" if cloud == "aws" else "boot_disk_size_gb"
    assert compute.provider is not None and compute.provider[disk] == 200
    assert compute.provider["max_instances"] == 7 and compute.provider[("labels" if cloud == "gcp" else "tags")][
        DEPLOY_TAG] == "ml-prod"
    assert on_prem.provider is None
    storage = loaded.checkpoint_storage
    assert storage["save_trial_best"] == 3 and storage["save_experiment_best"] == 2
    assert storage["type"] == ("s3" if cloud == "aws" else "gcs") and storage["bucket"].startswith("shipyard-ml-prod")
    # The master boots exactly that master.yaml.
    assert render.user_data_config((out / "master-user-data.yaml").read_text()) == config


BAD_TEMPLATES = [
    ({"db_url": "postgresql://x"}, "--master-config-template: db_url is det deploy's own"),
    ({"security": {"tls": {}}}, "--master-config-template: security is set by --master-tls-cert"),
    ({"checkpoint_storage": {"bucket": "other"}}, "checkpoint_storage.bucket is set by --shared-fs"),
    ({"resource_pools": [{"name": "compute", "provider": {"max_instances": 50}}]},
     "resource_pools[compute].provider.max_instances is set by --max-dynamic-agents"),
    ({"resource_pools": [{"name": "aux", "provider": {"subnet_ids": ["subnet-1"]}}]},
     "resource_pools[aux].provider.subnet_ids is det deploy's own"),
    ({"resource_pools": [{"name": "compute", "scheduler": {"type": "fair_share"}}]},
     "resource_pools[compute].scheduler.type is set by --scheduler-type"),
    ({"resource_pools": [{"name": "extra", "provider": {"type": "aws"}}]}, "resource_pools[extra].provider: det deploy"),
    ({"resource_pools": [{"name": "compute", "scheduler": {"fitting_policy": "tightest"}}]},
     "resource_pools[compute].scheduler.fitting_policy: must be 'best' or 'worst'"),
    ({"resource_pools": [{"name": "compute", "provider": {"root_volume_size": 200}}]},
     "resource_pools[compute].provider.root_volume_size: unknown field"),
    ({"agent_heartbeat_timeout": 45}, "agent_heartbeat_timeout: unknown field"),
    ({"resource_pools": [{"name": "aux", "provider": {"agent": {"log_levle": "debug"}}}]},
     "resource_pools[aux].provider.agent: agent.log_levle: unknown agent option"),
    ({"checkpoint_storage": {"save_trial_best": -1}}, "checkpoint_storage.save_trial_best: must be greater than"),
    ({"default_resource_pool": "nowhere"}, "default_resource_pool: 'nowhere' is not one of the pools"),
    ("- a list\n- not a mapping\n", "the top level must be a mapping"),
    ("key: [unclosed\n", "is not YAML (line 2)"),
    ("when: 2024-01-01\n", "quote dates"),
]


@pytest.mark.parametrize(("doc", "expected"), BAD_TEMPLATES)
def test_a_refused_or_invalid_template_is_one_line_and_nothing_is_created(
        det: Det, no_pulumi: None, tmp_path: Path, doc: Any, expected: str) -> None:  # noqa: F811
    path = _write(tmp_path, doc)
    state = tmp_path / "state"
    # `up` stops before the pulumi check (PATH is empty here: that would be the error otherwise), so
    # before any cloud call; `render` writes nothing.
    r = det("deploy", "aws", "up", *AWS_OK, "--master-config-template", str(path), "--state-dir", str(state))
    _one_line(r, expected)
    assert not state.exists()
    r = det("deploy", "aws", "render", *AWS_OK, "--master-config-template", str(path), "--out", str(tmp_path / "o"))
    _one_line(r, expected)
    assert not (tmp_path / "o").exists()


def test_a_missing_template_file_is_one_line(det: Det, no_pulumi: None, tmp_path: Path) -> None:  # noqa: F811
    r = det("deploy", "gcp", "render", *GCP_OK, "--master-config-template", str(tmp_path / "nope.yaml"),
            "--out", str(tmp_path / "o"))
    _one_line(r, "--master-config-template: cannot read")


def test_the_template_travels_in_the_stack_so_a_later_run_and_upgrade_keep_it(tmp_path: Path) -> None:
    """The stack's settings carry the template: the program run again from them (a later `up`, or the
    state `upgrade` reads) renders the same user-data, so the master is not replaced and the master.yaml
    it restarts with after `upgrade` still holds the template's settings."""
    s = aws_settings(master_config_template=TEMPLATE)
    rec, out = run(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    kept = settings_from_json("aws", out["settings"])
    assert kept == s and kept.master_config_template == TEMPLATE
    rec2, _ = run(lambda: aws_program.build(kept, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    user_data = one(rec, "ec2/instance:Instance").inputs["userData"]
    assert one(rec2, "ec2/instance:Instance").inputs["userData"] == user_data
    loaded = _accepted(tmp_path, render.user_data_config(user_data))
    assert loaded.pool("compute").scheduler.fitting_policy == "worst"  # type: ignore[union-attr]
    assert loaded.pool("on-prem") is not None and loaded.log_level == "debug"
    # `upgrade` reads those settings and ships a release; a template is no reason to refuse it.
    assert deploy_cloud.settings_from_json("aws", out["settings"]).shipyard_package == ""


# ---- shared file systems ---------------------------------------------------------------------------


def _efs_run(**kw: Any) -> tuple[Recorder, dict[str, Any]]:
    s = aws_settings(shared_fs="efs", **kw)
    return run(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))


def test_aws_efs_is_encrypted_tagged_kept_and_open_to_the_cluster_only(tmp_path: Path) -> None:
    s = aws_settings(shared_fs="efs")
    rec, kept = _retained(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    fs = one(rec, "efs/fileSystem:FileSystem").inputs
    assert fs["encrypted"] is True and fs["tags"][DEPLOY_TAG] == CID and fs["tags"]["team"] == "ml"
    assert "aws:efs/fileSystem:FileSystem" in kept  # `down` keeps it, like the bucket
    sgs = {r.name: r.inputs for r in of_type(rec, "ec2/securityGroup:SecurityGroup")}
    efs_sg = sgs[f"shipyard-{CID}-efs"]
    assert efs_sg["tags"][DEPLOY_TAG] == CID
    [nfs] = efs_sg["ingress"]
    assert (nfs["protocol"], nfs["fromPort"], nfs["toPort"]) == ("tcp", 2049, 2049)
    assert sorted(nfs["securityGroups"]) == sorted([f"shipyard-{CID}-agents-id", f"shipyard-{CID}-master-id"])
    assert not nfs.get("cidrBlocks")
    targets = of_type(rec, "efs/mountTarget:MountTarget")
    assert sorted(t.inputs["subnetId"] for t in targets) == [f"shipyard-{CID}-subnet-0-id", f"shipyard-{CID}-subnet-1-id"]
    assert all(t.inputs["fileSystemId"] == f"shipyard-{CID}-efs-id" and
               t.inputs["securityGroups"] == [f"shipyard-{CID}-efs-id"] for t in targets)


@pytest.mark.parametrize(("kw", "subnets"), [
    ({"vpc_id": "vpc-0123abcd", "subnet_ids": ("subnet-0aaa1111", "subnet-0bbb2222", "subnet-0ccc3333")},
     ["subnet-0aaa1111", "subnet-0bbb2222", "subnet-0ccc3333"]),
    ({"use_default_vpc": True}, ["subnet-d1", "subnet-d2"]),
])
def test_aws_efs_has_a_mount_target_in_each_subnet_of_the_cluster(kw: dict[str, Any], subnets: list[str]) -> None:
    rec, _ = _efs_run(**kw)
    assert sorted(t.inputs["subnetId"] for t in of_type(rec, "efs/mountTarget:MountTarget")) == subnets


def test_aws_master_and_agents_mount_efs_and_checkpoints_go_there(tmp_path: Path) -> None:
    rec, out = _efs_run()
    master = one(rec, "ec2/instance:Instance")
    user_data = master.inputs["userData"]
    doc = yaml.safe_load(user_data)
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    source = f"shipyard-{CID}-efs-id.efs.us-east-1.amazonaws.com:/"
    assert f"SOURCE={source}" in files[render.MOUNT_PATH] and "FSTYPE=nfs4" in files[render.MOUNT_PATH]
    # The mount gates the master's boot (the master would otherwise keep checkpoints on its own disk).
    assert doc["runcmd"] == [["sh", "-c", f"{render.MOUNT_PATH} && {render.BOOT_PATH}"]]
    assert out["shared_fs"] == f"shipyard-{CID}-efs-id"
    loaded = _accepted(tmp_path, render.user_data_config(user_data))
    assert loaded.checkpoint_storage == {"type": "shared_fs", "host_path": render.SHARED_FS_MOUNT}
    for pool in ("compute", "aux"):
        agent = render.agent_user_data_sample("aws", render.user_data_config(user_data), pool)
        script = {f["path"]: f["content"] for f in yaml.safe_load(agent)["write_files"]}["/etc/shipyard/startup-script"]
        assert script == files[render.MOUNT_PATH]
    # The release still comes from the bucket.
    assert json.dumps(out["checkpoint_bucket"]) in files["/usr/local/bin/shipyard-master-fetch"]


def test_gcp_filestore_on_the_cluster_network_mounted_by_master_and_agents(tmp_path: Path) -> None:
    s = gcp_settings(shared_fs="filestore")
    rec, kept = _retained(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    _, outputs = run(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    fs = one(rec, "filestore/instance:Instance").inputs
    assert fs["tier"] == "BASIC_HDD" and fs["location"] == s.zone and fs["labels"][DEPLOY_TAG] == CID
    assert fs["fileShares"] == {"name": render.FILESTORE_SHARE, "capacityGb": settings.FILESTORE_CAPACITY_GB,
                                "nfsExportOptions": [{"ipRanges": [gcp_program.SUBNET_CIDR], "accessMode": "READ_WRITE",
                                                      "squashMode": "NO_ROOT_SQUASH"}]}
    assert fs["networks"][0]["network"] == f"{CID}-net" and fs["networks"][0]["connectMode"] == "DIRECT_PEERING"
    assert "gcp:filestore/instance:Instance" in kept
    assert any(r.inputs["service"] == "file.googleapis.com" for r in of_type(rec, "projects/service:Service"))
    user_data = one(rec, "compute/instance:Instance").inputs["metadata"]["user-data"]
    files = {f["path"]: f["content"] for f in yaml.safe_load(user_data)["write_files"]}
    assert "SOURCE=10.40.0.2:/checkpoints" in files[render.MOUNT_PATH] and "FSTYPE=nfs\n" in files[render.MOUNT_PATH]
    config = render.user_data_config(user_data)
    assert _accepted(tmp_path, config).checkpoint_storage == {"type": "shared_fs", "host_path": render.SHARED_FS_MOUNT}
    assert all(p["provider"]["startup_script"] == files[render.MOUNT_PATH] for p in config["resource_pools"])
    assert outputs["shared_fs"] == f"{CID}-ckpt"


def test_without_shared_fs_nothing_is_declared_and_the_bucket_holds_checkpoints() -> None:
    rec, out = run(lambda: gcp_program.build(gcp_settings(), db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    assert not of_type(rec, "filestore/instance:Instance") and out["shared_fs"] == ""
    doc = yaml.safe_load(one(rec, "compute/instance:Instance").inputs["metadata"]["user-data"])
    assert render.MOUNT_PATH not in {f["path"] for f in doc["write_files"]}


def test_shared_fs_and_tls_share_one_startup_script() -> None:
    from tests.tls_certs import self_signed  # noqa: F401 (the certificate is only text here)

    s = aws_settings(shared_fs="efs", master_tls_cert="-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
                     master_cert_name="det.example.com")
    config = render.placeholder_config(s)
    script = config["resource_pools"][0]["provider"]["startup_script"]
    assert script.count("#!") == 1 and "det.example.com" in script and "mount -t" in script
    subprocess.run([BASH, "-n"], input=script, text=True, check=True)


# ---- the mount step: valid shell, idempotent ---------------------------------------------------------


STUBS = {
    # `mount` records each call and marks the mount point as mounted; `mountpoint -q` reads that mark.
    "mount": '#!/bin/sh\necho "mount $*" >> "$STUB_LOG"\nfor last; do :; done\ntouch "$last/.mounted"\n',
    "mountpoint": '#!/bin/sh\n[ -e "$2/.mounted" ]\n',
    # Installing nfs-common puts the NFS mount helper in place.
    "apt-get": '#!/bin/sh\necho "apt-get $*" >> "$STUB_LOG"\n'
               'case "$1" in install) printf "#!/bin/sh\\n" > "$STUB_BIN/mount.nfs"; chmod +x "$STUB_BIN/mount.nfs";; esac\n',
    "sleep": "#!/bin/sh\nexit 0\n",
}


def _sandboxed(script: str, root: Path) -> str:
    """The rendered script with /etc/fstab and the mount point moved under `root` (the only changes)."""
    fstab, mount_point = root / "fstab", root / "mnt"
    out = script.replace("FSTAB=/etc/fstab", f"FSTAB={fstab}").replace(
        f"MOUNT_POINT={render.SHARED_FS_MOUNT}", f"MOUNT_POINT={mount_point}")
    assert out.count(str(root)) == 2
    return out


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_mount_step_is_valid_shell_and_idempotent(tmp_path: Path, cloud: str) -> None:
    s = aws_settings(shared_fs="efs") if cloud == "aws" else gcp_settings(shared_fs="filestore")
    source = render.efs_source("fs-0123abcd", s.region) if cloud == "aws" else render.filestore_source("10.40.0.2")
    script = render.shared_fs_mount(s, source)
    for shell in (BASH, SH):
        subprocess.run([shell, "-n"], input=script, text=True, check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    sandboxed = tmp_path / "mount.sh"
    sandboxed.write_text(_sandboxed(script, tmp_path))
    log = tmp_path / "calls.log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(log), "STUB_BIN": str(bin_dir)}
    for _ in range(2):  # a re-run (cloud-init again, a reboot's script) changes nothing
        subprocess.run([SH, str(sandboxed)], env=env, check=True, capture_output=True, text=True, timeout=30)
    fstab = (tmp_path / "fstab").read_text().splitlines()
    fstype = "nfs4" if cloud == "aws" else "nfs"
    assert len(fstab) == 1 and fstab[0].startswith(f"{source} {tmp_path / 'mnt'} {fstype} ")
    assert fstab[0].endswith(",_netdev,nofail 0 0")
    calls = log.read_text().splitlines()
    mounts = [c for c in calls if c.startswith("mount ")]
    assert mounts == [f"mount -t {fstype} -o {(render.EFS_MOUNT if cloud == 'aws' else render.FILESTORE_MOUNT)[1]} "
                      f"{source} {tmp_path / 'mnt'}"]
    # Installed the NFS client only where it is missing (this machine may have it).
    has_nfs = shutil.which("mount.nfs") or Path("/sbin/mount.nfs").exists()
    assert [c for c in calls if c.startswith("apt-get install")] == ([] if has_nfs else [
        "apt-get install -y -q nfs-common"])


def test_a_mount_that_never_comes_up_fails_the_boot(tmp_path: Path) -> None:
    script = render.shared_fs_mount(aws_settings(shared_fs="efs"), render.efs_source("fs-0123abcd", "us-east-1"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {**STUBS, "mount": "#!/bin/sh\nexit 32\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "mount.sh").write_text(_sandboxed(script, tmp_path))
    r = subprocess.run([SH, str(tmp_path / "mount.sh")], env={"PATH": f"{bin_dir}:/usr/bin:/bin",
                                                              "STUB_LOG": str(tmp_path / "log"),
                                                              "STUB_BIN": str(bin_dir)},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot mount fs-0123abcd.efs.us-east-1.amazonaws.com:/" in r.stderr


# ---- flags, cost, down -----------------------------------------------------------------------------


@pytest.mark.parametrize(("cloud", "value", "expected"), [
    ("aws", "filestore", "--shared-fs: 'filestore' is not one of efs, none"),
    ("gcp", "efs", "--shared-fs: 'efs' is not one of filestore, none"),
])
def test_a_shared_fs_of_the_other_cloud_is_one_line(det: Det, no_pulumi: None, cloud: str, value: str,  # noqa: F811
                                                    expected: str) -> None:
    ok = AWS_OK if cloud == "aws" else GCP_OK
    _one_line(det("deploy", cloud, "up", *ok, "--shared-fs", value), expected)


def test_render_and_describe_price_the_shared_fs(det: Det, no_pulumi: None, tmp_path: Path) -> None:  # noqa: F811
    r = det("deploy", "gcp", "render", *GCP_OK, "--shared-fs", "filestore", "--out", str(tmp_path / "o"))
    assert r.code == 0, r.err
    filestore = 1024 * catalog.GCP_FILESTORE_USD_PER_GB_MONTH / catalog.HOURS_PER_MONTH
    assert f"Filestore 1024 GB ${filestore:.3f}" in r.out
    plain = sum(c.usd_per_hour for c in gcp_settings().cost_at_rest())
    with_fs = sum(c.usd_per_hour for c in gcp_settings(shared_fs="filestore").cost_at_rest())
    assert with_fs == pytest.approx(plain + filestore)
    lines = deploy_cloud.pool_lines(aws_settings(shared_fs="efs"))  # unchanged by the option
    assert len(lines) == 2
    efs = [c for c in aws_settings(shared_fs="efs").cost_at_rest() if c.what.startswith("EFS")]
    assert efs == [catalog.CostLine("EFS ($0.30/GB-month stored)", 0.0)]


def test_describe_names_the_shared_fs_and_prices_it(moto_env: str) -> None:  # noqa: F811
    s = aws_settings(shared_fs="efs")
    lines = deploy_cloud.describe("aws", {"cluster_id": CID, "region": "us-east-1", "settings": s.to_json(),
                                          "shared_fs": "fs-0123abcd"})
    assert f"Storage:  efs fs-0123abcd at {render.SHARED_FS_MOUNT} on the master and the agents" in lines
    assert any(line.startswith("At rest:") and "EFS ($0.30/GB-month stored) $0.000" in line for line in lines)
    plain = deploy_cloud.describe("aws", {"cluster_id": CID, "region": "us-east-1",
                                          "settings": aws_settings().to_json()})
    assert not any(line.startswith("Storage:") or "EFS" in line for line in plain)


def test_aws_efs_needs_one_subnet_per_zone(moto_env: str) -> None:  # noqa: F811
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=z)["Subnet"]["SubnetId"]
               for i, z in enumerate(("us-east-1a", "us-east-1b", "us-east-1a"))]
    deploy_cloud.check_aws_network(aws_settings(vpc_id=vpc, subnet_ids=tuple(subnets)))  # fine without EFS
    with pytest.raises(CliError, match="one subnet per availability zone .* more than one in us-east-1a"):
        deploy_cloud.check_aws_network(aws_settings(vpc_id=vpc, subnet_ids=tuple(subnets), shared_fs="efs"))


def test_down_delete_data_deletes_the_efs_and_its_mount_targets(moto_env: str) -> None:  # noqa: F811
    ec2 = boto3.client("ec2", region_name="us-east-1")
    efs = boto3.client("efs", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    fs = efs.create_file_system(CreationToken=f"shipyard-{CID}-efs", Encrypted=True)["FileSystemId"]
    efs.create_mount_target(FileSystemId=fs, SubnetId=subnet)
    other = efs.create_file_system(CreationToken="someone-else")["FileSystemId"]
    outputs = {"region": "us-east-1", "cluster_id": CID, "shared_fs": fs}
    deploy_cloud.delete_shared_fs("aws", outputs, poll_s=0.05, wait_s=10)
    left = [f["FileSystemId"] for f in efs.describe_file_systems()["FileSystems"]]
    assert left == [other]
    deploy_cloud.delete_shared_fs("aws", outputs, poll_s=0.05)  # already gone: nothing to do
    deploy_cloud.delete_shared_fs("aws", {"region": "us-east-1", "shared_fs": ""})  # no shared fs


class _Recorded:
    """Filestore's REST API as far as `down --delete-data` uses it."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.urls: list[str] = []

    def delete(self, url: str) -> Any:
        self.urls.append(url)
        return type("R", (), {"status_code": self.status, "text": "{}"})()


def test_down_delete_data_deletes_the_filestore_instance() -> None:
    outputs = {"project": "my-project-1", "zone": "us-central1-a", "shared_fs": f"{CID}-ckpt"}
    api = _Recorded(200)
    deploy_cloud.delete_shared_fs("gcp", outputs, session=api)
    assert api.urls == [f"https://file.googleapis.com/v1/projects/my-project-1/locations/us-central1-a/instances/{CID}-ckpt"]
    deploy_cloud.delete_shared_fs("gcp", outputs, session=_Recorded(404))  # already gone
    with pytest.raises(CliError, match="HTTP 403"):
        deploy_cloud.delete_shared_fs("gcp", outputs, session=_Recorded(403))


def test_settings_of_a_stack_without_the_new_fields_still_load() -> None:
    """Stacks created before these options hold settings without them: read with the defaults."""
    old = json.loads(AwsSettings(cluster_id=CID, keypair="k", inbound_cidr="203.0.113.0/24").to_json())
    for key in ("master_config_template", "shared_fs"):
        old.pop(key)
    s = settings_from_json("aws", json.dumps(old))
    assert s.shared_fs == "none" and s.master_config_template == {}
    assert GcpSettings(cluster_id=CID, project="my-project-1", inbound_cidr="203.0.113.0/24").shared_fs == "none"


def test_gcp_filestore_on_an_existing_network_is_exported_to_its_subnetwork_only() -> None:
    s = gcp_settings(shared_fs="filestore", network="shared-net", subnetwork="shared-sub")
    rec, _ = run(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    fs = one(rec, "filestore/instance:Instance").inputs
    assert fs["networks"][0]["network"] == "shared-net"
    # The subnetwork's range as the lookup reports it (tests/infra/conftest.py), not the VPC's.
    assert fs["fileShares"]["nfsExportOptions"][0]["ipRanges"] == ["10.128.0.0/20"]
