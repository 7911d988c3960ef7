"""Master configuration: `master.yaml` with `SHIPYARD_*` environment overrides.

Resource pool provider sections stay loosely typed here (a dict checked by the provider's own
config class when the pool starts) so that a bad cloud section refuses only that pool, not the
whole master.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from control_plane.core import scheduling

ENV_PREFIX = "SHIPYARD_"
DEFAULT_POOL = "default"


class ConfigError(Exception):
    """The master configuration is unusable; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SchedulerConfig(_Strict):
    # A policy registered in control_plane.core.scheduling; only what runs is accepted.
    type: str = scheduling.DEFAULT_POLICY
    preemption: bool = True
    default_priority: int = Field(42, ge=1, le=99)

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
    max_request_bytes: int = Field(160 * 1024 * 1024, gt=0)
    model_def_max_bytes: int = Field(96 * 1024 * 1024, gt=0)
    max_grid_trials: int = Field(10_000, gt=0)
    agent_heartbeat_timeout_s: float = Field(20.0, gt=0)
    scheduler_interval_s: float = Field(0.5, gt=0)
    task_kill_grace_s: float = Field(10.0, ge=0)

    @field_validator("state_dir", mode="before")
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
        return self

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'shipyard.db'}"

    @property
    def advertised_url(self) -> str:
        if self.master_url:
            return self.master_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

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
        return MasterConfig.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"{loc}: {err['msg']}")
        raise ConfigError("invalid master config: " + "; ".join(lines)) from None
