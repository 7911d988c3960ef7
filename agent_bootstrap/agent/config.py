"""Agent configuration: defaults < YAML file (`--config`) < `DET_AGENT_*` environment < command line.

The same names are used everywhere: a YAML key `agent_reconnect_attempts`, the environment variable
`DET_AGENT_AGENT_RECONNECT_ATTEMPTS` (prefix + upper-cased key) and the option
`--agent-reconnect-attempts`. The credential is `token` or `token_file`; it is never logged and
never shown in a repr.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "DET_AGENT_"
DEFAULT_MASTER_URL = "http://127.0.0.1:8080"


class ConfigError(Exception):
    """The agent configuration is unusable; the message names the field."""


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    master_url: str = DEFAULT_MASTER_URL
    resource_pool: str = Field("default", min_length=1)
    agent_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    token: Optional[str] = Field(default=None, repr=False)
    token_file: Optional[Path] = None
    work_dir: Path = Field(default_factory=lambda: Path.home() / ".shipyard-agent")
    # CPU slot count, used whenever the agent offers CPU slots (slot_type cpu, or auto without GPUs).
    slots: Optional[int] = Field(default=None, ge=1, le=1024)
    slot_type: Literal["auto", "cpu", "cuda"] = "auto"
    # The agent keeps reconnecting to a lost master for as long as it runs, its tasks running
    # meanwhile; it gives up (kills its tasks, runs on_connection_lost, exits 4) only when one of
    # these explicit limits is set and reached: failed attempts in a row, or seconds since the
    # connection was lost.
    agent_reconnect_attempts: Optional[int] = Field(None, ge=1)
    reconnect_give_up_s: Optional[float] = Field(None, gt=0)
    agent_reconnect_backoff: float = Field(1.0, gt=0)
    # Upper bound of one backoff wait. The master also announces its own cap at registration
    # (its agent_reconnect_cap_s, from which its agent-lost grace derives); the lower one applies.
    agent_reconnect_backoff_max: float = Field(15.0, gt=0)
    on_connection_lost: Optional[str] = None
    instance_id: Optional[str] = None
    # Long-poll timeout of GET .../commands; the long-poll is also the heartbeat, so it stays well
    # under the master's agent_heartbeat_timeout_s (20 s by default).
    poll_timeout: float = Field(10.0, gt=0, le=60)
    http_timeout: float = Field(30.0, gt=0)
    default_kill_grace: float = Field(10.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_flush_interval: float = Field(0.25, gt=0)
    log_batch_lines: int = Field(500, ge=1)
    # Bound of the log buffer while the master is unreachable; beyond it the oldest lines are
    # dropped (and the drop is reported) rather than blocking the task's pipes.
    log_buffer_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024)
    model_def_max_bytes: int = Field(96 * 1024 * 1024, gt=0)
    # Attempts at fetching a task's model definition while the master does not answer; None (the
    # default): for as long as the task is wanted, like every other retry of the agent.
    model_def_fetch_attempts: Optional[int] = Field(None, ge=1)
    keep_task_dirs: bool = False
    # Who tasks run as (agent/identity.py): `per_user` (a root agent runs each Shipyard user's tasks
    # as uid/gid task_uid_base + user id, never as root) or `agent` (as the agent's own user).
    task_user: Literal["per_user", "agent"] = "per_user"
    task_uid_base: int = Field(200000, ge=1000, le=2**31 - 2**24)
    # Where task directories go (default <work_dir>/tasks); task users must be able to traverse
    # its ancestors.
    task_dir: Optional[Path] = None
    # The task runtime by its registered name (agent_bootstrap/agent/runtime); checked at start-up:
    # `process` (tasks as host processes) or `docker` (tasks as containers, the settings below).
    runtime: str = Field("process", min_length=1)
    # docker: the engine's address (default: $DOCKER_HOST, else the local socket).
    docker_host: Optional[str] = None
    # docker: the image of a task whose experiment sets no environment.image, per slot type.
    container_image_cpu: Optional[str] = None
    container_image_cuda: Optional[str] = None
    # docker: the user the container runs as (`uid[:gid]` or a name in the image; default the image's).
    container_user: Optional[str] = None
    # docker: host paths bound read-only into every container, at the same path (e.g. a Python
    # environment shared by the trials), or `host_path:container_path`.
    container_mounts: list[str] = Field(default_factory=list)
    # docker: bind the harness into every container and give its Python, after the image's own
    # packages, the libraries the harness needs (runtime/harness_libs.py): for unmodified images.
    container_harness_libs: bool = False
    # Spot/preemptible interruption notices (agent/interruption.py): `aws` or `gcp` watches that
    # cloud's instance metadata (at metadata_url, default the cloud's own address); on a notice the
    # master asks the agent's tasks to checkpoint and stop, and a task still running at the notice's
    # deadline less interruption_kill_margin_s gets SIGTERM (then SIGKILL after that margin).
    interruption_watch: Literal["off", "aws", "gcp"] = "off"
    metadata_url: Optional[str] = None
    interruption_poll_s: float = Field(5.0, gt=0, le=60)
    interruption_kill_margin_s: float = Field(10.0, ge=0, le=110)

    @field_validator("master_url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            # Determined's agent takes a bare host; accept that and default to http.
            v = "http://" + v
        return v

    @field_validator("work_dir", "token_file", "task_dir", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        if v is None or v == "":
            return None
        return Path(os.path.expanduser(str(v)))

    @field_validator("container_mounts", mode="before")
    @classmethod
    def _mount_list(cls, v: Any) -> Any:
        if isinstance(v, str):  # from the command line or the environment: comma-separated
            return [part.strip() for part in v.split(",") if part.strip()]
        return [] if v is None else v

    @field_validator("container_mounts")
    @classmethod
    def _absolute_mounts(cls, v: list[str]) -> list[str]:
        for entry in v:
            if not all(part.startswith("/") for part in entry.split(":", 1)):
                raise ValueError(f"container_mounts: {entry!r} must be an absolute path or host_path:container_path")
        return v

    @field_validator("metadata_url")
    @classmethod
    def _metadata_url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("metadata_url: must start with http:// or https://")
        return v.rstrip("/") if v else v

    @field_validator("on_connection_lost", "instance_id", "token", "docker_host", "container_image_cpu",
                     "container_image_cuda", "container_user", "metadata_url", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip() == "" else v

    @model_validator(mode="after")
    def _backoff(self) -> AgentConfig:
        if self.agent_reconnect_backoff_max < self.agent_reconnect_backoff:
            raise ValueError("agent_reconnect_backoff_max: must be >= agent_reconnect_backoff")
        return self

    def resolve_token(self) -> str:
        """The credential: `token` if given, else the first line of `token_file`."""
        if self.token:
            return self.token.strip()
        if self.token_file is not None:
            try:
                text = self.token_file.read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ConfigError(f"token_file: cannot read {self.token_file}: {e.strerror}") from None
            if not text:
                raise ConfigError(f"token_file: {self.token_file} is empty")
            return text.splitlines()[0].strip()
        raise ConfigError("token: no agent token; pass --token, --token-file or set DET_AGENT_TOKEN")


# (option, type for argparse, help). Everything here is also a YAML key and a DET_AGENT_* variable.
_OPTIONS: list[tuple[str, Any, str]] = [
    ("master_url", str, f"master URL (default {DEFAULT_MASTER_URL})"),
    ("resource_pool", str, "resource pool to join (default: default)"),
    ("agent_id", str, "agent id (default: the host name)"),
    ("token", str, "agent token (prefer --token-file or DET_AGENT_TOKEN: argv is visible to other users)"),
    ("token_file", str, "file holding the agent token"),
    ("work_dir", str, "work directory for task directories and the pidfile (default ~/.shipyard-agent)"),
    ("slots", int, "number of CPU slots to offer when the agent offers CPU slots (default 1)"),
    ("slot_type", str, "auto (GPUs if nvidia-smi finds any, else CPU), cpu or cuda"),
    ("agent_reconnect_attempts", int, "give up after this many failed reconnect attempts in a row "
                                      "(default: never)"),
    ("reconnect_give_up_s", float, "give up when the master has been unreachable this long, seconds "
                                   "(also --give-up-after; default: never)"),
    ("agent_reconnect_backoff", float, "base backoff between reconnect attempts, seconds (default 1)"),
    ("agent_reconnect_backoff_max", float, "cap of one backoff wait, seconds (default 15; the master's "
                                           "announced cap applies when lower)"),
    ("on_connection_lost", str, "shell command run once when the agent gives up on the master"),
    ("instance_id", str, "cloud instance id (set by the bootstrap)"),
    ("poll_timeout", float, "long-poll / heartbeat timeout, seconds (default 10)"),
    ("http_timeout", float, "timeout of ordinary HTTP calls, seconds (default 30)"),
    ("default_kill_grace", float, "SIGTERM→SIGKILL grace when a command names none (default 10)"),
    ("log_level", str, "debug, info, warning or error"),
    ("log_flush_interval", float, "flush task logs at least this often, seconds (default 0.25)"),
    ("log_batch_lines", int, "flush task logs when this many lines are buffered (default 500)"),
    ("log_buffer_bytes", int, "bound of buffered task logs while the master is unreachable"),
    ("model_def_max_bytes", int, "refuse model definitions that unpack to more than this"),
    ("model_def_fetch_attempts", int, "give up fetching a task's model definition after this many failed "
                                      "attempts (default: never, while the task is wanted)"),
    ("task_user", str, "who tasks run as: per_user (default; a root agent runs each user's tasks as "
                       "uid task_uid_base + user id) or agent (the agent's own user)"),
    ("task_uid_base", int, "per_user: the uid/gid of user N's tasks is this + N (default 200000)"),
    ("task_dir", str, "where task directories go (default <work_dir>/tasks)"),
    ("runtime", str, "task runtime: process (default: tasks as process groups on this host) or docker "
                     "(tasks as containers)"),
    ("docker_host", str, "docker runtime: Docker engine address (default $DOCKER_HOST, else the local socket)"),
    ("container_image_cpu", str, "docker runtime: image for tasks on CPU slots without environment.image"),
    ("container_image_cuda", str, "docker runtime: image for tasks on GPUs without environment.image"),
    ("container_user", str, "docker runtime: user the containers run as (default: the image's)"),
    ("container_mounts", str, "docker runtime: comma-separated host paths bound read-only into every "
                              "container (path, or host_path:container_path)"),
    ("interruption_watch", str, "watch this cloud's spot/preemption notices: off (default), aws or gcp"),
    ("metadata_url", str, "instance metadata base URL (default the cloud's: http://169.254.169.254, "
                          "http://metadata.google.internal)"),
    ("interruption_poll_s", float, "aws: seconds between reads of the spot notice (default 5)"),
    ("interruption_kill_margin_s", float, "SIGTERM a task still running this long before an interruption "
                                          "notice's deadline (default 10)"),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="det-agent",
        description="Shipyard agent: offers this host's slots to a master and runs its tasks.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", "-c", help="YAML config file (keys as the long options, with underscores)")
    for name, typ, help_text in _OPTIONS:
        flag = "--" + name.replace("_", "-")
        if name == "slot_type":
            p.add_argument(flag, choices=["auto", "cpu", "cuda"], help=help_text)
        elif name == "interruption_watch":
            p.add_argument(flag, choices=["off", "aws", "gcp"], help=help_text)
        elif name == "task_user":
            p.add_argument(flag, choices=["per_user", "agent"], help=help_text)
        elif name == "log_level":
            p.add_argument(flag, choices=["debug", "info", "warning", "error"], help=help_text)
        else:
            p.add_argument(flag, type=typ, help=help_text)
    p.add_argument("--give-up-after", dest="reconnect_give_up_s", type=float, help=argparse.SUPPRESS)
    p.add_argument("--keep-task-dirs", action="store_true", help="keep task directories after tasks exit")
    p.add_argument("--container-harness-libs", action="store_true",
                   help="docker runtime: bind the harness into every container, with the libraries it needs "
                        "(requests, tenacity, this host's bucket client) for the image's Python where the image lacks them")
    return p


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read agent config {path}: {e.strerror}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: malformed YAML: {e}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    # Accept dashed keys too (`master-url:`), as people copy them from the command line.
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}


def _from_env(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in [*(o[0] for o in _OPTIONS), "keep_task_dirs"]:
        value = env.get(ENV_PREFIX + name.upper())
        if value is not None and value != "":
            out[name] = value
    return out


def load_config(argv: list[str] | None = None, env: dict[str, str] | None = None) -> AgentConfig:
    """Merge defaults, the YAML file, the environment and the command line (later wins)."""
    env = dict(os.environ if env is None else env)
    args = vars(build_parser().parse_args(argv))
    config_path = args.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    layers = [_read_yaml(Path(config_path).expanduser()) if config_path else {}, _from_env(env), args]
    raw: dict[str, Any] = {}
    for layer in layers:
        raw.update(layer)
    # The credential given at the highest layer wins, whichever form it takes, so an operator's
    # --token-file is not shadowed by a stale token in the YAML file (token beats token_file only
    # within one layer).
    for layer in reversed(layers):
        if "token" in layer:
            break
        if "token_file" in layer:
            raw.pop("token", None)
            break
    try:
        return AgentConfig.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(msg if msg.startswith(loc + ":") else f"{loc}: {msg}")
        raise ConfigError("invalid agent config: " + "; ".join(problems)) from None
