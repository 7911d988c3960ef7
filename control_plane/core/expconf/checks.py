"""Checks pydantic cannot express: they need several fields (a range's ends, a searcher against
its hyperparameters, slots against max_slots) or a precise path. Errors refuse the config;
warnings are handed back with it."""

import math
import posixpath
import re
from collections.abc import Iterator, Mapping
from typing import Any

from control_plane.core.expconf.describe import join_path
from control_plane.core.expconf.errors import FieldError
from control_plane.core.expconf.models.base import Length
from control_plane.core.expconf.models.hyperparameters import (
    ConstHyperparameter,
    DoubleHyperparameter,
    IntHyperparameter,
    LeafHyperparameter,
    LogHyperparameter,
    flatten_hyperparameters,
    grid_size,
)
from control_plane.core.expconf.models.resources import Resources
from control_plane.core.expconf.models.searcher import AdaptiveASHASearcher, GridSearcher, SingleSearcher
from control_plane.core.expconf.models.storage import GCSStorage, S3Storage, SharedFSStorage
from control_plane.core.searcher.asha import rungs_that_fit, smallest_rung_length
from control_plane.core.searcher.hparams import axis_length

__all__ = ["semantic_checks"]

_RANGED = (IntHyperparameter, DoubleHyperparameter, LogHyperparameter)


def _route_path(route: tuple[str, ...]) -> str:
    return ".".join(("hyperparameters", *route))


def _check_hyperparameters(hparams: dict[str, Any], errors: list[FieldError], warnings: list[str]) -> None:
    for route, hp in flatten_hyperparameters(hparams).items():
        path = _route_path(route)
        if isinstance(hp, _RANGED):
            if hp.minval >= hp.maxval:
                errors.append(
                    FieldError(
                        join_path(path, "minval"),
                        f"minval ({hp.minval}) must be less than maxval ({hp.maxval})",
                    )
                )
        if isinstance(hp, LogHyperparameter) and hp.base == 1:
            warnings.append(f"{path}.base: a log hyperparameter with base 1 always takes the value 1")


def _check_searcher(
    searcher: Any,
    hparams: dict[str, Any] | None,
    max_grid_trials: int,
    errors: list[FieldError],
    warnings: list[str],
    refuse_short_rungs: bool,
) -> None:
    if searcher.source_trial_id is not None and searcher.source_checkpoint_uuid is not None:
        errors.append(
            FieldError(
                "searcher.source_checkpoint_uuid",
                "set at most one of source_trial_id and source_checkpoint_uuid",
            )
        )
    if searcher.metric != searcher.metric.strip():
        warnings.append(f"searcher.metric: {searcher.metric!r} has leading or trailing whitespace")

    max_trials = getattr(searcher, "max_trials", None)
    max_concurrent = getattr(searcher, "max_concurrent_trials", 0)
    if max_trials is not None and max_concurrent > max_trials:
        warnings.append(
            f"searcher.max_concurrent_trials: {max_concurrent} is more than max_trials ({max_trials}); "
            f"at most {max_trials} trials will run at once"
        )

    if isinstance(searcher, AdaptiveASHASearcher):
        _check_asha(searcher, errors, warnings, refuse_short_rungs)

    if hparams is None:
        return
    leaves = flatten_hyperparameters(hparams)
    if isinstance(searcher, SingleSearcher):
        varying = [".".join(r) for r, hp in leaves.items() if not isinstance(hp, ConstHyperparameter)]
        if varying:
            warnings.append(
                "hyperparameters: the single searcher samples one value for non-constant "
                f"hyperparameters ({', '.join(varying)})"
            )
    if isinstance(searcher, GridSearcher):
        _check_grid(hparams, leaves, max_grid_trials, max_concurrent, errors, warnings)


def _check_grid(
    hparams: dict[str, Any],
    leaves: dict[tuple[str, ...], LeafHyperparameter],
    max_grid_trials: int,
    max_concurrent: int,
    errors: list[FieldError],
    warnings: list[str],
) -> None:
    missing = False
    for route, hp in leaves.items():
        if isinstance(hp, _RANGED) and hp.count is None:
            errors.append(
                FieldError(
                    join_path(_route_path(route), "count"),
                    "grid search requires count for int, double and log hyperparameters",
                )
            )
            missing = True
    if missing or any(isinstance(hp, _RANGED) and hp.minval >= hp.maxval for hp in leaves.values()):
        return
    size = grid_size(hparams)
    if size > max_grid_trials:
        lengths = {".".join(r): axis_length(hp.model_dump(mode="json")) for r, hp in leaves.items()}
        axes = [f"{name}: {n}" for name, n in lengths.items() if n > 1]
        errors.append(
            FieldError(
                "hyperparameters",
                f"grid search would create {size} trials ({' x '.join(axes)}), "
                f"more than the limit of {max_grid_trials}",
            )
        )
    elif max_concurrent > size:
        warnings.append(
            f"searcher.max_concurrent_trials: {max_concurrent} is more than the {size} grid points; "
            f"at most {size} trials will run at once"
        )


def _check_asha(
    searcher: AdaptiveASHASearcher, errors: list[FieldError], warnings: list[str], refuse_short_rungs: bool
) -> None:
    has_time = searcher.max_time is not None or searcher.time_metric is not None
    if searcher.max_length is not None and has_time:
        errors.append(
            FieldError("searcher.max_time", "set either max_length or max_time with time_metric, not both")
        )
        return
    if searcher.max_length is None and not has_time:
        errors.append(
            FieldError(
                "searcher.max_length", "adaptive_asha requires max_length (or max_time with time_metric)"
            )
        )
        return
    if has_time:
        if searcher.max_time is None:
            errors.append(FieldError("searcher.max_time", "required when time_metric is set"))
            return
        if searcher.time_metric is None:
            errors.append(FieldError("searcher.time_metric", "required when max_time is set"))
            return
        field, unit, total = "searcher.max_time", searcher.time_metric, searcher.max_time
    else:
        assert searcher.max_length is not None
        field, unit, total = "searcher.max_length", searcher.max_length.unit, searcher.max_length.value
    # The bracket with the most rungs starts at max / divisor**(max_rungs-1); under one unit the
    # rung cannot be trained (the searcher plans fewer rungs, as Determined does).
    divisor, rungs = searcher.divisor, searcher.max_rungs
    fits = rungs_that_fit(total, divisor)
    if fits < rungs:
        smallest = smallest_rung_length(total, rungs, divisor)
        needed = total / smallest
        what = (
            f"the smallest rung would be {smallest:.3g} {unit} ({total} / divisor {_fmt_num(divisor)} ** "
            f"(max_rungs {rungs} - 1)), less than one unit"
        )
        if refuse_short_rungs:
            errors.append(
                FieldError(
                    field,
                    f"{what}: raise it to at least {math.ceil(needed - 1e-9)} {unit}, "
                    f"or set max_rungs to {fits} or less",
                )
            )
        else:
            warnings.append(
                f"{field}: {what}; like Determined, at most {fits} rung{'s' if fits != 1 else ''} will be used"
            )


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def storage_problems(storage: Any) -> list[FieldError]:
    """What is wrong with a checkpoint storage on its own (paths, prefixes, key pairs), each at
    `checkpoint_storage.<field>`: also a workspace's default storage (services/workspaces.py)."""
    errors: list[FieldError] = []
    _check_storage(storage, errors)
    return errors


def _check_storage(storage: Any, errors: list[FieldError]) -> None:
    base = "checkpoint_storage"
    if isinstance(storage, SharedFSStorage):
        if not posixpath.isabs(storage.host_path):
            errors.append(FieldError(f"{base}.host_path", "must be an absolute path"))
        if storage.storage_path is not None:
            sp = storage.storage_path
            if ".." in sp.split("/"):
                errors.append(FieldError(f"{base}.storage_path", "must not contain '..'"))
            elif posixpath.isabs(sp):
                host = posixpath.normpath(storage.host_path)
                norm = posixpath.normpath(sp)
                if norm != host and not norm.startswith(host.rstrip("/") + "/"):
                    errors.append(
                        FieldError(
                            f"{base}.storage_path",
                            "must be a relative directory or a subdirectory of host_path",
                        )
                    )
    if isinstance(storage, (S3Storage, GCSStorage)) and storage.prefix is not None:
        if ".." in storage.prefix.split("/"):
            errors.append(FieldError(f"{base}.prefix", "must not contain '..'"))
    if isinstance(storage, S3Storage):
        if (storage.access_key is None) != (storage.secret_key is None):
            missing = "secret_key" if storage.secret_key is None else "access_key"
            errors.append(FieldError(f"{base}.{missing}", "access_key and secret_key must be set together"))
        if storage.endpoint_url is not None and not re.match(r"^https?://[^/\s]+", storage.endpoint_url):
            errors.append(FieldError(f"{base}.endpoint_url", "must be an http:// or https:// URL"))


def _lengths(parts: Mapping[str, Any]) -> Iterator[tuple[str, Length]]:
    for name in ("min_validation_period", "min_checkpoint_period"):
        if isinstance(parts.get(name), Length):
            yield name, parts[name]
    searcher = parts.get("searcher")
    if searcher is not None and getattr(searcher, "max_length", None) is not None:
        yield "searcher.max_length", searcher.max_length


def semantic_checks(
    parts: Mapping[str, Any],
    max_grid_trials: int,
    errors: list[FieldError],
    warnings: list[str],
    *,
    hparams_complete: bool,
    refuse_short_rungs: bool,
) -> None:
    """Check the sections of a config that validated (``parts``: field name → typed value), adding
    to ``errors`` and ``warnings``. ``hparams_complete`` is False when some hyperparameters did not
    validate, so the grid is not sized over what is left."""
    hparams = parts.get("hyperparameters")
    if hparams is not None:
        _check_hyperparameters(hparams, errors, warnings)
    if parts.get("searcher") is not None:
        # Grid sizing over a partial set of hyperparameters would be meaningless.
        whole = hparams if hparams_complete else None
        _check_searcher(parts["searcher"], whole, max_grid_trials, errors, warnings, refuse_short_rungs)

    resources = parts.get("resources")
    if isinstance(resources, Resources) and resources.max_slots is not None:
        if resources.max_slots < resources.slots_per_trial:
            errors.append(
                FieldError(
                    "resources.max_slots",
                    f"max_slots ({resources.max_slots}) is less than slots_per_trial "
                    f"({resources.slots_per_trial}); no trial could ever be scheduled",
                )
            )

    if parts.get("checkpoint_storage") is not None:
        _check_storage(parts["checkpoint_storage"], errors)

    for i, mount in enumerate(parts.get("bind_mounts") or []):
        if not posixpath.isabs(mount.host_path):
            errors.append(FieldError(f"bind_mounts[{i}].host_path", "must be an absolute path"))
        if posixpath.normpath(mount.container_path) == ".":
            errors.append(
                FieldError(f"bind_mounts[{i}].container_path", "must not be the working directory '.'")
            )

    if "workspace" in parts and "project" in parts:
        if (parts["workspace"] is None) != (parts["project"] is None):
            missing = "project" if parts["project"] is None else "workspace"
            errors.append(FieldError(missing, "workspace and project must be set together"))

    labels = parts.get("labels") or []
    if len(set(labels)) != len(labels):
        warnings.append("labels: duplicate labels are stored once")

    if parts.get("records_per_epoch") == 0:
        for path, length in _lengths(parts):
            if length.unit == "epochs":
                warnings.append(
                    f"{path}: lengths in epochs need the epoch size; records_per_epoch is not set, so "
                    "only training code that knows its epoch length (e.g. PyTorchTrial) can honour it"
                )
