"""`det deploy aws|gcp`: the Pulumi programs of infra/ driven through Pulumi's Automation API.

- `up` validates the flags (infra.settings: one line per error, before any cloud call), checks that
  the `pulumi` CLI is installed (the Automation API runs it), and creates or updates the stack named
  after the cluster id in the chosen state backend (a local directory by default);
- `up` also builds the release of this Shipyard (cli/deploy_release.py: its wheel and exact pins of its
  dependencies) and ships it to the cluster's bucket, which the master's boot installs from; then it
  waits until the master answers on its public address;
- `upgrade` ships the release of this Shipyard and restarts the master (stop, start: its unit
  installs the release `current` names before it starts); trials keep running meanwhile;
- `down` asks first (the cluster id typed back, or `--yes`), stops the master (so it launches nothing
  more), terminates every agent instance carrying the cluster's tag and waits until none is left,
  then destroys the stack and forgets it. The database leaves a final snapshot (RDS) / final backup
  (Cloud SQL) and the checkpoint bucket is kept, unless `--delete-data`;
- `list` reads the stacks of a local state directory directly (no CLI needed); other backends go
  through the CLI;
- `describe` prints the master URL, the cost at rest, the pools and the cluster's instances by tag;
- `render` writes what the stack would boot (master.yaml, the master's and agents' user-data).

Passwords: `--db-password` / `--admin-password` (or SHIPYARD_DB_PASSWORD / SHIPYARD_ADMIN_PASSWORD);
without them, the ones already in the stack are kept, or new ones are generated. They are stored as
Pulumi secrets and in the cloud's secret store, never in user-data.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cli.errors import CliError
from infra import AGENT_MANAGED_BY_LABEL, AGENT_MANAGED_BY_TAG, DEPLOY_TAG, MANAGED_BY_VALUE, catalog
from infra.settings import (
    AwsSettings,
    DeployInputError,
    GcpSettings,
    Settings,
    check_cluster_id,
    check_password,
    parse_tags,
    read_master_config_template,
    read_ssh_public_key,
    read_tls_pair,
    settings_from_json,
    settings_kwargs,
)
from shipyard_common import passwords

Cloud = Literal["aws", "gcp"]
PROJECT = "shipyard"
PULUMI_MISSING = ("the pulumi CLI is not installed (det deploy drives it): install it with "
                  "`curl -fsSL https://get.pulumi.com | sh` (see https://www.pulumi.com/docs/install/), then retry")
AGENT_WAIT_S = 600
MASTER_WAIT_S = 900
RESTART_WAIT_S = 600
# Pulumi's Automation API (with infra.__main__, the program), boto3 and google-cloud-compute are imported
# where they are used: 0.2 to 1.5 s each, and each verb needs one at most (`list` of a local state directory
# and `render` none).


def default_state_dir() -> Path:
    return Path(os.environ.get("SHIPYARD_DEPLOY_STATE_DIR", "~/.shipyard/pulumi")).expanduser()


def require_pulumi() -> None:
    if shutil.which("pulumi") is None:
        raise CliError(PULUMI_MISSING)


def settings_from_args(cloud: Cloud, args: Any) -> Settings:
    """The flags as settings; a DeployInputError becomes the CLI's one line."""
    values = dict(vars(args))
    try:
        values["tags"] = parse_tags(values.pop("add_tag", None), cloud=cloud)
        pair = read_tls_pair(values.pop("master_tls_cert_path", None), values.pop("master_tls_key_path", None))
        if pair:
            values["master_tls_cert"] = pair[0]
        values["ssh_public_key"] = read_ssh_public_key(values.pop("keypath", None))
        values["master_config_template"] = read_master_config_template(values.pop("master_config_template_path", None))
        cls = AwsSettings if cloud == "aws" else GcpSettings
        return cls(**settings_kwargs(values, cls))
    except DeployInputError as e:
        raise CliError(str(e)) from None


def check_master_config(s: Settings) -> None:
    """The master.yaml these settings render (a --master-config-template merged in) is one the master
    accepts: one line naming the key otherwise, before any cloud call. (cli.deploy_template imports
    the master's config models, ~0.1 s: only `up` and `render` pay it.)"""
    from cli.deploy_template import check_settings

    check_settings(s)


def use_aws_profile(args: Any) -> None:
    """`--profile`: the named profile of ~/.aws/config and ~/.aws/credentials for every AWS call of this
    command, the CLI's own (boto3) and Pulumi's AWS provider (both read AWS_PROFILE)."""
    profile = getattr(args, "profile", None)
    if not profile:
        return
    import boto3
    from botocore.exceptions import ProfileNotFound

    try:
        boto3.Session(profile_name=profile)
    except ProfileNotFound:
        raise CliError(f"--profile: no AWS profile {profile!r} in ~/.aws/config or ~/.aws/credentials "
                       "(AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE)") from None
    os.environ["AWS_PROFILE"] = profile  # Pulumi's provider
    boto3.setup_default_session(profile_name=profile)  # boto3.client(...) of this process


def check_aws_network(s: AwsSettings) -> None:
    """`--vpc-id`/`--subnet-id` before anything is created: the VPC exists, the subnets are in it and span
    two availability zones (RDS refuses a subnet group in one)."""
    if not s.vpc_id:
        return
    from botocore.exceptions import ClientError

    ec2 = _ec2(s.region)
    try:
        ec2.describe_vpcs(VpcIds=[s.vpc_id])
    except ClientError as e:
        raise CliError(f"--vpc-id: {s.vpc_id} not found in {s.region} ({e.response.get('Error', {}).get('Code')})") from None
    try:
        subnets = ec2.describe_subnets(SubnetIds=list(s.subnet_ids))["Subnets"]
    except ClientError as e:
        raise CliError(f"--subnet-id: {e.response.get('Error', {}).get('Message', 'not found')}") from None
    elsewhere = sorted(sn["SubnetId"] for sn in subnets if sn["VpcId"] != s.vpc_id)
    if elsewhere:
        raise CliError(f"--subnet-id: {', '.join(elsewhere)} not in {s.vpc_id}")
    zones = [sn["AvailabilityZone"] for sn in subnets]
    if len(set(zones)) < 2:
        raise CliError("--subnet-id: the subnets are all in one availability zone; RDS needs two")
    if s.shared_fs == "efs" and len(set(zones)) < len(zones):
        twice = sorted({z for z in zones if zones.count(z) > 1})
        raise CliError(f"--subnet-id: with --shared-fs efs, one subnet per availability zone (EFS has one mount "
                       f"target per zone); more than one in {', '.join(twice)}")


def tls_key_from_args(args: Any) -> str:
    """The key of `--master-tls-key` (checked with its certificate by settings_from_args), or ""."""
    try:
        pair = read_tls_pair(getattr(args, "master_tls_cert_path", None), getattr(args, "master_tls_key_path", None))
    except DeployInputError as e:
        raise CliError(str(e)) from None
    return pair[1] if pair else ""


def passwords_from_args(args: Any) -> tuple[str | None, str | None]:
    try:
        db = check_password("db-password", getattr(args, "db_password", None) or os.environ.get("SHIPYARD_DB_PASSWORD"))
        admin = check_password("admin-password",
                               getattr(args, "admin_password", None) or os.environ.get("SHIPYARD_ADMIN_PASSWORD"))
    except DeployInputError as e:
        raise CliError(str(e)) from None
    return db, admin


def cluster_id_from_args(args: Any) -> str:
    try:
        return check_cluster_id(getattr(args, "cluster_id", None))
    except DeployInputError as e:
        raise CliError(str(e)) from None


# ---- the state backend -----------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    url: str
    local_dir: Path | None  # the directory of a file:// backend

    @classmethod
    def from_args(cls, args: Any) -> Backend:
        url = getattr(args, "backend_url", None)
        if url:
            if url.startswith("file://"):
                return cls(url, Path(url.removeprefix("file://")).expanduser())
            if not url.startswith(("s3://", "gs://", "azblob://", "https://")):
                raise CliError(f"--backend-url: {url!r} is not a Pulumi state backend URL (file://, s3://, gs://)")
            return cls(url, None)
        d = (getattr(args, "state_dir", None) or default_state_dir()).expanduser().absolute()
        return cls(f"file://{d}", d)

    def env(self) -> dict[str, str]:
        env = {"PULUMI_BACKEND_URL": self.url, "PULUMI_SKIP_UPDATE_CHECK": "true"}
        if "PULUMI_CONFIG_PASSPHRASE" not in os.environ and "PULUMI_CONFIG_PASSPHRASE_FILE" not in os.environ:
            env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(self._passphrase_file())
        return env

    def _passphrase_file(self) -> Path:
        """The passphrase of the stack's secrets, beside a local state (0600), or in ~/.shipyard."""
        base = self.local_dir or Path("~/.shipyard").expanduser()
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = base / "passphrase"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        return path

    def local_stacks(self) -> list[dict[str, Any]]:
        """Stacks of project `shipyard` in a local state directory, read from its checkpoint files."""
        assert self.local_dir is not None
        root = self.local_dir / ".pulumi" / "stacks"
        files = sorted((root / PROJECT).glob("*.json")) if (root / PROJECT).is_dir() else sorted(root.glob("*.json"))
        out = []
        for f in files:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            resources = (data.get("checkpoint", {}).get("latest") or {}).get("resources") or []
            stack = next((r for r in resources if r.get("type") == "pulumi:pulumi:Stack"), {})
            outputs = stack.get("outputs") or {}
            out.append({"name": f.stem, "cloud": outputs.get("cloud", ""), "master_url": outputs.get("master_url", ""),
                        "resources": max(0, len(resources) - 1), "outputs": outputs})
        return out


def _stack(cloud: Cloud, cluster_id: str, backend: Backend, *, create: bool) -> Any:
    require_pulumi()
    from pulumi import automation as auto

    from infra.__main__ import program

    opts = auto.LocalWorkspaceOptions(
        env_vars=backend.env(),
        project_settings=auto.ProjectSettings(name=PROJECT, runtime="python", backend=auto.ProjectBackend(backend.url)))
    try:
        if create:
            return auto.create_or_select_stack(stack_name=cluster_id, project_name=PROJECT, program=program, opts=opts)
        return auto.select_stack(stack_name=cluster_id, project_name=PROJECT, program=program, opts=opts)
    except auto.StackNotFoundError:
        raise CliError(f"no stack {cluster_id!r} in {backend.url} (see `det deploy {cloud} list`)") from None


def _print_line(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


# ---- up ------------------------------------------------------------------------------------------


def up(cloud: Cloud, s: Settings, backend: Backend, *, db_password: str | None, admin_password: str | None,
       dry_run: bool, release_dir: Path | None = None, tls_key: str = "") -> dict[str, Any]:
    """Create or update the stack; with `release_dir` (a built release), ship it to the bucket."""
    from pulumi import automation as auto

    stack = _stack(cloud, s.cluster_id, backend, create=True)
    existing = stack.get_all_config()
    db_password = db_password or _existing(existing, "shipyard:dbPassword") or passwords.generate(24)
    admin_password = admin_password or _existing(existing, "shipyard:adminPassword") or passwords.generate(18)
    config = {
        "shipyard:cloud": auto.ConfigValue(cloud),
        "shipyard:settings": auto.ConfigValue(s.to_json()),
        "shipyard:dbPassword": auto.ConfigValue(db_password, secret=True),
        "shipyard:adminPassword": auto.ConfigValue(admin_password, secret=True),
    }
    if s.tls:
        config["shipyard:tlsKey"] = auto.ConfigValue(tls_key, secret=True)
    if isinstance(s, AwsSettings):
        config["aws:region"] = auto.ConfigValue(s.region)
    else:
        config["gcp:project"] = auto.ConfigValue(s.project)
        config["gcp:region"] = auto.ConfigValue(s.region)
        config["gcp:zone"] = auto.ConfigValue(s.zone)
    stack.set_all_config(config)
    if dry_run:
        stack.preview(on_output=_print_line)
        return {}
    result = stack.up(on_output=_print_line)
    outputs = {k: v.value for k, v in result.outputs.items()}
    if release_dir is not None:
        ship_release(cloud, outputs, release_dir)
    return outputs


# ---- the release: ship, upgrade -------------------------------------------------------------------


def build_release(out: Path) -> Any:
    from cli.deploy_release import build_release as build

    rel = build(out)
    _print_line(f"built {rel.wheel.name} and the pins of its dependencies")
    return rel


def ship_release(cloud: Cloud, outputs: dict[str, Any], release_dir: Path) -> str:
    """Upload the release built in `release_dir` to the stack's bucket; returns its version."""
    from cli.deploy_release import Release, ship
    from infra.release import CONSTRAINTS_NAME

    [wheel] = sorted(release_dir.glob("shipyard-*.whl"))
    rel = Release(version=wheel.name.split("-")[1], wheel=wheel, constraints=release_dir / CONSTRAINTS_NAME)
    bucket = str(outputs["checkpoint_bucket"])
    ship(cloud, bucket, rel, cluster_id=str(outputs["cluster_id"]), region=outputs.get("region"),
         project=outputs.get("project"))
    where = f"s3://{bucket}" if cloud == "aws" else f"gs://{bucket}"
    _print_line(f"shipped shipyard {rel.version} to {where}/{rel.wheel_key}")
    return rel.version


def upgrade(cloud: Cloud, outputs: dict[str, Any], *, wait_s: float = RESTART_WAIT_S, poll_s: float = 5.0,
            gce: Any = None) -> str:
    """Ship this Shipyard's release and restart the master, which installs it before it starts."""
    if outputs.get("settings"):
        s = settings_from_json(cloud, outputs["settings"])
        if s.shipyard_package:
            raise CliError(f"this cluster installs --shipyard-package {s.shipyard_package!r}, not the shipped "
                           "release: run `up` without --shipyard-package first")
    with tempfile.TemporaryDirectory(prefix="shipyard-release-") as tmp:
        build_release(Path(tmp))
        version = ship_release(cloud, outputs, Path(tmp))
    if cloud == "aws":
        restart_aws_master(str(outputs["region"]), str(outputs["master_instance_id"]), wait_s=wait_s, poll_s=poll_s)
    else:
        restart_gcp_master(str(outputs["project"]), str(outputs["zone"]), str(outputs["master_instance"]),
                           wait_s=wait_s, poll_s=poll_s, client=gce)
    return version


def restart_aws_master(region: str, instance_id: str, *, wait_s: float = RESTART_WAIT_S, poll_s: float = 5.0) -> None:
    ec2 = _ec2(region)
    ec2.stop_instances(InstanceIds=[instance_id])
    _print_line(f"stopping the master {instance_id}")
    _wait_state(lambda: ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
                ["State"]["Name"], "stopped", wait_s, poll_s, instance_id)
    ec2.start_instances(InstanceIds=[instance_id])
    _print_line(f"starting the master {instance_id}")
    _wait_state(lambda: ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
                ["State"]["Name"], "running", wait_s, poll_s, instance_id)


def restart_gcp_master(project: str, zone: str, name: str, *, wait_s: float = RESTART_WAIT_S, poll_s: float = 5.0,
                       client: Any = None) -> None:
    """`client`: (InstancesClient, ZoneOperationsClient), default the real API's."""
    instances, operations = client or (_gce(), _gce_operations())

    def run(verb: str) -> None:
        op = getattr(instances, f"{verb}_unary")(project=project, zone=zone, instance=name)
        deadline = time.monotonic() + wait_s
        while op.status != op.Status.DONE:
            if time.monotonic() > deadline:
                raise CliError(f"{verb} of {name} did not finish within {wait_s:.0f}s")
            op = operations.wait(project=project, zone=zone, operation=op.name)
        if op.error and op.error.errors:
            raise CliError(f"{verb} of {name} failed: {op.error.errors[0].message}")

    run("stop")
    _print_line(f"stopping the master {name}")
    _wait_state(lambda: instances.get(project=project, zone=zone, instance=name).status, "TERMINATED", wait_s,
                poll_s, name)
    run("start")
    _print_line(f"starting the master {name}")
    _wait_state(lambda: instances.get(project=project, zone=zone, instance=name).status, "RUNNING", wait_s, poll_s,
                name)


def _wait_state(read: Callable[[], str], want: str, wait_s: float, poll_s: float, what: str) -> None:
    deadline = time.monotonic() + wait_s
    while (state := read()) != want:
        if time.monotonic() > deadline:
            raise CliError(f"{what} is {state}, not {want}, after {wait_s:.0f}s")
        time.sleep(poll_s)
    _print_line(f"{what}: {want.lower()}")


# ---- waiting for the master -------------------------------------------------------------------------


def wait_for_master(url: str, *, timeout_s: float = MASTER_WAIT_S, poll_s: float = 10.0,
                    say: Callable[[str], None] = _print_line) -> dict[str, Any]:
    """Poll GET /api/v1/master until it answers 200; a progress line every poll; CliError at the end."""
    import httpx

    start = time.monotonic()
    last = "no answer yet"
    while True:
        try:
            # A liveness probe of an unauthenticated endpoint, nothing sent: a certificate for the
            # --master-cert-name cannot match the public address polled here.
            r = httpx.get(f"{url.rstrip('/')}/api/v1/master", timeout=10, verify=False)
            if r.status_code == 200:
                return dict(r.json())
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        elapsed = time.monotonic() - start
        if elapsed > timeout_s:
            raise CliError(f"the master at {url} did not answer within {timeout_s:.0f}s ({last}); its boot log is "
                           "in /var/log/cloud-init-output.log and `journalctl -u shipyard-master` on the instance")
        say(f"waiting for the master at {url} ({elapsed:.0f}s, {last})")
        time.sleep(poll_s)


def _existing(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    return value.value if value is not None and value.value else None


# ---- down ----------------------------------------------------------------------------------------


def confirm_down(cluster_id: str, *, delete_data: bool, read: Callable[[], str] | None = None) -> bool:
    """Ask for the cluster id back; anything else (or no terminal answer) confirms nothing."""
    kept = ("the checkpoint bucket and the database's final snapshot are DELETED too" if delete_data else
            "the checkpoint bucket and a final snapshot of the database are kept")
    sys.stderr.write(f"This terminates the master, the agents and the database of {cluster_id}; {kept}.\n"
                     f"Type the cluster id ({cluster_id}) to go on: ")
    sys.stderr.flush()
    try:
        answer = read() if read is not None else sys.stdin.readline()
    except (OSError, EOFError):
        answer = ""
    sys.stderr.write("\n")
    return answer.strip() == cluster_id


def down(cloud: Cloud, cluster_id: str, backend: Backend, *, wait_s: float = AGENT_WAIT_S,
         delete_data: bool = False) -> None:
    stack = _stack(cloud, cluster_id, backend, create=False)
    outputs = {k: v.value for k, v in stack.outputs().items()}
    if outputs:
        if cloud == "aws":
            stop_aws_master(outputs["region"], outputs.get("master_instance_id"))
            n = terminate_aws_agents(outputs["region"], cluster_id, wait_s=wait_s, say=_print_line)
        else:
            stop_gcp_master(outputs["project"], outputs["zone"], outputs.get("master_instance"))
            n = terminate_gcp_agents(outputs["project"], cluster_id, wait_s=wait_s, say=_print_line)
        _print_line(f"{n} agent instance(s) of {cluster_id} terminated")
    stack.destroy(on_output=_print_line)
    stack.workspace.remove_stack(cluster_id)
    if outputs and delete_data:
        delete_kept_data(cloud, outputs)
        delete_shared_fs(cloud, outputs)
    elif outputs:
        _print_line(f"kept: the bucket {outputs.get('checkpoint_bucket')} and the database's final "
                    f"{'snapshot ' + final_snapshot_id(cluster_id) if cloud == 'aws' else 'backup'}")
        if outputs.get("shared_fs"):
            _print_line(f"kept: the shared file system {outputs['shared_fs']} (down --delete-data deletes it)")
    if outputs and cloud == "aws" and outputs.get("settings") and outputs.get("log_group"):
        s = settings_from_json(cloud, outputs["settings"])
        if isinstance(s, AwsSettings) and s.retain_log_group:
            _print_line(f"kept: the log group {outputs['log_group']} (--no-retain-log-group at up deletes it with "
                        "the cluster)")


def final_snapshot_id(cluster_id: str) -> str:
    """The RDS final snapshot's name (infra/aws/program.py names it the same)."""
    from infra import db_final_snapshot_id

    return db_final_snapshot_id(cluster_id)


def delete_kept_data(cloud: Cloud, outputs: dict[str, Any], *, gcs: Any = None) -> None:
    """`down --delete-data`: the bucket (emptied first) and, on AWS, the final snapshot."""
    bucket = str(outputs["checkpoint_bucket"])
    cid = str(outputs["cluster_id"])
    if cloud == "aws":
        import boto3
        from botocore.exceptions import ClientError

        s3 = boto3.client("s3", region_name=outputs.get("region"))
        try:
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
                items = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                         for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                if items:
                    s3.delete_objects(Bucket=bucket, Delete={"Objects": items, "Quiet": True})
            s3.delete_bucket(Bucket=bucket)
            _print_line(f"deleted the bucket {bucket}")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchBucket":
                raise
        rds = boto3.client("rds", region_name=outputs.get("region"))
        try:
            rds.delete_db_snapshot(DBSnapshotIdentifier=final_snapshot_id(cid))
            _print_line(f"deleted the snapshot {final_snapshot_id(cid)}")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "DBSnapshotNotFound":
                raise
    else:
        from google.api_core.exceptions import NotFound

        from cli.deploy_release import gcs_bucket

        b = gcs or gcs_bucket(bucket, outputs.get("project"))
        try:
            for blob in list(b.list_blobs()):
                blob.delete()
            b.delete()
            _print_line(f"deleted the bucket {bucket} (the database's final backup expires by itself)")
        except NotFound:
            pass


def delete_shared_fs(cloud: Cloud, outputs: dict[str, Any], *, wait_s: float = AGENT_WAIT_S, poll_s: float = 5.0,
                     session: Any = None) -> None:
    """`down --delete-data`: the --shared-fs file system the stack kept (EFS, after its mount targets are
    gone; Filestore, by its REST API: this CLI carries no Filestore client library)."""
    name = outputs.get("shared_fs")
    if not name:
        return
    if cloud == "aws":
        import boto3

        efs = boto3.client("efs", region_name=outputs.get("region"))
        try:
            deadline = time.monotonic() + wait_s
            while targets := efs.describe_mount_targets(FileSystemId=name)["MountTargets"]:
                for mt in targets:
                    if mt.get("LifeCycleState") not in ("deleting", "deleted"):
                        efs.delete_mount_target(MountTargetId=mt["MountTargetId"])
                if time.monotonic() > deadline:
                    raise CliError(f"the mount targets of {name} are still there after {wait_s:.0f}s; run down again")
                time.sleep(poll_s)
            efs.delete_file_system(FileSystemId=name)
        except efs.exceptions.FileSystemNotFound:
            return
    else:
        if session is None:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            session = AuthorizedSession(credentials)
        url = (f"https://file.googleapis.com/v1/projects/{outputs.get('project')}/locations/{outputs.get('zone')}"
               f"/instances/{name}")
        r = session.delete(url)
        if r.status_code == 404:
            return
        if r.status_code >= 400:
            raise CliError(f"deleting the Filestore instance {name}: HTTP {r.status_code} {r.text[:200]}")
    _print_line(f"deleted the shared file system {name}")


def _ec2(region: str) -> Any:
    import boto3

    return boto3.client("ec2", region_name=region)


LIVE_AWS_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


def aws_agent_filters(cluster_id: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{DEPLOY_TAG}", "Values": [cluster_id]},
            {"Name": f"tag:{AGENT_MANAGED_BY_TAG}", "Values": [MANAGED_BY_VALUE]}]


def aws_instances(region: str, cluster_id: str, *, agents_only: bool = False) -> list[dict[str, Any]]:
    """The cluster's instances (the master and its agents) that are not terminated yet."""
    filters = aws_agent_filters(cluster_id) if agents_only else [{"Name": f"tag:{DEPLOY_TAG}", "Values": [cluster_id]}]
    filters.append({"Name": "instance-state-name", "Values": LIVE_AWS_STATES})
    pages = _ec2(region).get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def stop_aws_master(region: str, instance_id: str | None) -> None:
    if instance_id:
        from botocore.exceptions import ClientError

        try:
            _ec2(region).stop_instances(InstanceIds=[instance_id])
        except ClientError as e:  # already gone: nothing to stop
            if "NotFound" not in str(e.response.get("Error", {}).get("Code", "")):
                raise


def terminate_aws_agents(region: str, cluster_id: str, *, wait_s: float = AGENT_WAIT_S, poll_s: float = 5.0,
                         say: Callable[[str], None] = _print_line) -> int:
    """Terminate every agent carrying the cluster's tag; return once none is left (or raise)."""
    deadline = time.monotonic() + wait_s
    terminated: set[str] = set()
    while True:
        left = aws_instances(region, cluster_id, agents_only=True)
        ids = [i["InstanceId"] for i in left if i["State"]["Name"] != "shutting-down"]
        if not left:
            return len(terminated)
        if ids:
            _ec2(region).terminate_instances(InstanceIds=ids)
            terminated.update(ids)
            say(f"terminating {len(ids)} agent instance(s): {' '.join(ids)}")
        if time.monotonic() > deadline:
            raise CliError(f"{len(left)} agent instance(s) of {cluster_id} still not terminated after {wait_s:.0f}s; "
                           "the stack was not destroyed, run down again")
        time.sleep(poll_s)


def _gce(endpoint: str | None = None) -> Any:
    from google.cloud import compute_v1

    opts = {"api_endpoint": endpoint} if endpoint else None
    return compute_v1.InstancesClient(client_options=opts)


def _gce_operations() -> Any:
    from google.cloud import compute_v1

    return compute_v1.ZoneOperationsClient()


def gcp_instances(project: str, cluster_id: str, *, agents_only: bool = False,
                  client: Any = None) -> list[tuple[str, Any]]:
    """(zone, instance) of the cluster's VMs, the master included unless agents_only."""
    flt = f"labels.{DEPLOY_TAG} = {cluster_id}"
    if agents_only:
        flt += f" AND labels.{AGENT_MANAGED_BY_LABEL} = {MANAGED_BY_VALUE}"
    client = client or _gce()
    out = []
    for scope, scoped in client.aggregated_list(request={"project": project, "filter": flt}):
        for inst in scoped.instances:
            out.append((scope.rsplit("/", 1)[-1], inst))
    return out


def stop_gcp_master(project: str, zone: str, name: str | None) -> None:
    if name:
        from google.api_core.exceptions import NotFound

        try:
            _gce().stop(project=project, zone=zone, instance=name)
        except NotFound:
            pass


def terminate_gcp_agents(project: str, cluster_id: str, *, wait_s: float = AGENT_WAIT_S, poll_s: float = 5.0,
                         say: Callable[[str], None] = _print_line, client: Any = None) -> int:
    from google.api_core.exceptions import NotFound

    client = client or _gce()
    deadline = time.monotonic() + wait_s
    deleted: set[str] = set()
    while True:
        left = gcp_instances(project, cluster_id, agents_only=True, client=client)
        if not left:
            return len(deleted)
        for zone, inst in left:
            if inst.name not in deleted and inst.status != "STOPPING":
                try:
                    client.delete(project=project, zone=zone, instance=inst.name)
                except NotFound:
                    pass
                deleted.add(inst.name)
                say(f"deleting agent instance {inst.name} ({zone})")
        if time.monotonic() > deadline:
            raise CliError(f"{len(left)} agent instance(s) of {cluster_id} still not deleted after {wait_s:.0f}s; "
                           "the stack was not destroyed, run down again")
        time.sleep(poll_s)


# ---- list / describe -------------------------------------------------------------------------------


def list_stacks(cloud: Cloud, backend: Backend) -> list[dict[str, Any]]:
    if backend.local_dir is not None:
        stacks = backend.local_stacks()
    else:
        require_pulumi()
        from pulumi import automation as auto

        ws = auto.LocalWorkspace(env_vars=backend.env(), project_settings=auto.ProjectSettings(
            name=PROJECT, runtime="python", backend=auto.ProjectBackend(backend.url)))
        stacks = [{"name": st.name, "cloud": "", "master_url": st.url or "", "resources": st.resource_count or 0,
                   "outputs": {}} for st in ws.list_stacks()]
    return [st for st in stacks if st["cloud"] in ("", cloud)]


def stack_outputs(cloud: Cloud, cluster_id: str, backend: Backend) -> dict[str, Any]:
    if backend.local_dir is not None:
        found = next((st for st in backend.local_stacks() if st["name"] == cluster_id), None)
        if found is None:
            raise CliError(f"no stack {cluster_id!r} in {backend.url} (see `det deploy {cloud} list`)")
        return dict(found["outputs"])
    stack = _stack(cloud, cluster_id, backend, create=False)
    return {k: v.value for k, v in stack.outputs().items()}


def describe(cloud: Cloud, outputs: dict[str, Any]) -> list[str]:
    """The lines `det deploy ... describe` prints: master URL, cost at rest, pools, instances by tag."""
    lines = [f"Cluster:  {outputs.get('cluster_id', '?')} ({cloud})",
             f"Master:   {outputs.get('master_url', '?')}"]
    if outputs.get("settings"):
        s = settings_from_json(cloud, outputs["settings"])
        cost = s.cost_at_rest()
        lines.append(f"At rest:  ${sum(c.usd_per_hour for c in cost):.3f}/hour ("
                     + ", ".join(f"{c.what} ${c.usd_per_hour:.3f}" for c in cost) + ")")
        lines += [f"Pool:     {line}" for line in pool_lines(s)]
        if s.shared_fs != "none":
            from infra.render import SHARED_FS_MOUNT

            lines.append(f"Storage:  {s.shared_fs} {outputs.get('shared_fs') or '?'} at {SHARED_FS_MOUNT} "
                         "on the master and the agents")
    cid = str(outputs.get("cluster_id", ""))
    if cloud == "aws":
        for i in aws_instances(str(outputs.get("region")), cid):
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            role = tags.get("shipyard:pool", "master" if AGENT_MANAGED_BY_TAG not in tags else "?")
            lines.append(f"Instance: {i['InstanceId']}  {i['InstanceType']}  {i['State']['Name']}  {role}")
    else:
        for zone, inst in gcp_instances(str(outputs.get("project")), cid):
            role = inst.labels.get("shipyard-pool", "master" if AGENT_MANAGED_BY_LABEL not in inst.labels else "?")
            lines.append(f"Instance: {inst.name}  {inst.machine_type.rsplit('/', 1)[-1]}  {inst.status}  {zone}  {role}")
    return lines


def pool_lines(s: Settings) -> list[str]:
    if isinstance(s, AwsSettings):
        gpu = catalog.AWS_INSTANCE_TYPES[s.compute_agent_instance_type]
        compute = (f"compute  {s.compute_agent_instance_type} ({gpu.gpus}x {gpu.gpu_model}, "
                   f"${catalog.aws_agent_cost(s.compute_agent_instance_type):.3f}/h each)")
        aux = f"aux      {s.aux_agent_instance_type} (${catalog.aws_agent_cost(s.aux_agent_instance_type):.3f}/h each)"
    else:
        compute = (f"compute  {s.compute_agent_instance_type} + {s.gpu_num}x {s.gpu_type} "
                   f"(${catalog.gcp_agent_cost(s.compute_agent_instance_type, s.gpu_type, s.gpu_num):.3f}/h each)")
        aux = f"aux      {s.aux_agent_instance_type} (${catalog.gcp_agent_cost(s.aux_agent_instance_type, None, 0):.3f}/h each)"
    return [f"{compute}, {s.min_dynamic_agents} to {s.max_dynamic_agents} agents{' (spot)' if s.spot else ''}",
            f"{aux}, 0 to {s.max_aux_agents} agents"]
