"""The master's defaults, applied to a parsed config before it is validated: its checkpoint
storage (merged like Determined merges it), its default resource pool and the experiment seed."""

from collections.abc import Mapping
from typing import Any

__all__ = ["merge_defaults", "merge_storage"]

_STORAGE_COMMON = ("save_experiment_best", "save_trial_best", "save_trial_latest")
_SCHEMA_SECTIONS = (
    "searcher",
    "resources",
    "checkpoint_storage",
    "environment",
    "reproducibility",
    "profiling",
    "min_validation_period",
    "min_checkpoint_period",
)


def merge_storage(exp: Any, default: Mapping[str, Any] | None) -> Any:
    """Determined's union merge: the experiment's storage wins; the master's fills the gaps. GC
    fields always merge; type-specific fields only when both name the same type (or the
    experiment names none, e.g. ``checkpoint_storage: {save_trial_best: 3}``)."""
    if default is None:
        return exp
    default = {k: v for k, v in default.items() if v is not None}
    if exp is None:
        return dict(default)
    if not isinstance(exp, dict):
        return exp  # wrong type; validation reports it
    merged = {k: v for k, v in default.items() if k in _STORAGE_COMMON}
    if "type" not in exp or exp.get("type") == default.get("type"):
        merged = dict(default)
    merged.update(exp)
    return merged


def merge_defaults(
    raw: Mapping[str, Any],
    *,
    default_checkpoint_storage: Mapping[str, Any] | None = None,
    default_resource_pool: str = "default",
    experiment_seed: int | None = None,
) -> dict[str, Any]:
    """Apply the master's defaults to a parsed (not yet validated) config; returns a new dict.

    Like Determined, an explicit ``null`` in a schema field means "unset, use the default" (stored
    Determined configs are full of them); values inside free-form fields (hyperparameter
    constants, ``data``, ...) are left alone."""
    out = {k: v for k, v in raw.items() if v is not None}
    for section in _SCHEMA_SECTIONS:
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if v is not None}
    if isinstance(out.get("bind_mounts"), list):
        out["bind_mounts"] = [
            {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m
            for m in out["bind_mounts"]
        ]
    storage = merge_storage(out.get("checkpoint_storage"), default_checkpoint_storage)
    if storage is None:
        out.pop("checkpoint_storage", None)  # reported as missing, with advice
    else:
        out["checkpoint_storage"] = storage

    resources = out.get("resources")
    if resources is None:
        resources = {}
    if isinstance(resources, dict) and not resources.get("resource_pool"):
        resources = {**resources, "resource_pool": default_resource_pool}
    out["resources"] = resources

    repro = out.get("reproducibility")
    if repro is None:
        repro = {}
    if isinstance(repro, dict) and repro.get("experiment_seed") is None and experiment_seed is not None:
        repro = {**repro, "experiment_seed": experiment_seed}
    out["reproducibility"] = repro
    return out
