"""A deployment's settings, from `det deploy aws|gcp` flags: checked here, before any cloud call.

Every problem is a `DeployInputError` whose message is one line naming the flag. The settings travel
to the Pulumi program as JSON in the stack's config (`shipyard:settings`); the passwords travel
separately, as Pulumi secrets (`shipyard:dbPassword`, `shipyard:adminPassword`), and never appear in
the settings, the rendered master.yaml or any user-data.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from infra import DEPLOY_TAG, catalog, template
from shipyard_common import clouds

_CLUSTER_ID_RE = re.compile(r"^[a-z][a-z0-9-]{1,20}[a-z0-9]$")
_KEYPAIR_RE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,254}$")
_DNS_NAME_RE = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_VPC_RE = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET_RE = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_GCP_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_CPU_PLATFORM_RE = re.compile(r"^(Intel|AMD|Ampere) [A-Z][A-Za-z0-9 ]{1,40}$")
_SSH_KEY_RE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( [^\n]*)?$")
# The user the `--keypath` key logs in as on GCP (the `ssh-keys` metadata creates it).
GCP_SSH_USER = "shipyard"
_DURATION_RE = re.compile(r"^\d+(\.\d+)?(s|m|h)?$")
# What RDS refuses in a master password (and what would need quoting in a URL anyway).
_DB_PASSWORD_FORBIDDEN = set('/@" \\')
DB_PASSWORD_MIN = 8
DB_PASSWORD_MAX = 128
MAX_AGENTS = 1000

# "": the master installs the release `det deploy` ships to the bucket (infra/release.py).
DEFAULT_PACKAGE = ""
# Ubuntu for the master, and images with NVIDIA drivers and cloud-init for the agents.
AWS_MASTER_AMI = "resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
AWS_AGENT_AMI = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
AWS_AUX_AMI = AWS_MASTER_AMI
AWS_SSM_ROOT_DEVICE = "/dev/sda1"  # the root device of the Ubuntu-based AMIs above
GCP_MASTER_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
GCP_AGENT_IMAGE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"
GCP_AUX_IMAGE = GCP_MASTER_IMAGE
# Trials run in containers on cloud pools (`container_runtime: docker`): the agents' boot installs
# Docker, and NVIDIA's container toolkit on GPU instances (agent_bootstrap/cloud_init.py and
# templates/shipyard-docker-setup.sh; the default GPU images above carry the NVIDIA driver). A trial
# whose experiment sets environment.image runs in that image, unchanged; the others in these public
# PyTorch images (the CUDA runtime image runs on CPU-only agents too).
CONTAINER_RUNTIMES = ("docker", "process")
# The master's scheduling policies (control_plane/core/scheduling; tests/infra checks they agree).
SCHEDULER_TYPES = ("priority", "fair_share")
GPU_ENV_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
CPU_ENV_IMAGE = GPU_ENV_IMAGE
# A Docker image reference: [registry[:port]/]path[:tag][@sha256:digest].
_IMAGE_RE = re.compile(r"^([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                       r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$")


# `--shared-fs`: each cloud's managed NFS; Filestore's basic HDD tier starts at 1 TiB.
SHARED_FS_AWS = "efs"
SHARED_FS_GCP = "filestore"
FILESTORE_TIER = "BASIC_HDD"
FILESTORE_CAPACITY_GB = catalog.FILESTORE_MIN_GB


class DeployInputError(ValueError):
    """A flag value `det deploy` refuses; the message is one line that names the flag."""


def _fail(flag: str, reason: str) -> DeployInputError:
    return DeployInputError(f"--{flag}: {reason}")


def check_cluster_id(value: str | None) -> str:
    if not value:
        raise _fail("cluster-id", "required (a name for the cluster, e.g. --cluster-id ml-prod)")
    if not _CLUSTER_ID_RE.match(value):
        raise _fail("cluster-id", f"{value!r} must be 3 to 22 lowercase letters, digits and '-', "
                                  "starting with a letter")
    return value


def check_cidr(flag: str, value: str | None, *, allow_open: bool, open_flag: str = "allow-open-ssh") -> str:
    if not value:
        raise _fail(flag, "required (the address block allowed in, e.g. 203.0.113.0/24)")
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise _fail(flag, f"{value!r} is not a CIDR block (e.g. 203.0.113.0/24)") from None
    if net.prefixlen == 0 and not allow_open:
        raise _fail(flag, f"{value} would open SSH to the whole internet; give a narrower block, "
                          f"or pass --{open_flag} to accept it")
    return str(net)


def check_password(flag: str, value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) < DB_PASSWORD_MIN:
        raise _fail(flag, f"too short: the database accepts {DB_PASSWORD_MIN} to {DB_PASSWORD_MAX} characters")
    if len(value) > DB_PASSWORD_MAX:
        raise _fail(flag, f"too long: the database accepts {DB_PASSWORD_MIN} to {DB_PASSWORD_MAX} characters")
    bad = sorted(set(value) & _DB_PASSWORD_FORBIDDEN) or sorted(c for c in set(value) if not c.isprintable())
    if bad:
        raise _fail(flag, f"must not contain {' '.join(repr(c) for c in bad)} (refused by the database)")
    return value


def read_tls_pair(cert_path: str | None, key_path: str | None) -> tuple[str, str] | None:
    """`--master-tls-cert` / `--master-tls-key`: both files or neither; PEM; the key is the
    certificate's (OpenSSL loads the pair as the master will). Returns (cert PEM, key PEM)."""
    if not cert_path and not key_path:
        return None
    if not cert_path or not key_path:
        missing = "master-tls-cert" if not cert_path else "master-tls-key"
        given = "master-tls-key" if not cert_path else "master-tls-cert"
        raise _fail(missing, f"required with --{given} (the master serves HTTPS with the pair)")
    texts = []
    for flag, path in (("master-tls-cert", cert_path), ("master-tls-key", key_path)):
        try:
            text = Path(path).expanduser().read_text("ascii")
        except (OSError, UnicodeDecodeError) as e:
            raise _fail(flag, f"cannot read {path}: {getattr(e, 'strerror', None) or 'not a PEM text file'}") from None
        texts.append(text)
    cert, key = texts
    if "-----BEGIN CERTIFICATE-----" not in cert:
        raise _fail("master-tls-cert", f"{cert_path} holds no PEM certificate")
    if "PRIVATE KEY-----" not in key or "ENCRYPTED" in key:
        raise _fail("master-tls-key", f"{key_path} holds no unencrypted PEM private key")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            str(Path(cert_path).expanduser()), str(Path(key_path).expanduser()))
    except ssl.SSLError as e:
        raise _fail("master-tls-key", f"{key_path} does not go with {cert_path} ({e.reason or e})") from None
    return cert, key


def read_master_config_template(path: str | None) -> dict[str, Any]:
    """`--master-config-template`: a YAML mapping of master.yaml settings (checked by the settings)."""
    if not path:
        return {}
    try:
        text = Path(path).expanduser().read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _fail("master-config-template",
                    f"cannot read {path}: {getattr(e, 'strerror', None) or 'not a UTF-8 text file'}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise _fail("master-config-template", f"{path} is not YAML{where}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise _fail("master-config-template", f"{path}: the top level must be a mapping of master.yaml settings")
    try:
        json.dumps(loaded)  # it travels in the stack's settings, as JSON
    except (TypeError, ValueError):
        raise _fail("master-config-template", f"{path}: values must be strings, numbers, booleans, lists or "
                                              "mappings (quote dates and timestamps)") from None
    return loaded


def read_ssh_public_key(path: str | None) -> str | None:
    """`--keypath`: the text of an SSH public key file (the .pub, never the private key)."""
    if not path:
        return None
    try:
        text = Path(path).expanduser().read_text("ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise _fail("keypath", f"cannot read {path}: {getattr(e, 'strerror', None) or 'not a text file'}") from None
    if "PRIVATE KEY" in text:
        raise _fail("keypath", f"{path} is a private key: give the public one ({path}.pub)")
    return text


def _duration(flag: str, value: str) -> str:
    if not _DURATION_RE.match(value.strip()):
        raise _fail(flag, f"{value!r} is not a duration like 300s, 10m or 1h")
    return value.strip()


def _count(flag: str, value: int, lo: int = 0, hi: int = MAX_AGENTS) -> int:
    if not lo <= value <= hi:
        raise _fail(flag, f"must be between {lo} and {hi}, got {value}")
    return value


def parse_tags(values: list[str] | None, *, cloud: Literal["aws", "gcp"]) -> dict[str, str]:
    """`--add-tag key=value` (repeatable) as a mapping, checked against the cloud's rules."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail("add-tag", f"{item!r} is not key=value")
        if key in (DEPLOY_TAG,) or key.lower().startswith(("aws:", "shipyard:", "shipyard-")):
            raise _fail("add-tag", f"{key!r}: keys starting with 'aws:', 'shipyard:' or 'shipyard-' "
                                   f"and {DEPLOY_TAG!r} are reserved")
        if cloud == "aws" and (len(key) > 128 or len(value) > 256):
            raise _fail("add-tag", f"{key!r}: AWS allows keys of 128 and values of 256 characters")
        if cloud == "gcp" and not (clouds.GCP_LABEL_KEY.match(key) and clouds.GCP_LABEL_VALUE.match(value)):
            raise _fail("add-tag", f"{item!r}: GCP labels are lowercase letters, digits, '_' and '-' "
                                   "(keys start with a letter, at most 63 characters)")
        out[key] = value
    if len(out) > 40:
        raise _fail("add-tag", "at most 40 tags")
    return out


def _instance_type(flag: str, value: str, table: Mapping[str, catalog.InstanceType], where: str) -> str:
    if value not in table:
        raise _fail(flag, f"unknown instance type {value!r} (known {where}: {', '.join(sorted(table))})")
    return value


@dataclass(frozen=True)
class _Common:
    cluster_id: str = ""
    inbound_cidr: str = ""
    allow_open_ssh: bool = False
    min_dynamic_agents: int = 0
    max_dynamic_agents: int = 5
    max_aux_agents: int = 2
    max_idle_agent_period: str = "10m"
    # An instance whose agent has not connected this long after launch is replaced.
    max_agent_starting_period: str = "20m"
    # Both pools' scheduler (the master's `scheduler:` of each pool).
    scheduler_type: str = "priority"
    preemption_enabled: bool = True
    spot: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    # A pip requirement for Shipyard on the master (a version, a wheel URL, a VCS URL) instead of the
    # wheel `det deploy` ships (the default, "").
    shipyard_package: str = DEFAULT_PACKAGE
    port: int = 8080
    db_storage_gb: int = 20
    container_runtime: str = "docker"
    cpu_env_image: str = CPU_ENV_IMAGE
    gpu_env_image: str = GPU_ENV_IMAGE
    # The master's certificate (PEM, with its chain; its key travels as a Pulumi secret), and the DNS
    # name in it by which the agents reach the master's private address (their /etc/hosts).
    master_tls_cert: str = ""
    master_cert_name: str = ""
    # `--master-config-template`: master.yaml settings merged over the rendered config (infra/template.py).
    master_config_template: dict[str, Any] = field(default_factory=dict)
    # `--shared-fs`: checkpoints on a shared file system (AWS: efs, GCP: filestore) mounted on the master
    # and every agent at render.SHARED_FS_MOUNT, instead of the bucket; "none": the bucket.
    shared_fs: str = "none"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def tls(self) -> bool:
        return bool(self.master_tls_cert)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def all_tags(self) -> dict[str, str]:
        """The user's tags plus the deployment's own (which nothing overrides)."""
        return {**self.tags, DEPLOY_TAG: self.cluster_id}

    def _check_common(self) -> None:
        check_cluster_id(self.cluster_id)
        _count("min-dynamic-agents", self.min_dynamic_agents)
        _count("max-dynamic-agents", self.max_dynamic_agents)
        _count("max-aux-agents", self.max_aux_agents)
        if self.min_dynamic_agents > self.max_dynamic_agents:
            raise _fail("min-dynamic-agents", f"{self.min_dynamic_agents} is more than --max-dynamic-agents "
                                              f"{self.max_dynamic_agents}")
        _duration("max-idle-agent-period", self.max_idle_agent_period)
        _duration("max-agent-starting-period", self.max_agent_starting_period)
        if self.scheduler_type not in SCHEDULER_TYPES:
            raise _fail("scheduler-type", f"{self.scheduler_type!r} is not one of {', '.join(SCHEDULER_TYPES)}")
        if not 20 <= self.db_storage_gb <= 16384:
            raise _fail("db-storage-gb", f"must be between 20 and 16384, got {self.db_storage_gb}")
        if self.container_runtime not in CONTAINER_RUNTIMES:
            raise _fail("container-runtime", f"{self.container_runtime!r} is not one of {', '.join(CONTAINER_RUNTIMES)}")
        for flag, image in (("cpu-env-image", self.cpu_env_image), ("gpu-env-image", self.gpu_env_image)):
            if len(image) > 255 or not _IMAGE_RE.match(image):
                raise _fail(flag, f"{image!r} is not a Docker image reference (e.g. {GPU_ENV_IMAGE})")
        if self.master_tls_cert and not self.master_cert_name:
            raise _fail("master-cert-name", "required with --master-tls-cert: a DNS name the certificate is "
                                            "valid for (the agents reach the master by it)")
        if self.master_cert_name and not self.master_tls_cert:
            raise _fail("master-cert-name", "only applies with --master-tls-cert and --master-tls-key")
        if self.master_cert_name and not _DNS_NAME_RE.match(self.master_cert_name):
            raise _fail("master-cert-name", f"{self.master_cert_name!r} is not a DNS name (e.g. det.example.com)")
        if self.shipyard_package != self.shipyard_package.strip() or "\n" in self.shipyard_package:
            raise _fail("shipyard-package", "must be one pip requirement (e.g. shipyard==0.1.0)")
        try:
            template.check(self.master_config_template)
        except template.TemplateError as e:
            raise _fail("master-config-template", str(e)) from None
        # In the order the stack's settings JSON keeps it (sorted), so that the master.yaml rendered from
        # the flags and the one rendered again from the stack are the same text (same user-data: the
        # master is not replaced by a later `up`).
        object.__setattr__(self, "master_config_template",
                           json.loads(json.dumps(self.master_config_template, sort_keys=True)))

    def _check_shared_fs(self, kind: str) -> None:
        if self.shared_fs not in (kind, "none"):
            raise _fail("shared-fs", f"{self.shared_fs!r} is not one of {kind}, none")


@dataclass(frozen=True)
class AwsSettings(_Common):
    region: str = "us-east-1"
    keypair: str = ""
    master_instance_type: str = "m6i.large"
    compute_agent_instance_type: str = "g4dn.xlarge"
    aux_agent_instance_type: str = "t3.large"
    spot_max_price: str | None = None
    db_instance_class: str = "db.t4g.medium"
    use_default_vpc: bool = False
    # An existing VPC and its subnets (at least two, in two availability zones: RDS needs them; the
    # master goes in the first, which must route to an internet gateway) instead of a new VPC.
    vpc_id: str = ""
    subnet_ids: tuple[str, ...] = ()
    # `down` keeps the CloudWatch log group (retain_on_delete), unless --no-retain-log-group.
    retain_log_group: bool = True
    master_ami: str = AWS_MASTER_AMI
    agent_ami: str = AWS_AGENT_AMI
    aux_ami: str = AWS_AUX_AMI

    def __post_init__(self) -> None:
        self._check_common()
        if self.region not in catalog.AWS_REGIONS:
            raise _fail("region", f"unknown AWS region {self.region!r} (known: {', '.join(catalog.AWS_REGIONS)})")
        if not self.keypair:
            raise _fail("keypair", "required (the name of an EC2 key pair in the region, for SSH)")
        if not _KEYPAIR_RE.match(self.keypair):
            raise _fail("keypair", f"{self.keypair!r} is not an EC2 key pair name")
        check_cidr("inbound-cidr", self.inbound_cidr, allow_open=self.allow_open_ssh)
        for flag, value in (("master-instance-type", self.master_instance_type),
                            ("compute-agent-instance-type", self.compute_agent_instance_type),
                            ("aux-agent-instance-type", self.aux_agent_instance_type)):
            _instance_type(flag, value, catalog.AWS_INSTANCE_TYPES, "on AWS")
        if catalog.AWS_INSTANCE_TYPES[self.compute_agent_instance_type].gpus == 0:
            raise _fail("compute-agent-instance-type", f"{self.compute_agent_instance_type} has no GPU; "
                                                       "the compute pool needs a GPU instance type")
        if self.db_instance_class not in catalog.AWS_DB_CLASSES:
            raise _fail("db-instance-class", f"unknown RDS class {self.db_instance_class!r} "
                                             f"(known: {', '.join(catalog.AWS_DB_CLASSES)})")
        if self.spot_max_price is not None:
            if not self.spot:
                raise _fail("spot-max-price", "only applies with --spot")
            try:
                if float(self.spot_max_price) <= 0:
                    raise ValueError
            except ValueError:
                raise _fail("spot-max-price", f"{self.spot_max_price!r} is not a price in USD per hour") from None
        parse_tags([f"{k}={v}" for k, v in self.tags.items()], cloud="aws")
        self._check_shared_fs(SHARED_FS_AWS)
        self._check_network()

    def _check_network(self) -> None:
        object.__setattr__(self, "subnet_ids", tuple(self.subnet_ids))
        if self.vpc_id and self.use_default_vpc:
            raise _fail("vpc-id", "give --vpc-id or --default-vpc, not both")
        if self.vpc_id and not _VPC_RE.match(self.vpc_id):
            raise _fail("vpc-id", f"{self.vpc_id!r} is not a VPC id (vpc-0123abcd...)")
        for subnet in self.subnet_ids:
            if not _SUBNET_RE.match(subnet):
                raise _fail("subnet-id", f"{subnet!r} is not a subnet id (subnet-0123abcd...)")
        if self.subnet_ids and not self.vpc_id:
            raise _fail("subnet-id", "only applies with --vpc-id (the VPC the subnets are in)")
        if self.vpc_id and len(set(self.subnet_ids)) < 2:
            raise _fail("subnet-id", "give two or more subnets of the VPC, in two availability zones (RDS needs "
                                     "them; the master goes in the first), e.g. --subnet-id subnet-a --subnet-id subnet-b")

    @classmethod
    def from_json(cls, text: str) -> AwsSettings:
        return cls(**json.loads(text))

    def cost_at_rest(self) -> list[catalog.CostLine]:
        return catalog.aws_cost_at_rest(self.master_instance_type, self.db_instance_class, self.db_storage_gb,
                                        efs=self.shared_fs == SHARED_FS_AWS)


@dataclass(frozen=True)
class GcpSettings(_Common):
    project: str = ""
    zone: str = "us-central1-a"
    master_instance_type: str = "e2-standard-2"
    compute_agent_instance_type: str = "n1-standard-8"
    aux_agent_instance_type: str = "e2-standard-4"
    gpu_type: str = "nvidia-tesla-t4"
    gpu_num: int = 1
    db_tier: str = "db-custom-1-3840"
    # An existing VPC network and its subnetwork in the zone's region, instead of new ones.
    network: str = ""
    subnetwork: str = ""
    # `--keypath`: an SSH public key (the file's text) for user GCP_SSH_USER on the master and the
    # agents, through the `ssh-keys` metadata (the master's OS Login is then off).
    ssh_public_key: str = ""
    min_cpu_platform_master: str = ""
    min_cpu_platform_agent: str = ""
    master_image: str = GCP_MASTER_IMAGE
    agent_image: str = GCP_AGENT_IMAGE
    aux_image: str = GCP_AUX_IMAGE

    def __post_init__(self) -> None:
        self._check_common()
        if not self.project:
            raise _fail("project", "required (the GCP project id to deploy into)")
        if not clouds.is_gcp_project_id(self.project):
            raise _fail("project", f"{self.project!r} is not a GCP project id (6 to 30 lowercase letters, digits "
                                   "and '-', starting with a letter, not ending with '-')")
        if self.zone not in catalog.GCP_ZONES:
            raise _fail("zone", f"unknown GCP zone {self.zone!r} (known: {', '.join(catalog.GCP_ZONES)})")
        check_cidr("inbound-cidr", self.inbound_cidr, allow_open=self.allow_open_ssh)
        for flag, value in (("master-instance-type", self.master_instance_type),
                            ("compute-agent-instance-type", self.compute_agent_instance_type),
                            ("aux-agent-instance-type", self.aux_agent_instance_type)):
            _instance_type(flag, value, catalog.GCP_MACHINE_TYPES, "on GCP")
        _count("gpu-num", self.gpu_num, 1, catalog.GCP_MAX_GPUS_PER_VM)
        offered = catalog.GCP_ZONES[self.zone]
        if self.gpu_type not in offered:
            raise _fail("gpu-type", f"{self.gpu_type!r} is not offered in {self.zone} "
                                    f"(offered: {', '.join(sorted(offered))})")
        built_in = catalog.gcp_gpu_of(self.compute_agent_instance_type)
        if built_in and built_in != self.gpu_type:
            raise _fail("gpu-type", f"{self.compute_agent_instance_type} comes with {built_in}, not {self.gpu_type}")
        if not built_in and self.gpu_type not in catalog.GCP_ATTACHABLE_GPUS:
            raise _fail("gpu-type", f"{self.gpu_type} cannot be attached to {self.compute_agent_instance_type} "
                                    f"(attachable: {', '.join(catalog.GCP_ATTACHABLE_GPUS)})")
        if not built_in and not self.compute_agent_instance_type.startswith("n1-"):
            raise _fail("compute-agent-instance-type", f"GPUs attach to N1 machine types only, not "
                                                       f"{self.compute_agent_instance_type}")
        if self.db_tier not in catalog.GCP_SQL_TIERS:
            raise _fail("db-tier", f"unknown Cloud SQL tier {self.db_tier!r} (known: {', '.join(catalog.GCP_SQL_TIERS)})")
        parse_tags([f"{k}={v}" for k, v in self.tags.items()], cloud="gcp")
        self._check_shared_fs(SHARED_FS_GCP)
        for flag, name in (("network", self.network), ("subnetwork", self.subnetwork)):
            if name and not _GCP_NAME_RE.match(name):
                raise _fail(flag, f"{name!r} is not a GCP resource name (lowercase letters, digits and '-', "
                                  "starting with a letter)")
        if self.ssh_public_key and not _SSH_KEY_RE.match(self.ssh_public_key):
            raise _fail("keypath", "not an OpenSSH public key (one line: ssh-ed25519 AAAA... comment)")
        for flag, platform in (("min-cpu-platform-master", self.min_cpu_platform_master),
                               ("min-cpu-platform-agent", self.min_cpu_platform_agent)):
            if platform and not _CPU_PLATFORM_RE.match(platform):
                raise _fail(flag, f"{platform!r} is not a CPU platform name (e.g. 'Intel Ice Lake', 'AMD Milan')")
        if bool(self.network) != bool(self.subnetwork):
            missing, given = ("subnetwork", "network") if self.network else ("network", "subnetwork")
            raise _fail(missing, f"required with --{given} (an existing subnetwork of that network in "
                                 f"{self.region})")

    @property
    def region(self) -> str:
        return catalog.gcp_region(self.zone)

    @property
    def attaches_gpus(self) -> bool:
        """N1 machines get `gpu_num` attached GPUs; accelerator-optimized types come with theirs."""
        return not catalog.gcp_gpu_of(self.compute_agent_instance_type)

    @classmethod
    def from_json(cls, text: str) -> GcpSettings:
        return cls(**json.loads(text))

    def cost_at_rest(self) -> list[catalog.CostLine]:
        return catalog.gcp_cost_at_rest(self.master_instance_type, self.db_tier, self.db_storage_gb,
                                        filestore_gb=FILESTORE_CAPACITY_GB if self.shared_fs == SHARED_FS_GCP else 0)


Settings = AwsSettings | GcpSettings


def settings_from_json(cloud: str, text: str) -> Settings:
    return AwsSettings.from_json(text) if cloud == "aws" else GcpSettings.from_json(text)


def settings_kwargs(values: Mapping[str, Any], cls: type[_Common]) -> dict[str, Any]:
    """The fields of `cls` found in `values` (e.g. argparse's namespace), None meaning the default."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names and v is not None}
