"""What a stack's master boots with: its master.yaml and its cloud-init user-data, shared by the AWS and
GCP programs (and by `det deploy ... render`, which writes them without creating anything).

The master's user-data, in the spirit of the agents' (agent_bootstrap/cloud_init.py):

1. cloud-init installs Python (`packages:`);
2. `write_files` puts down /etc/shipyard/master.yaml (no secret in it), the start program
   /usr/local/bin/shipyard-master-start, the fetch program /usr/local/bin/shipyard-master-fetch and
   the boot script /usr/local/bin/shipyard-master-boot;
3. `runcmd` runs the boot script (templates/shipyard-master-boot.sh): det-master installed into a
   virtualenv from the release `det deploy` shipped to the cluster's bucket (infra/release.py; read
   with the instance's own identity by the fetch program), then the systemd unit
   shipyard-master.service, which installs the release again before each start if `current` moved;
4. the unit's ExecStart is the start program (templates/shipyard-master-start.py.in): it reads the
   admin and database passwords from the secret store (AWS Secrets Manager, GCP Secret Manager) at
   every start and execs det-master with them in its environment.

With `--shared-fs`, the master's runcmd first runs the mount script (shared_fs_mount), which gates the
boot, and the pools' startup script runs it on every agent; checkpoint storage is then `shared_fs` at
SHARED_FS_MOUNT. A `--master-config-template` is merged over the master.yaml (infra/template.py).

The user-data names the secret; it never holds a password. The master.yaml's pools are the two
the flags ask for, both elastic: `compute` (GPU agents, the default pool) and `aux` (CPU agents).
Every agent carries the deployment's tag (`infra.DEPLOY_TAG`), which the master's IAM requires.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import yaml

from infra import catalog, settings, template

CONF_DIR = "/etc/shipyard"
MASTER_CONFIG_PATH = f"{CONF_DIR}/master.yaml"
START_PATH = "/usr/local/bin/shipyard-master-start"
FETCH_PATH = "/usr/local/bin/shipyard-master-fetch"
BOOT_PATH = "/usr/local/bin/shipyard-master-boot"
STATE_DIR = "/var/lib/shipyard"
# With --master-tls-cert/--master-tls-key: the start program writes the pair from the secret store here
# (0600) before each start; master.yaml's security.tls names them.
TLS_CERT_PATH = f"{STATE_DIR}/master-tls-cert.pem"
TLS_KEY_PATH = f"{STATE_DIR}/master-tls-key.pem"
# On the agents: the master's certificate, and the trust bundle (it plus the system's CAs) the agent
# daemon and the trials it starts as processes verify the master with.
AGENT_MASTER_CERT = f"{CONF_DIR}/master-cert.pem"
AGENT_TRUST_BUNDLE = f"{CONF_DIR}/master-trust.pem"
# The interpreter and venv: the venv's pip comes from python3-venv (ensurepip's bundled wheel), so no
# python3-pip, whose Recommends pull a C toolchain (build-essential, python3-dev: ~250 MB) into the boot.
PACKAGES = ("python3", "python3-venv")
# `--shared-fs`: where the master and every agent mount the cluster's shared file system (checkpoint
# storage `type: shared_fs`, host_path this; Docker trials get it bound at the same path), and the
# script that mounts it (idempotent: /etc/fstab keeps it across reboots).
SHARED_FS_MOUNT = "/mnt/shipyard-checkpoints"
MOUNT_PATH = "/usr/local/bin/shipyard-mount-checkpoints"
# NFS options: AWS's recommended ones for EFS (NFS 4.1), and Google's for Filestore (NFS 3).
EFS_MOUNT = ("nfs4", "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport")
FILESTORE_MOUNT = ("nfs", "nfsvers=3,hard,timeo=600,retrans=3,rsize=262144,wsize=1048576")
FILESTORE_SHARE = "checkpoints"
COMPUTE_POOL = "compute"
AUX_POOL = "aux"
DB_NAME = "shipyard"
DB_USER = "shipyard"
DB_PORT = 5432
# Where the agents' sample user-data puts the token the master mints at each launch.
SAMPLE_TOKEN = "BOOTSTRAP-TOKEN-MINTED-BY-THE-MASTER-AT-EACH-LAUNCH"


@dataclass(frozen=True)
class AwsFacts:
    """What the AWS stack created that the master's config names."""

    master_private_ip: str
    bucket: str
    subnet_ids: tuple[str, ...]
    agent_security_group_id: str
    agent_instance_profile: str
    secret_id: str
    # Private endpoints (and, in tests, the moto server); None: the public AWS endpoints.
    endpoint_url: str | None = None
    # Extra agent options for both pools (e.g. CPU slots where the instance has no GPU).
    agent_options: dict[str, Any] = field(default_factory=dict)
    host: str = "0.0.0.0"
    # With --shared-fs efs: the NFS source the master and agents mount (<fs-id>.efs.<region>.amazonaws.com:/).
    shared_fs_source: str = ""


@dataclass(frozen=True)
class GcpFacts:
    master_private_ip: str
    bucket: str
    network: str  # projects/P/global/networks/NAME
    subnetwork: str  # regions/R/subnetworks/NAME
    agent_service_account: str
    secret_id: str  # projects/P/secrets/NAME
    api_endpoint: str | None = None
    agent_options: dict[str, Any] = field(default_factory=dict)
    host: str = "0.0.0.0"
    # With --shared-fs filestore: the NFS source (<instance ip>:/checkpoints).
    shared_fs_source: str = ""


def agent_name_prefix(cluster_id: str) -> str:
    """GCE names of this cluster's agents start with it; the master's IAM condition checks it."""
    return f"{cluster_id}-agent-"


def postgres_url(password: str, host: str, *, port: int = DB_PORT, user: str = DB_USER, db: str = DB_NAME) -> str:
    return f"postgresql+psycopg2://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{db}"


def secret_payload(admin_password: str, db_url: str, *, tls_cert: str = "", tls_key: str = "") -> str:
    """The secret store's value: what the start program reads (and, with TLS, writes out)."""
    payload = {"admin_password": admin_password, "db_url": db_url}
    if tls_cert:
        payload.update(tls_cert=tls_cert, tls_key=tls_key)
    return json.dumps(payload)


def _base_config(s: settings.Settings, master_ip: str, host: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "host": host,
        "port": s.port,
        "cluster_name": s.cluster_id,
        # With TLS the agents reach the master by the certificate's name (mapped to its private
        # address by their startup script, tls_startup_script).
        "master_url": f"{s.scheme}://{s.master_cert_name if s.tls else master_ip}:{s.port}",
        "state_dir": STATE_DIR,
        "log_level": "info",
    }
    if s.tls:
        config["security"] = {"tls": {"cert": TLS_CERT_PATH, "key": TLS_KEY_PATH}}
    return config


def tls_startup_script(s: settings.Settings, master_ip: str) -> str:
    """The pools' startup script with TLS: the agent resolves the certificate's name to the master's
    private address and trusts the certificate (SSL_CERT_FILE for httpx, REQUESTS_CA_BUNDLE for the
    harness of process trials) besides the system's CAs; the unit's drop-in is read when the boot
    writes and starts shipyard-agent.service."""
    cert = s.master_tls_cert.strip() + "\n"
    return "\n".join([
        "#!/bin/sh",
        "# det deploy: reach the master over TLS (--master-tls-cert, --master-cert-name).",
        "set -eu",
        f"mkdir -p {CONF_DIR} /etc/systemd/system/shipyard-agent.service.d",
        f"cat > {AGENT_MASTER_CERT} <<'SHIPYARD_CERT'",
        cert.rstrip("\n"),
        "SHIPYARD_CERT",
        f"cat {AGENT_MASTER_CERT} > {AGENT_TRUST_BUNDLE}",
        f"if [ -r /etc/ssl/certs/ca-certificates.crt ]; then cat /etc/ssl/certs/ca-certificates.crt >> "
        f"{AGENT_TRUST_BUNDLE}; fi",
        f"grep -q ' {s.master_cert_name}$' /etc/hosts || echo '{master_ip} {s.master_cert_name}' >> /etc/hosts",
        "cat > /etc/systemd/system/shipyard-agent.service.d/master-tls.conf <<'SHIPYARD_UNIT'",
        "[Service]",
        f"Environment=SSL_CERT_FILE={AGENT_TRUST_BUNDLE}",
        f"Environment=REQUESTS_CA_BUNDLE={AGENT_TRUST_BUNDLE}",
        "SHIPYARD_UNIT",
        "",
    ])


def _elastic(s: settings.Settings, *, min_instances: int, max_instances: int) -> dict[str, Any]:
    return {"min_instances": min_instances, "max_instances": max_instances,
            "max_idle_agent_period": s.max_idle_agent_period,
            "max_agent_starting_period": s.max_agent_starting_period}


def _container_options(s: settings.Settings, *, gpu: bool) -> dict[str, Any]:
    """The agents' default images (a trial's environment.image wins; agent_bootstrap/agent/daemon.py)."""
    if s.container_runtime != "docker":
        return {}
    options = {"container_image_cpu": s.cpu_env_image}
    if gpu:
        options["container_image_cuda"] = s.gpu_env_image
    return options


def mount_script(source: str, fstype: str, options: str) -> str:
    """The shell that mounts the shared file system at SHARED_FS_MOUNT, as root, on a fresh host or
    again: it installs the NFS client if missing, adds the /etc/fstab line once (nofail: a later boot
    goes on without it rather than hang) and mounts unless mounted, retrying while the file system's
    address comes up (an EFS mount target takes a minute or two after it is created)."""
    return "\n".join([
        "#!/bin/sh",
        "# det deploy: the cluster's shared file system for checkpoints (--shared-fs).",
        "set -eu",
        "FSTAB=/etc/fstab",
        f"MOUNT_POINT={shlex.quote(SHARED_FS_MOUNT)}",
        f"SOURCE={shlex.quote(source)}",
        f"FSTYPE={shlex.quote(fstype)}",
        f"OPTIONS={shlex.quote(options)}",
        "if ! command -v mount.nfs >/dev/null 2>&1 && [ ! -x /sbin/mount.nfs ]; then",
        "  if command -v apt-get >/dev/null 2>&1; then",
        "    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nfs-common",
        "  else",
        "    yum install -y -q nfs-utils",
        "  fi",
        "fi",
        'mkdir -p "$MOUNT_POINT"',
        'if ! awk -v m="$MOUNT_POINT" \'$2 == m { found = 1 } END { exit !found }\' "$FSTAB" 2>/dev/null; then',
        '  echo "$SOURCE $MOUNT_POINT $FSTYPE $OPTIONS,_netdev,nofail 0 0" >> "$FSTAB"',
        "fi",
        "tries=0",
        'until mountpoint -q "$MOUNT_POINT"; do',
        '  if mount -t "$FSTYPE" -o "$OPTIONS" "$SOURCE" "$MOUNT_POINT"; then break; fi',
        "  tries=$((tries + 1))",
        '  if [ "$tries" -ge 30 ]; then echo "cannot mount $SOURCE on $MOUNT_POINT" >&2; exit 1; fi',
        "  sleep 10",
        "done",
        "",
    ])


def shared_fs_mount(s: settings.Settings, source: str) -> str:
    """The mount script of the cluster's --shared-fs, or "" without one."""
    if s.shared_fs == "none":
        return ""
    fstype, options = EFS_MOUNT if isinstance(s, settings.AwsSettings) else FILESTORE_MOUNT
    return mount_script(source, fstype, options)


def _startup_script(s: settings.Settings, master_ip: str, mount: str) -> str:
    """The pools' startup script: TLS trust (with a certificate), then the shared file system's mount."""
    parts = [tls_startup_script(s, master_ip)] if s.tls else []
    if mount:
        parts.append(mount)
    if len(parts) < 2:
        return "".join(parts)
    return parts[0] + "".join(p.split("\n", 1)[1] for p in parts[1:])  # one interpreter line


def _storage(s: settings.Settings, bucket_storage: dict[str, Any]) -> dict[str, Any]:
    if s.shared_fs == "none":
        return bucket_storage
    return {"type": "shared_fs", "host_path": SHARED_FS_MOUNT}


def _pools(s: settings.Settings, compute: dict[str, Any], aux: dict[str, Any], compute_what: str,
           aux_what: str, master_ip: str, shared_fs_source: str = "") -> list[dict[str, Any]]:
    script = _startup_script(s, master_ip, shared_fs_mount(s, shared_fs_source))
    if script:
        for provider in (compute, aux):
            provider["startup_script"] = script
    scheduler = {"type": s.scheduler_type, "preemption": s.preemption_enabled}
    return [{"name": COMPUTE_POOL, "description": compute_what, "container_runtime": s.container_runtime,
             "scheduler": dict(scheduler), "provider": compute},
            {"name": AUX_POOL, "description": aux_what, "container_runtime": s.container_runtime,
             "scheduler": dict(scheduler), "provider": aux}]


def aws_master_config(s: settings.AwsSettings, f: AwsFacts) -> dict[str, Any]:
    aux = catalog.AWS_INSTANCE_TYPES[s.aux_agent_instance_type]

    def provider(image: str, instance_type: str) -> dict[str, Any]:
        p: dict[str, Any] = {
            "type": "aws",
            "region": s.region,
            "image_id": image,
            "instance_type": instance_type,
            "subnet_ids": list(f.subnet_ids),
            "security_group_ids": [f.agent_security_group_id],
            "iam_instance_profile": f.agent_instance_profile,
            "ssh_key_name": s.keypair,
            "tags": s.all_tags,
        }
        if image.startswith("resolve:ssm:"):
            p["root_device_name"] = settings.AWS_SSM_ROOT_DEVICE
        if f.endpoint_url:
            p["endpoint_url"] = f.endpoint_url
        return p

    compute = provider(s.agent_ami, s.compute_agent_instance_type)
    if s.spot:
        compute["spot"] = True
        if s.spot_max_price is not None:
            compute["spot_max_price"] = s.spot_max_price
    compute.update(_elastic(s, min_instances=s.min_dynamic_agents, max_instances=s.max_dynamic_agents))
    if f.agent_options or s.container_runtime == "docker":
        compute["agent"] = {**_container_options(s, gpu=True), **f.agent_options}
    aux_p = provider(s.aux_ami, s.aux_agent_instance_type)
    aux_p["instance_slots"] = aux.vcpus
    aux_p.update(_elastic(s, min_instances=0, max_instances=s.max_aux_agents))
    aux_p["agent"] = {"slot_type": "cpu", "slots": aux.vcpus, **_container_options(s, gpu=False), **f.agent_options}
    storage: dict[str, Any] = {"type": "s3", "bucket": f.bucket, "prefix": "checkpoints"}
    if f.endpoint_url:
        storage["endpoint_url"] = f.endpoint_url
    return template.apply({
        **_base_config(s, f.master_private_ip, f.host),
        "checkpoint_storage": _storage(s, storage),
        "resource_pools": _pools(s, compute, aux_p, f"GPU agents ({s.compute_agent_instance_type})",
                                 f"CPU agents ({s.aux_agent_instance_type})", f.master_private_ip, f.shared_fs_source),
        "default_resource_pool": COMPUTE_POOL,
    }, s.master_config_template)


def gcp_master_config(s: settings.GcpSettings, f: GcpFacts) -> dict[str, Any]:
    aux = catalog.GCP_MACHINE_TYPES[s.aux_agent_instance_type]

    def provider(image: str, machine_type: str, pool: str) -> dict[str, Any]:
        p: dict[str, Any] = {
            "type": "gcp",
            "project": s.project,
            "zones": [s.zone],
            "machine_type": machine_type,
            "boot_disk_source_image": image,
            "network": f.network,
            "subnetwork": f.subnetwork,
            "service_account_email": f.agent_service_account,
            "network_tags": [f"{s.cluster_id}-agent"],
            "labels": s.all_tags,
            "name_prefix": f"{agent_name_prefix(s.cluster_id)}{pool}",
        }
        if f.api_endpoint:
            p["api_endpoint"] = f.api_endpoint
        if s.min_cpu_platform_agent:
            p["min_cpu_platform"] = s.min_cpu_platform_agent
        if s.ssh_public_key:
            p["ssh_keys"] = [f"{settings.GCP_SSH_USER}:{s.ssh_public_key}"]
        return p

    compute = provider(s.agent_image, s.compute_agent_instance_type, COMPUTE_POOL)
    if s.attaches_gpus:
        compute.update(gpu_type=s.gpu_type, gpu_num=s.gpu_num)
    else:
        compute["instance_slots"] = catalog.GCP_MACHINE_TYPES[s.compute_agent_instance_type].gpus
    if s.spot:
        compute["spot"] = True
    compute.update(_elastic(s, min_instances=s.min_dynamic_agents, max_instances=s.max_dynamic_agents))
    if f.agent_options or s.container_runtime == "docker":
        compute["agent"] = {**_container_options(s, gpu=True), **f.agent_options}
    aux_p = provider(s.aux_image, s.aux_agent_instance_type, AUX_POOL)
    aux_p["instance_slots"] = aux.vcpus
    aux_p.update(_elastic(s, min_instances=0, max_instances=s.max_aux_agents))
    aux_p["agent"] = {"slot_type": "cpu", "slots": aux.vcpus, **_container_options(s, gpu=False), **f.agent_options}
    return template.apply({
        **_base_config(s, f.master_private_ip, f.host),
        "checkpoint_storage": _storage(s, {"type": "gcs", "bucket": f.bucket, "prefix": "checkpoints"}),
        "resource_pools": _pools(s, compute, aux_p,
                                 f"GPU agents ({s.compute_agent_instance_type}, {s.gpu_num}x {s.gpu_type})",
                                 f"CPU agents ({s.aux_agent_instance_type})", f.master_private_ip, f.shared_fs_source),
        "default_resource_pool": COMPUTE_POOL,
    }, s.master_config_template)


# ---- user-data -------------------------------------------------------------------------------


def _template(name: str) -> str:
    return resources.files("infra").joinpath(f"templates/{name}").read_text("utf-8")


def start_program(provider: Literal["aws", "gcp"], secret_id: str, region: str) -> str:
    values = {"PROVIDER": provider, "SECRET_ID": secret_id, "REGION": region}
    text = _template("shipyard-master-start.py.in")
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", json.dumps(value))  # a Python string literal
    return "#!/usr/bin/env python3\n" + text


def fetch_program(provider: Literal["aws", "gcp"], bucket: str, region: str) -> str:
    values = {"PROVIDER": provider, "BUCKET": bucket, "REGION": region}
    text = _template("shipyard-master-fetch.py.in")
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", json.dumps(value))
    return "#!/usr/bin/env python3\n" + text


def boto3_pin() -> str:
    """The boto3 the master's boot installs to read its bucket (AWS): the one here, which the
    release's constraints pin too."""
    from importlib import metadata

    return metadata.version("boto3")


def boot_script(package: str, provider: Literal["aws", "gcp"] = "aws") -> str:
    """`package`: "" installs the release shipped to the bucket; else that pip requirement."""
    text = _template("shipyard-master-boot.sh")
    comment = package.replace("\n", " ") or "none given"
    boto3 = boto3_pin() if provider == "aws" else ""
    return (text.replace("@@PACKAGE_COMMENT@@", comment).replace("@@PACKAGE@@", shlex.quote(package))
            .replace("@@PROVIDER@@", shlex.quote(provider)).replace("@@BOTO3@@", shlex.quote(boto3)))


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the user-data reads like the files it writes."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def master_yaml(config: dict[str, Any]) -> str:
    return ("# Shipyard master configuration (written by cloud-init, det deploy). No secret in it: the\n"
            "# passwords come from the secret store at each start (/usr/local/bin/shipyard-master-start).\n"
            + yaml.safe_dump(config, sort_keys=False, default_flow_style=False))


def master_user_data(provider: Literal["aws", "gcp"], config: dict[str, Any], *, secret_id: str, region: str,
                     package: str, cluster_id: str, bucket: str = "", mount: str = "") -> str:
    """`bucket`: the cluster's (the release is there); default, the checkpoint storage's. `mount`: the
    shared file system's mount script (shared_fs_mount), run before the master's boot, which it gates."""
    bucket = bucket or str(config["checkpoint_storage"]["bucket"])
    files = [
        {"path": MASTER_CONFIG_PATH, "owner": "root:root", "permissions": "0644", "content": master_yaml(config)},
        {"path": START_PATH, "owner": "root:root", "permissions": "0755",
         "content": start_program(provider, secret_id, region)},
        {"path": FETCH_PATH, "owner": "root:root", "permissions": "0755",
         "content": fetch_program(provider, bucket, region)},
        {"path": BOOT_PATH, "owner": "root:root", "permissions": "0755", "content": boot_script(package, provider)},
    ]
    runcmd: list[list[str]] = [[BOOT_PATH]]
    if mount:
        files.append({"path": MOUNT_PATH, "owner": "root:root", "permissions": "0755", "content": mount})
        runcmd = [["sh", "-c", f"{MOUNT_PATH} && {BOOT_PATH}"]]
    doc = {"package_update": True, "packages": list(PACKAGES), "write_files": files, "runcmd": runcmd}
    header = f"#cloud-config\n# Shipyard master of cluster {cluster_id} ({provider}), written by det deploy.\n"
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def user_data_config(user_data: str) -> dict[str, Any]:
    """The master.yaml inside a master's user-data, parsed (tests, `describe`)."""
    doc = yaml.safe_load(user_data)
    text = next(f["content"] for f in doc["write_files"] if f["path"] == MASTER_CONFIG_PATH)
    return yaml.safe_load(text)


def agent_user_data_sample(provider: Literal["aws", "gcp"], config: dict[str, Any], pool: str) -> str:
    """The user-data the master would give an agent of `pool` (with a placeholder for the token it
    mints per launch)."""
    from agent_bootstrap.cloud_init import BootstrapParams, render_user_data

    entry = next(p for p in config["resource_pools"] if p["name"] == pool)
    section = entry["provider"]
    return render_user_data(BootstrapParams(
        master_url=config["master_url"], pool=pool, bootstrap_token=SAMPLE_TOKEN, provider=provider,
        launch_id="sample-launch-id", startup_script=str(section.get("startup_script") or ""),
        agent_options=dict(section.get("agent") or {}),
        container_runtime=str(entry.get("container_runtime", "process"))))


# ---- `det deploy ... render` ------------------------------------------------------------------


# Stand-ins for what the stack creates, so that `render` needs no cloud call.
def aws_placeholder_facts(s: settings.AwsSettings) -> AwsFacts:
    return AwsFacts(master_private_ip="10.0.0.10", bucket=f"shipyard-{s.cluster_id}-<suffix>",
                    subnet_ids=s.subnet_ids or ("<subnet-a>", "<subnet-b>"), agent_security_group_id="<agent-security-group>",
                    agent_instance_profile=f"shipyard-{s.cluster_id}-agent",
                    secret_id=f"shipyard/{s.cluster_id}/master",
                    shared_fs_source=efs_source("<efs-file-system-id>", s.region))


def efs_source(file_system_id: str, region: str) -> str:
    """EFS's NFS source by its DNS name (it resolves to the mount target in the host's own zone)."""
    return f"{file_system_id}.efs.{region}.amazonaws.com:/"


def filestore_source(ip: str) -> str:
    return f"{ip}:/{FILESTORE_SHARE}"


def gcp_placeholder_facts(s: settings.GcpSettings) -> GcpFacts:
    return GcpFacts(master_private_ip="10.10.0.10", bucket=f"shipyard-{s.cluster_id}-<suffix>",
                    network=f"projects/{s.project}/global/networks/{s.network or s.cluster_id + '-net'}",
                    subnetwork=f"regions/{s.region}/subnetworks/{s.subnetwork or s.cluster_id + '-subnet'}",
                    agent_service_account=f"{s.cluster_id}-agent@{s.project}.iam.gserviceaccount.com",
                    secret_id=f"projects/{s.project}/secrets/{s.cluster_id}-master",
                    shared_fs_source=filestore_source("<filestore-ip>"))


@dataclass(frozen=True)
class Rendered:
    master_yaml: str
    master_user_data: str
    agent_user_data: dict[str, str]  # pool -> sample user-data


def placeholder_config(s: settings.Settings) -> dict[str, Any]:
    """The master.yaml `render` writes (what `up` checks a --master-config-template's result on)."""
    if isinstance(s, settings.AwsSettings):
        return aws_master_config(s, aws_placeholder_facts(s))
    return gcp_master_config(s, gcp_placeholder_facts(s))


def render(s: settings.Settings) -> Rendered:
    if isinstance(s, settings.AwsSettings):
        af = aws_placeholder_facts(s)
        config = aws_master_config(s, af)
        provider: Literal["aws", "gcp"] = "aws"
        secret_id, region, bucket, source = af.secret_id, s.region, af.bucket, af.shared_fs_source
    else:
        gf = gcp_placeholder_facts(s)
        config = gcp_master_config(s, gf)
        provider, secret_id, region, bucket, source = "gcp", gf.secret_id, s.region, gf.bucket, gf.shared_fs_source
    user_data = master_user_data(provider, config, secret_id=secret_id, region=region,
                                 package=s.shipyard_package, cluster_id=s.cluster_id, bucket=bucket,
                                 mount=shared_fs_mount(s, source))
    agents = {pool: agent_user_data_sample(provider, config, pool) for pool in (COMPUTE_POOL, AUX_POOL)}
    return Rendered(master_yaml(config), user_data, agents)


def write_rendered(r: Rendered, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in [("master.yaml", r.master_yaml), ("master-user-data.yaml", r.master_user_data),
                       *((f"agent-user-data-{pool}.yaml", text) for pool, text in r.agent_user_data.items())]:
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written
