"""A config template under an experiment's config, merged as Determined merges them
(`schemas.Merge(config, template)` in master/pkg/schemas/merge.go over expconf's types).

The experiment's value wins wherever it sets one; the template fills what it leaves unset (absent
or null). Mappings merge key by key; lists are not merged (the experiment's list, if it has one,
replaces the template's) except where Determined's types merge them:

* `labels` (a set in Determined): the experiment's, then the template's that it lacks;
* `bind_mounts` and `resources.devices`: the experiment's, then the template's whose
  `container_path` it does not use;
* unions (`checkpoint_storage` by `type`, `searcher` by `name`, each hyperparameter by `type`): the
  common fields merge; the template's type-specific fields only when both name the same member (or
  the experiment names none).

`environment.image` and `environment.environment_variables` are read in both of their forms (one
value for every device, or a `cpu`/`gpu` mapping), as Determined parses them before merging.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["merge_template"]

_UNIONS: dict[str, tuple[str, frozenset[str]]] = {
    "checkpoint_storage": ("type", frozenset({"save_experiment_best", "save_trial_best", "save_trial_latest"})),
    "searcher": ("name", frozenset({"metric", "smaller_is_better", "source_trial_id", "source_checkpoint_uuid"})),
}
_BY_CONTAINER_PATH = ("bind_mounts", "resources.devices")
_PER_DEVICE = ("environment.image", "environment.environment_variables")


def merge_template(config: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The experiment's `config` over the `template`; a new dict, neither input changed."""
    return _merge(config, template, "")


def _merge(obj: Any, src: Any, path: str) -> Any:
    if obj is None:
        return copy.deepcopy(src)
    if src is None:
        return copy.deepcopy(obj)
    if path in _PER_DEVICE:
        obj, src = _per_device(obj), _per_device(src)
    if path == "labels" and isinstance(obj, list) and isinstance(src, list):
        return [*obj, *(x for x in src if x not in obj)]
    if path in _BY_CONTAINER_PATH and isinstance(obj, list) and isinstance(src, list):
        used = {m.get("container_path") for m in obj if isinstance(m, dict)}
        return [*copy.deepcopy(obj), *(copy.deepcopy(m) for m in src
                                       if not (isinstance(m, dict) and m.get("container_path") in used))]
    if not (isinstance(obj, dict) and isinstance(src, dict)):
        return copy.deepcopy(obj)  # scalars and lists: the experiment's (a type clash too; validation says so)
    union = _UNIONS.get(path) or (("type", frozenset()) if path.startswith("hyperparameters.") else None)
    if union is not None:
        src = _union_part(obj, src, *union)
    out = {k: copy.deepcopy(v) for k, v in obj.items()}
    for key, value in src.items():
        out[key] = _merge(obj.get(key), value, f"{path}.{key}" if path else key)
    return out


def _union_part(obj: dict[str, Any], src: dict[str, Any], key: str, common: frozenset[str]) -> dict[str, Any]:
    """What of the template's union member may merge: all of it when the experiment names no
    member or the same one, else only the fields every member shares."""
    if key not in src or obj.get(key) in (None, src[key]):
        return src
    return {k: v for k, v in src.items() if k in common}


def _per_device(value: Any) -> Any:
    """`x` → `{cpu: x, gpu: x}`; a mapping as it is (its absent keys stay absent)."""
    if value is None or isinstance(value, dict):
        return value
    return {"cpu": value, "gpu": value}
