"""What the trial process knows about itself, read once from the environment the agent set.

The variables are the TaskSpec `env` of docs/PROTOCOL.md. Everything is parsed up front so a
malformed value fails at init with the variable's name, not deep inside training.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shipyard_common.task_env import TRIAL_ENV_VARS

# The names the master sets (shipyard_common/task_env.py writes them).
ENV_VARS = TRIAL_ENV_VARS


class ClusterInfoError(ValueError):
    """A DET_* variable is missing or malformed."""


@dataclass(frozen=True)
class ClusterInfo:
    master_url: str | None
    session_token: str | None = field(default=None, repr=False)
    cluster_id: str | None = None
    trial_id: int | None = None
    experiment_id: int | None = None
    allocation_id: str | None = None
    task_id: str | None = None
    task_type: str = "TRIAL"
    trial_run_id: int = 0
    trial_seed: int = 0
    hparams: dict[str, Any] = field(default_factory=dict)
    experiment_config: dict[str, Any] = field(default_factory=dict)
    latest_checkpoint: str | None = None
    slot_ids: list[int] = field(default_factory=list)
    agent_id: str | None = None

    @property
    def on_cluster(self) -> bool:
        return bool(self.master_url) and self.trial_id is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ClusterInfo:
        def opt(name: str) -> str | None:
            v = env.get(name)
            return v if v not in (None, "") else None

        return cls(
            master_url=opt("DET_MASTER"),
            session_token=opt("DET_SESSION_TOKEN"),
            cluster_id=opt("DET_CLUSTER_ID"),
            trial_id=_int(env, "DET_TRIAL_ID"),
            experiment_id=_int(env, "DET_EXPERIMENT_ID"),
            allocation_id=opt("DET_ALLOCATION_ID"),
            task_id=opt("DET_TASK_ID"),
            task_type=opt("DET_TASK_TYPE") or "TRIAL",
            trial_run_id=_int(env, "DET_TRIAL_RUN_ID") or 0,
            trial_seed=_int(env, "DET_TRIAL_SEED") or 0,
            hparams=_json_object(env, "DET_HPARAMS"),
            experiment_config=_json_object(env, "DET_EXPERIMENT_CONFIG"),
            latest_checkpoint=opt("DET_LATEST_CHECKPOINT"),
            slot_ids=_slot_ids(env.get("DET_SLOT_IDS")),
            agent_id=opt("DET_AGENT_ID"),
        )


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ClusterInfoError(f"{name} must be an integer, got {raw!r}") from None


def _json_object(env: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name)
    if raw in (None, ""):
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClusterInfoError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ClusterInfoError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def _slot_ids(raw: str | None) -> list[int]:
    """'[0, 1]' (the agent's JSON form) or '0,1'."""
    if raw in (None, ""):
        return []
    try:
        value = json.loads(raw)
        items = value if isinstance(value, list) else [value]
    except json.JSONDecodeError:
        items = [p for p in raw.split(",") if p.strip()]
    try:
        return [int(x) for x in items]
    except (TypeError, ValueError):
        raise ClusterInfoError(f"DET_SLOT_IDS must be a list of integers, got {raw!r}") from None
