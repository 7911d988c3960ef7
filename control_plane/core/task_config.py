"""The config of a task other than a trial (a command, a notebook, a TensorBoard), as Determined
0.38.1's `det cmd run` / `det notebook start` / `det tensorboard start` send it: `entrypoint`, `description`, `resources` (slots, pool,
priority, weight, container sizes), `environment` and `bind_mounts` (the experiment config's own
sections, so images, variables and mounts mean the same), `idle_timeout`. Fields Determined knows and
Shipyard does not use (work_dir, pbs, slurm, debug, ...) are accepted and ignored. Pure: parses and
defaults, raises `ConfigInvalid` naming every bad field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from control_plane.core.expconf import BindMount, ConfigInvalid, Environment, FieldError
from control_plane.core.expconf.messages import field_errors
from control_plane.core.expconf.models.resources import ByteSize, Devices

TaskKind = Literal["command", "notebook", "tensorboard", "shell"]
TASK_KINDS: tuple[str, ...] = ("command", "notebook", "tensorboard", "shell")
# Determined's task types, as `det task list` and DET_TASK_TYPE name them.
TASK_TYPES = {"command": "COMMAND", "notebook": "NOTEBOOK", "tensorboard": "TENSORBOARD", "shell": "SHELL"}
# Tasks that serve through the master's proxy, are ready once they report their address and are
# stopped when idle.
SERVING_KINDS: tuple[str, ...] = ("notebook", "tensorboard")
# Ready once they report their address: those and shells (which are not culled when idle).
READY_ON_ADDRESS: tuple[str, ...] = (*SERVING_KINDS, "shell")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class TaskResources(_Lenient):
    # Determined's default is one slot; 0 runs on any agent of the pool without holding a slot.
    slots: int = Field(default=1, ge=0, le=1024)
    resource_pool: str = ""
    priority: int | None = Field(default=None, ge=1, le=99)
    weight: FiniteFloat = Field(default=1.0, gt=0)
    shm_size: ByteSize = None
    memory: ByteSize = None
    # Host devices in the task's container (needs allow_task_host_access).
    devices: Devices = []


class TaskConfig(_Lenient):
    description: str | None = None
    entrypoint: list[Annotated[str, Field(min_length=1)]] | Annotated[str, Field(min_length=1)] | None = None
    resources: TaskResources = TaskResources()
    environment: Environment = Environment()
    bind_mounts: list[BindMount] = []
    # Stop an idle notebook or TensorBoard after this many seconds (traffic through the master's proxy
    # and, for Jupyter, its own kernel activity count as use); None: the master's default. Determined
    # writes a duration ("30m").
    idle_timeout: int | str | None = None
    # A TensorBoard's trials, set by the launch request (Determined's experimentIds / trialIds).
    experiment_ids: list[int] = []
    trial_ids: list[int] = []

    @property
    def idle_timeout_s(self) -> int | None:
        """The idle timeout in seconds (parse_task_config refused one that is not a duration)."""
        return idle_seconds(self.idle_timeout)


def parse_task_config(kind: str, raw: Any, *, default_pool: str) -> TaskConfig:
    """The typed config with the pool filled in; a command needs an entrypoint."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigInvalid([FieldError("", "must be a mapping")])
    try:
        cfg = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigInvalid(field_errors(TaskConfig, raw, exc)) from None
    if kind == "command" and not cfg.entrypoint:
        raise ConfigInvalid([FieldError("entrypoint", "a command needs the command to run (det cmd run -- COMMAND)")])
    idle = idle_seconds(cfg.idle_timeout)
    if cfg.idle_timeout is not None and idle is None:
        raise ConfigInvalid([FieldError("idle_timeout", f"{cfg.idle_timeout!r} is not a duration (seconds, or 30s, 5m, 1h)")])
    pool = cfg.resources.resource_pool or default_pool
    return cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"resource_pool": pool})})


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def idle_seconds(value: int | str | None) -> int | None:
    """A duration in seconds: an integer, or text like 90s, 5m, 1h."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit else text
    if not number.isdigit() or int(number) <= 0:
        return None
    return int(number) * (unit or 1)


def config_dict(cfg: TaskConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def description_of(kind: str, cfg: TaskConfig, task_id: str) -> str:
    """Determined's default: "Command (adjective-noun)" — here the kind and the id's first part."""
    if cfg.description:
        return cfg.description
    name = {"notebook": "Notebook", "tensorboard": "TensorBoard", "shell": "Shell"}.get(kind, "Command")
    return f"{name} ({task_id.split('-')[0]})"
