"""cloud-init user-data that turns a fresh AWS or GCP instance into a Shipyard agent.

The autoscaler renders it once per launch (`Autoscaler.default_user_data`). What the instance does:

1. cloud-init installs Python and the agent's libraries from the distribution
   (`packages:`; no package index is needed for Shipyard itself). The agent runs on Python 3.9 to
   3.13 (the images' own: Ubuntu 22.04 has 3.10, Debian 11 3.9);
2. `write_files` puts down the agent config (/etc/shipyard/agent.yaml), the credential
   (/etc/shipyard/agent-token, 0600), the pool's startup script if any
   (/etc/shipyard/startup-script) and the boot script (/usr/local/bin/shipyard-agent-boot);
3. `runcmd` runs the boot script (templates/shipyard-agent-boot.sh): startup script first, then
   the instance id from the metadata service (AWS IMDSv2 / GCE), the agent's code from the master
   (`GET /api/v1/agent/package`) into /opt/shipyard; where the distribution's libraries are
   missing or too old (pydantic 1), or the storage client of the instance's cloud is missing
   (boto3 on AWS, google-cloud-storage on GCP: trials checkpoint to the cluster's bucket with it,
   from the agent's interpreter), a venv on top of them with the exact versions of the package's
   constraints file (agent_bootstrap/constraints.txt, `pip install -c`; the client of the other
   cloud is never installed), readable by the trials' users; then the systemd unit
   shipyard-agent.service (Restart=on-failure, `--instance-id`/`--agent-id` = the cloud's
   instance id);
4. when the agent loses the master for good it runs `on_connection_lost` (power off by default),
   so an instance whose master is gone stops billing.

A pool with `container_runtime: docker` also gets Debian's docker.io and python3-docker, a setup
script (/usr/local/bin/shipyard-docker-setup, run before the boot script) that starts the engine
and, on an instance with NVIDIA GPUs (nvidia-smi answers), installs and configures NVIDIA's
container toolkit (from the apt sources the GPU image provides), and `runtime: docker` in the agent
config: trials then run in containers from `environment.image`, with the harness and its libraries
(the bucket's client included) added where the image lacks them (`container_harness_libs`).

The only secret in the user-data is the bootstrap token: bound to this one launch, short-lived
until first used, revoked when the instance ends (control_plane/api/agents.py). It appears once,
in the token file's content, and nowhere else (not in the config, a command line or the unit).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

import yaml

from agent_bootstrap.agent.pins import STORAGE_CLIENTS, agent_constraints, constraints_text  # noqa: F401 (the last two are this module's API)
from agent_bootstrap.agent.pins import normalized as _normalized

CONF_DIR = "/etc/shipyard"
CONFIG_PATH = f"{CONF_DIR}/agent.yaml"
TOKEN_PATH = f"{CONF_DIR}/agent-token"
STARTUP_SCRIPT_PATH = f"{CONF_DIR}/startup-script"
BOOT_SCRIPT_PATH = "/usr/local/bin/shipyard-agent-boot"
DOCKER_SETUP_PATH = "/usr/local/bin/shipyard-docker-setup"
INSTALL_DIR = "/opt/shipyard"
WORK_DIR = "/var/lib/shipyard-agent"
UNIT_NAME = "shipyard-agent.service"

METADATA_URLS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}

# Debian/Ubuntu packages: the interpreter, venv (the fallback when the distribution's pydantic is
# older than 2) and the agent's four third-party libraries.
PACKAGES = ("python3", "python3-venv", "python3-yaml", "python3-httpx", "python3-pydantic", "python3-tenacity")
# The same libraries for the venv fallback (distribution name → pip requirement), installed with
# the exact versions of the constraints file, which the agent package carries too.
PIP_REQUIREMENTS = {"httpx": "httpx", "pyyaml": "PyYAML", "pydantic": "pydantic", "tenacity": "tenacity"}
# The bucket's storage client of each cloud (distribution name → pip requirement, and the module the
# harness's checkpoint storage imports): an agent gets its own cloud's only.
STORAGE_REQUIREMENTS = {cloud: {dist: dist} for cloud, (_module, dist) in STORAGE_CLIENTS.items()}
STORAGE_MODULES = {cloud: module for cloud, (module, _dist) in STORAGE_CLIENTS.items()}
# In the source tree and in the agent package (agent_bootstrap/package.py), relative to its root.
CONSTRAINTS_PATH = "agent_bootstrap/constraints.txt"
# What `container_runtime: docker` adds: the engine, and the SDK the docker runtime speaks through.
DOCKER_PACKAGES = ("docker.io", "python3-docker")
CONTAINER_RUNTIMES = ("process", "docker")

# Agent defaults for cloud instances: ride out any master outage of less than half an hour (the
# trials keep running meanwhile), then give up and power off rather than bill an instance nobody
# can use. Time, not attempts: the wait between attempts is capped by the master.
DEFAULT_AGENT_CONFIG: dict[str, Any] = {
    "reconnect_give_up_s": 1800,
    "on_connection_lost": "systemctl poweroff || shutdown -h now",
}
# Set by the bootstrap itself: a pool's `agent:` options may not change them.
RESERVED_AGENT_OPTIONS = frozenset(
    {"master_url", "resource_pool", "token", "token_file", "agent_id", "instance_id", "config"}
)

_POOL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.~+/=-]{16,512}$")
_LAUNCH_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PLACEHOLDER_RE = re.compile(r"@@[A-Z_]+@@")


@dataclass(frozen=True)
class BootstrapParams:
    master_url: str  # as the instance reaches the master
    pool: str
    bootstrap_token: str
    provider: Literal["aws", "gcp"]
    launch_id: str
    startup_script: str = ""  # the pool's script, run as root before the agent starts
    agent_options: dict[str, Any] = field(default_factory=dict)  # extra agent.yaml keys
    container_runtime: str = "process"  # the pool's: `docker` installs the engine, agents run containers

    def __post_init__(self) -> None:
        if self.provider not in METADATA_URLS:
            raise ValueError(f"provider: must be one of {', '.join(METADATA_URLS)} (got {self.provider!r})")
        if not re.match(r"^https?://[^\s'\"]+$", self.master_url or ""):
            raise ValueError(f"master_url: must be an http(s) URL, got {self.master_url!r}")
        if not _POOL_RE.match(self.pool or ""):
            raise ValueError(f"pool: {self.pool!r} is not a resource pool name")
        if not _TOKEN_RE.match(self.bootstrap_token or ""):
            raise ValueError("bootstrap_token: not a token (URL-safe text, 16 to 512 characters)")
        if not _LAUNCH_ID_RE.match(self.launch_id or ""):
            raise ValueError(f"launch_id: {self.launch_id!r} is not a launch id")
        if not isinstance(self.startup_script, str):
            raise ValueError("startup_script: must be text")
        validate_agent_options(self.agent_options)
        if self.container_runtime not in CONTAINER_RUNTIMES:
            raise ValueError(f"container_runtime: must be one of {', '.join(CONTAINER_RUNTIMES)} "
                             f"(got {self.container_runtime!r})")


def validate_agent_options(options: Any) -> dict[str, Any]:
    """A pool's `agent:` section: known agent config keys other than the reserved ones.

    Raises ValueError naming the field; an unknown key would otherwise only show as an agent that
    never starts on every instance of the pool."""
    if not isinstance(options, dict):
        raise ValueError("agent: must be a mapping of agent options")
    from agent_bootstrap.agent.config import AgentConfig

    known = set(AgentConfig.model_fields) - RESERVED_AGENT_OPTIONS
    for key in options:
        if key in RESERVED_AGENT_OPTIONS:
            raise ValueError(f"agent.{key}: is set by the bootstrap and cannot be overridden")
        if key not in known:
            raise ValueError(f"agent.{key}: unknown agent option (known: {', '.join(sorted(known))})")
    return dict(options)


def agent_config(p: BootstrapParams) -> dict[str, Any]:
    """The content of /etc/shipyard/agent.yaml (no credential: that is token_file's job)."""
    cfg: dict[str, Any] = {
        "master_url": p.master_url.rstrip("/"),
        "resource_pool": p.pool,
        "token_file": TOKEN_PATH,
        "work_dir": WORK_DIR,
        **DEFAULT_AGENT_CONFIG,
    }
    if p.container_runtime == "docker":
        cfg["runtime"] = "docker"
        # Unmodified public images (environment.image, --cpu-env-image) lack the harness and its
        # libraries, the bucket's client included: the agent adds them (agent/runtime/harness_libs.py).
        cfg["container_harness_libs"] = True
    # Spot/preemption notices from the cloud's metadata (agent/interruption.py); on an on-demand
    # instance none ever comes. A pool's `agent: {interruption_watch: off}` turns it off.
    cfg["interruption_watch"] = p.provider
    cfg.update(p.agent_options)
    return cfg


def pip_pins(container_runtime: str = "process", provider: str | None = None) -> list[str]:
    """`name==version` of the agent's libraries, from the constraints file (the versions every
    supported Python installs; the rest of their closure is pinned there too), with the storage
    client of `provider`'s bucket (none for hosts of no cloud)."""
    pins = agent_constraints()
    wanted = dict(PIP_REQUIREMENTS, **({"docker": "docker"} if container_runtime == "docker" else {}),
                  **STORAGE_REQUIREMENTS.get(provider or "", {}))
    return [f"{name}=={pins[_normalized(dist)]}" for dist, name in wanted.items()]


def docker_setup_script() -> str:
    """Starts Docker; on a GPU instance adds NVIDIA's container toolkit and makes it Docker's GPU runtime."""
    return resources.files("agent_bootstrap").joinpath("templates/shipyard-docker-setup.sh").read_text("utf-8")


def boot_script(p: BootstrapParams, work_dir: str = WORK_DIR) -> str:
    """The boot script with this launch's values filled in (shell-quoted)."""
    template = resources.files("agent_bootstrap").joinpath("templates/shipyard-agent-boot.sh").read_text("utf-8")
    values = {
        "PROVIDER": shlex.quote(p.provider),
        "MASTER_URL": shlex.quote(p.master_url.rstrip("/")),
        "POOL": shlex.quote(p.pool),
        "POOL_COMMENT": p.pool,  # matched _POOL_RE: safe inside a comment
        "LAUNCH_ID": shlex.quote(p.launch_id),
        "WORK_DIR": shlex.quote(work_dir),
        "PIP_PINS": " ".join(shlex.quote(pin) for pin in pip_pins(p.container_runtime, p.provider)),
        "STORAGE_MODULE": STORAGE_MODULES[p.provider],  # a dotted module name: safe in the script
        "CONSTRAINTS_PATH": shlex.quote(CONSTRAINTS_PATH),
        "DEFAULT_METADATA_URL": METADATA_URLS[p.provider],
    }
    script = _PLACEHOLDER_RE.sub(lambda m: values[m.group(0).strip("@")], template)
    return script


def _startup_script(text: str) -> str:
    text = text if text.endswith("\n") else text + "\n"
    # A bare list of commands (the usual pool config) runs under bash; a script with its own
    # interpreter line keeps it.
    return text if text.startswith("#!") else "#!/bin/bash\nset -e\n" + text


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the user-data reads like the files it writes."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)


def render_user_data(p: BootstrapParams) -> str:
    """The instance's user-data: a `#cloud-config` YAML document."""
    cfg = agent_config(p)
    work_dir = str(cfg.get("work_dir") or WORK_DIR)
    if not work_dir.startswith("/"):
        raise ValueError(f"agent.work_dir: must be an absolute path, got {work_dir!r}")
    config_text = (
        "# Shipyard agent configuration (written by cloud-init). The credential is in token_file.\n"
        + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
    )
    files: list[dict[str, Any]] = [
        {"path": CONFIG_PATH, "owner": "root:root", "permissions": "0644", "content": config_text},
        # The bootstrap credential: bound to this launch, revoked when the instance ends.
        {"path": TOKEN_PATH, "owner": "root:root", "permissions": "0600", "content": p.bootstrap_token + "\n"},
    ]
    if p.startup_script.strip():
        files.append({"path": STARTUP_SCRIPT_PATH, "owner": "root:root", "permissions": "0700",
                      "content": _startup_script(p.startup_script)})
    files.append({"path": BOOT_SCRIPT_PATH, "owner": "root:root", "permissions": "0755",
                  "content": boot_script(p, work_dir)})
    packages = list(PACKAGES)
    runcmd: list[list[str]] = [[BOOT_SCRIPT_PATH]]
    if p.container_runtime == "docker":
        packages += DOCKER_PACKAGES
        files.append({"path": DOCKER_SETUP_PATH, "owner": "root:root", "permissions": "0755",
                      "content": docker_setup_script()})
        runcmd.insert(0, [DOCKER_SETUP_PATH])  # the engine answers before the agent starts
    doc: dict[str, Any] = {
        "package_update": True,
        "packages": packages,
        "write_files": files,
        # The boot script runs the startup script first, then the agent.
        "runcmd": runcmd,
    }
    header = (
        "#cloud-config\n"
        f"# Shipyard agent bootstrap: pool {p.pool}, launch {p.launch_id}, provider {p.provider}.\n"
    )
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)
