"""Master configuration: `master.yaml` with `SHIPYARD_*` environment overrides.

Resource pool provider sections stay loosely typed here (a dict checked by the provider's own
config class when the pool starts) so that a bad cloud section refuses only that pool, not the
whole master.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from control_plane.core import scheduling
from control_plane.core.scheduling.policy import DEFAULT_PRIORITY
from provisioners.factory import PoolSettings, resolve
from shipyard_common.settings import SettingsError, validate

ENV_PREFIX = "SHIPYARD_"
DEFAULT_POOL = "default"
# Connections of the pool kept for the background loops (placement, autoscaler, checkpoint GC, and
# one spare), never taken by requests.
LOOP_CONNECTIONS = 4


class ConfigError(Exception):
    """The master configuration is unusable; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SchedulerConfig(_Strict):
    # A policy registered in control_plane.core.scheduling; only what runs is accepted.
    type: str = scheduling.DEFAULT_POLICY
    preemption: bool = True
    default_priority: int = Field(DEFAULT_PRIORITY, ge=1, le=99)
    # Where a gang goes among agents that can hold it: "best" packs (fewest free slots that fit),
    # "worst" spreads (most free slots).
    fitting_policy: Literal["best", "worst"] = "best"

    @field_validator("type")
    @classmethod
    def _registered_policy(cls, v: str) -> str:
        scheduling.scheduling_policy(v)  # UnknownPolicy (a ValueError) names the allowed ones
        return v


class ResourcePoolConfig(_Strict):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    # provider: {"type": <a type in provisioners/registry.py>, ...}, checked by that provider's own
    # config model when the pool starts; None means agents join by themselves.
    provider: dict[str, Any] | None = None
    max_slots_per_agent: int | None = None
    # How the pool's cloud agents run trials: `docker` makes cloud-init install Docker (and NVIDIA's
    # container toolkit on GPU instances) and start the agents with `runtime: docker`.
    container_runtime: Literal["process", "docker"] = "process"

    def settings(self) -> PoolSettings | None:
        """The pool's effective elastic settings, the only reading of its `provider:` section
        (provisioners.factory.resolve): what the autoscaler acts on is what the API, the CLI and
        the web UI show. None for a pool whose agents join by themselves; PoolConfigError (naming
        every problem) for an unusable section."""
        return resolve(self.provider) if self.provider is not None else None


class TlsConfig(_Strict):
    """`security.tls` (Determined's names): PEM files of the certificate (with its chain) and its key.
    With both, the master serves HTTPS on `port` (to everyone: users, agents and trials)."""

    cert: Path | None = None
    key: Path | None = None

    @model_validator(mode="after")
    def _both(self) -> TlsConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key: give both or neither")
        for name in ("cert", "key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        return self


class SecurityConfig(_Strict):
    tls: TlsConfig = Field(default_factory=TlsConfig)


AUTO_WORKERS_MAX = 8


class MasterConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    state_dir: Path = Field(default_factory=lambda: Path(os.path.expanduser("~/.shipyard")))
    db_url: str | None = None  # default: SQLite file in state_dir
    cluster_name: str = "shipyard"
    # The URL agents and trials use to reach the master; default derived from host/port.
    master_url: str | None = None
    admin_password: str | None = Field(default=None, repr=False)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    resource_pools: list[ResourcePoolConfig] = Field(
        default_factory=lambda: [ResourcePoolConfig(name=DEFAULT_POOL, description="default pool")]
    )
    default_resource_pool: str = DEFAULT_POOL
    checkpoint_storage: dict[str, Any] | None = None
    token_ttl_hours: float = Field(24 * 7, gt=0)
    # The key allocation tokens are derived from; kept out of the database so that a copy of the
    # database cannot mint tokens. Default: <state_dir>/token-secret. Masters sharing a database
    # must share this file.
    token_secret_file: Path | None = None
    # Login throttling: after this many failed logins in the window, further attempts for that
    # username from that address (or from that address for any username) get 429 until the oldest
    # failure leaves the window. Never per username alone: guesses from one address must not lock
    # the account's owner out from another.
    login_max_failures_per_user: int = Field(10, ge=1)
    login_max_failures_per_address: int = Field(50, ge=1)
    login_failure_window_s: float = Field(300.0, gt=0)
    # Argon2id's work factor for stored password hashes; the defaults are argon2-cffi's (RFC 9106's
    # low-memory profile: 3 passes over 64 MiB, 4 lanes). A hash made with other parameters still
    # verifies, and is re-made with these at the user's next login (auth.verify_login).
    password_hash_time_cost: int = Field(3, ge=1, le=32)
    password_hash_memory_kib: int = Field(65536, ge=1024, le=4 * 1024 * 1024)
    password_hash_parallelism: int = Field(4, ge=1, le=64)
    # The reverse proxies (addresses or CIDR networks) whose X-Forwarded-For and X-Forwarded-Proto
    # are believed: a request from one of them counts as coming from the first address in
    # X-Forwarded-For, read from the right, that is not a trusted proxy (for the login throttle,
    # the access log) and as https when the proxy says so. Nobody by default: any client can write
    # the header.
    trusted_proxies: list[str] = Field(default_factory=list)
    # Request bodies, enforced while they are read (413): `max_request_bytes` for creating an
    # experiment (its model definition travels base64 in the JSON), `max_body_bytes` for any other.
    max_request_bytes: int = Field(160 * 1024 * 1024, gt=0)
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # Request-body memory (frontdoor/body_budget.py): a body over `body_spool_bytes` (or chunked) is
    # spooled to a file in <state_dir>/request-bodies as it arrives, and until its request is answered
    # counts against its caller's budget (a user's, whatever token they use; else the client address)
    # and the host's (every master process on the host together). One that does not fit is refused
    # before it is read: 429 when the caller's own bodies fill its budget, 503 when the host's is
    # full, both with Retry-After. The host's budget bounds the master's memory
    # (docs/PERFORMANCE.md). body_budget_bytes: 0 turns budgets and spooling off.
    body_spool_bytes: int = Field(1024 * 1024, gt=0)
    body_budget_per_caller_bytes: int = Field(192 * 1024 * 1024, gt=0)
    body_budget_bytes: int = Field(320 * 1024 * 1024, ge=0)
    model_def_max_bytes: int = Field(96 * 1024 * 1024, gt=0)
    max_grid_trials: int = Field(10_000, gt=0)
    # An agent that has not polled for this long is disconnected: nothing new is placed on it.
    agent_heartbeat_timeout_s: float = Field(20.0, gt=0)
    # The longest wait between an agent's reconnect attempts. The master tells agents at
    # registration and they never wait longer (their own agent_reconnect_backoff_max only lowers
    # it). The agent-lost grace derives from it: an agent silent for agent_reconnect_cap_s +
    # agent_heartbeat_timeout_s (after a restart: from when its API answers) is lost and its
    # allocations end; a live agent retries within the cap, and the timeout covers one slow attempt.
    agent_reconnect_cap_s: float = Field(15.0, gt=0, le=3600)
    scheduler_interval_s: float = Field(0.5, gt=0)
    task_kill_grace_s: float = Field(10.0, ge=0)
    # A notebook with no traffic through the master's proxy and no kernel activity for this long is
    # stopped (loops/task_idle.py); its own config's idle_timeout wins. None: never (Determined's default).
    notebook_idle_timeout_s: float | None = Field(None, gt=0)
    # The same for a TensorBoard (Determined's tensorboard_timeout, 5 minutes; either name); None: never.
    tensorboard_timeout_s: float | None = Field(
        300.0, gt=0, validation_alias=AliasChoices("tensorboard_timeout_s", "tensorboard_timeout"))
    # `det shell open`'s tunnel (/proxy/<shell id>/ WebSocket): "ssh_key" (Determined's way, and what
    # its 0.38.1 client needs: its tunnel sends no credentials) lets a tunnel without a session reach
    # the shell's sshd, which admits only the key pair the master issued to the shell's owner; a
    # tunnel with a session must still be the owner's or an admin's. "session": a session always.
    shell_tunnel_auth: Literal["ssh_key", "session"] = "ssh_key"
    # A trial reaches only its task directory and its checkpoint storage (issue 27): experiment
    # configs with bind_mounts, resources.devices or environment.add_capabilities are refused (400)
    # unless the admin sets this.
    allow_task_host_access: bool = False
    # `det agent disable --drain`: work still running on a draining agent after this long is
    # preempted (cooperatively, then killed after the preemption grace).
    agent_drain_timeout_s: float = Field(1800.0, gt=0)
    # How long a trial asked to stop gracefully (preemption, drain, pause) may take before it is killed.
    preemption_grace_s: float = Field(300.0, ge=0)
    # Load: the connection pool, and how many requests that use the database run at once (default:
    # the pool minus what the background loops keep for themselves). Past that, up to
    # `request_queue` requests wait at most `request_queue_wait_s`; the rest get 503 + Retry-After.
    db_pool_size: int = Field(12, ge=2, le=1000)
    db_pool_timeout_s: float = Field(3.0, gt=0, le=60)
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    # The cluster's own lane: agents (registration, command polls, events, log shipping) and trials
    # (metrics, checkpoints, searcher, preemption). However busy users keep the master, agents
    # still heartbeat and trials still report, so user load never fails a trial.
    cluster_concurrent_requests: int = Field(3, ge=1, le=1000)
    # A cluster request may queue longer than a user's (agents and the harness wait 30 s for an
    # answer): when hundreds of trials start at once, their start-up calls wait their turn instead
    # of being refused and sent back, which would only add their retries to the burst. The trials'
    # reports (metrics, progress, task logs) go ahead of the rest of the lane's queue.
    cluster_queue_wait_s: float = Field(15.0, ge=0, le=30)
    # The queue holds what the lane can serve within request_queue_wait_s at its recent rate (and
    # never more than request_queue requests): a full master keeps working through its queue at
    # full speed while the clients it refuses wait out their Retry-After. 10 s rather than less: a
    # refused client backs off (the harness and the CLI exponentially), and with 1,000 clients on
    # PostgreSQL the refusals of a 5 s queue left the master idle while they waited (249 answers/s
    # against 296 with 10 s, benchmarks/master_concurrency.py).
    request_queue: int = Field(1024, ge=0, le=100_000)
    request_queue_wait_s: float = Field(10.0, ge=0, le=30)
    retry_after_s: int = Field(1, ge=1, le=60)
    # Retry-After grows with the pressure (the queue ahead at the recent service rate) from
    # retry_after_s up to this; the cluster's lane stays within half agent_heartbeat_timeout_s so
    # that an agent honouring it is never counted lost. Clients believe at most 30 s.
    retry_after_max_s: int = Field(30, ge=1, le=600)
    # GET /metrics (Prometheus text format), unauthenticated so scrapers need no login: it carries
    # no secrets, tokens or usernames. Off removes the route (404).
    metrics_enabled: bool = True
    security: SecurityConfig = Field(default_factory=SecurityConfig)

    # Processes (README, docs/ARCHITECTURE.md): `api_workers` processes serve the API and one control process
    # runs the loops; 0 means one worker per core, 1 a single process that does both.
    api_workers: int = Field(0, ge=0, le=64)
    # The leadership lease (core/lease.py): one master process runs the loops; another takes over
    # when the lease goes unrenewed this long, or at once when the leader's process has died.
    leader_lease_s: float = Field(10.0, ge=2, le=300)
    # The autoscaler's history (scaling_events, services/scaling_history.py): rows older than this many
    # days, or beyond this many per pool (newest kept), are pruned.
    scaling_history_days: float = Field(7.0, gt=0, le=3650)
    scaling_history_rows: int = Field(1000, ge=10, le=1_000_000)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or a CIDR network") from None
        return v

    @field_validator("state_dir", "token_secret_file", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        return Path(os.path.expanduser(str(v))) if v is not None else v

    @model_validator(mode="after")
    def _pools(self) -> MasterConfig:
        names = [p.name for p in self.resource_pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"resource_pools: duplicate pool names {dupes}")
        if not self.resource_pools:
            raise ValueError("resource_pools: at least one pool is required")
        if self.default_resource_pool not in names:
            raise ValueError(
                f"default_resource_pool: {self.default_resource_pool!r} is not one of the pools {names}"
            )
        if self.body_budget_bytes and not (
                max(self.max_request_bytes, self.max_body_bytes) <= self.body_budget_per_caller_bytes
                <= self.body_budget_bytes):
            raise ValueError(
                f"body_budget_per_caller_bytes ({self.body_budget_per_caller_bytes}) must be at least "
                f"max_request_bytes ({self.max_request_bytes}) and max_body_bytes ({self.max_body_bytes}), and at most "
                f"body_budget_bytes ({self.body_budget_bytes}), or a body within its limit could never be "
                "taken (body_budget_bytes: 0 turns the budgets off)"
            )
        if self.request_limit + self.cluster_concurrent_requests > self.db_pool_size - 1:
            raise ValueError(
                f"max_concurrent_requests: {self.request_limit} plus cluster_concurrent_requests "
                f"({self.cluster_concurrent_requests}) must stay below db_pool_size ({self.db_pool_size}), "
                "or admitted requests would wait for a connection"
            )
        return self

    @property
    def request_limit(self) -> int:
        """User requests admitted at once: each holds at most one connection; the cluster's lane and
        the background loops (LOOP_CONNECTIONS) keep their part of the pool."""
        if self.max_concurrent_requests is not None:
            return self.max_concurrent_requests
        return max(1, self.db_pool_size - LOOP_CONNECTIONS - self.cluster_concurrent_requests)

    @property
    def worker_processes(self) -> int:
        """API worker processes; 1 means the single-process master (API and loops together). One
        per core by default, at most AUTO_WORKERS_MAX: each worker has its own connection pool
        (db_pool_size + 10 overflow), and a 64-core host must not open 1,400 connections to a
        PostgreSQL that allows 100 by default. Set api_workers to go beyond."""
        return self.api_workers or min(AUTO_WORKERS_MAX, max(1, os.cpu_count() or 1))

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'shipyard.db'}"

    @property
    def token_secret_path(self) -> Path:
        return self.token_secret_file or self.state_dir / "token-secret"

    @property
    def agent_lost_grace_s(self) -> float:
        """How long an agent may be silent (or, after a restart, absent) before it is lost."""
        return self.agent_reconnect_cap_s + self.agent_heartbeat_timeout_s

    @property
    def tls(self) -> bool:
        return self.security.tls.cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def advertised_url(self) -> str:
        if self.master_url:
            return self.master_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def default_checkpoint_storage(self) -> dict[str, Any]:
        return self.checkpoint_storage or {
            "type": "shared_fs",
            "host_path": str(self.state_dir / "checkpoints"),
        }

    def pool(self, name: str) -> ResourcePoolConfig | None:
        return next((p for p in self.resource_pools if p.name == name), None)


# Scalar fields that may be overridden from the environment (SHIPYARD_PORT=9090 ...).
_ENV_FIELDS = (
    "host",
    "port",
    "state_dir",
    "db_url",
    "cluster_name",
    "master_url",
    "admin_password",
    "log_level",
    "default_resource_pool",
    "token_ttl_hours",
    "db_pool_size",
    "max_concurrent_requests",
    "cluster_concurrent_requests",
    "cluster_queue_wait_s",
    "request_queue",
    "request_queue_wait_s",
    "token_secret_file",
    "metrics_enabled",
    "api_workers",
    "leader_lease_s",
    "max_request_bytes",
    "max_body_bytes",
    "body_spool_bytes",
    "body_budget_per_caller_bytes",
    "body_budget_bytes",
    "password_hash_time_cost",
    "password_hash_memory_kib",
    "password_hash_parallelism",
)


def load_config(path: str | Path | None = None, env: dict[str, str] | None = None, **overrides: Any) -> MasterConfig:
    env = dict(os.environ if env is None else env)
    raw: dict[str, Any] = {}
    path = path or env.get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read master config {path}: {e.strerror}") from e
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: malformed YAML: {e}") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        raw = loaded or {}
    for name in _ENV_FIELDS:
        value = env.get(ENV_PREFIX + name.upper())
        if value is not None and value != "":
            raw[name] = value
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return validate(MasterConfig, raw)
    except SettingsError as e:  # every problem, each with its path (resource_pools[0].scheduler.type)
        raise ConfigError(f"invalid master config: {e}") from None
