"""The entry point: text in, a typed and fully defaulted config plus warnings out, or
``ConfigInvalid`` with every problem found."""

from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from control_plane.core.expconf.checks import semantic_checks
from control_plane.core.expconf.defaults import merge_defaults
from control_plane.core.expconf.describe import yaml_type
from control_plane.core.expconf.errors import ConfigInvalid, FieldError
from control_plane.core.expconf.loading import json_problems, load_document
from control_plane.core.expconf.messages import field_errors
from control_plane.core.expconf.models.experiment import ExperimentConfig
from control_plane.core.expconf.models.hyperparameters import Hyperparameter

__all__ = ["parse_experiment_config"]

_FIELD_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    name: TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation)
    for name, info in ExperimentConfig.model_fields.items()
}


_HP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Hyperparameter)


def _valid_hparams(raw: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameters that validate on their own, so their range checks still run when a
    sibling is broken (the broken one is already reported)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            out[name] = _HP_ADAPTER.validate_python(value)
        except ValidationError:
            if isinstance(value, dict) and "type" not in value:
                out[name] = _valid_hparams(value)
    return out


def _valid_parts(raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The sections of a config that failed validation as a whole, each validated on its own so
    cross-field checks still run on the parts that are fine. Returns them (field name → typed
    value, defaults for absent optional fields) and whether every hyperparameter validated."""
    parts: dict[str, Any] = {}
    complete = True
    for name, adapter in _FIELD_ADAPTERS.items():
        if name not in raw:
            info = ExperimentConfig.model_fields[name]
            if not info.is_required():
                parts[name] = info.get_default(call_default_factory=True)
            continue
        try:
            parts[name] = adapter.validate_python(raw[name])
        except ValidationError:
            if name == "hyperparameters" and isinstance(raw[name], dict):
                parts[name] = _valid_hparams(raw[name])
                complete = False
    return parts, complete


def parse_experiment_config(
    text: str | bytes,
    *,
    default_checkpoint_storage: dict[str, Any] | None = None,
    default_resource_pool: str = "default",
    experiment_seed: int | None = None,
    max_grid_trials: int = 10_000,
    refuse_short_asha_rungs: bool = True,
) -> tuple[ExperimentConfig, list[str]]:
    """Parse, default and validate a YAML (or JSON) experiment config.

    Returns the fully defaulted config and human-readable warnings; raises ``ConfigInvalid``
    listing every problem. ``default_checkpoint_storage`` is the master's, merged like Determined
    does; ``experiment_seed`` is used when the config sets none, so the stored config replays.
    ``refuse_short_asha_rungs=False`` turns the "smallest ASHA rung under one unit" error into a
    warning (Determined itself lowers max_rungs in that case)."""
    doc = load_document(text)
    if not isinstance(doc, dict):
        got = "an empty document" if doc is None else f"a {yaml_type(doc)}"
        raise ConfigInvalid([FieldError("", f"the config must be a mapping of fields (got {got})")])
    problems = json_problems(doc)
    if problems:
        raise ConfigInvalid(problems)

    raw = merge_defaults(
        doc,
        default_checkpoint_storage=default_checkpoint_storage,
        default_resource_pool=default_resource_pool,
        experiment_seed=experiment_seed,
    )
    errors: list[FieldError] = []
    warnings: list[str] = []
    config: ExperimentConfig | None = None
    complete = True
    try:
        config = ExperimentConfig.model_validate(raw)
        parts: dict[str, Any] = {name: getattr(config, name) for name in ExperimentConfig.model_fields}
    except ValidationError as exc:
        errors.extend(field_errors(ExperimentConfig, raw, exc))
        parts, complete = _valid_parts(raw)
    semantic_checks(
        parts,
        max_grid_trials,
        errors,
        warnings,
        hparams_complete=complete,
        refuse_short_rungs=refuse_short_asha_rungs,
    )
    if errors:
        raise ConfigInvalid(list(dict.fromkeys(errors)))
    assert config is not None
    return config, warnings
