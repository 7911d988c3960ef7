"""Hyperparameter spaces: random samples, grids, and the seeded source of new trials.

A hyperparameter config maps names to specs (Determined's shapes, already validated):
``{"type": "const", "val": x}``, ``{"type": "int"|"double", "minval", "maxval", "count"?}``,
``{"type": "log", "minval", "maxval", "base", "count"?}``, ``{"type": "categorical", "vals": [...]}``.
A value that is not a dict is a const; a dict without ``"type"`` is a nested group of hparams.

Names are always visited in sorted order: a config that went through a JSONB column comes back
with its keys reordered, and the same seed must still give the same trials.
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
import uuid
from collections.abc import Mapping
from typing import Any

from control_plane.core.searcher.operations import Create

Path = tuple[str, ...]


def _is_leaf(spec: Any) -> bool:
    return not isinstance(spec, Mapping) or "type" in spec


def _leaves(hparams_cfg: Mapping[str, Any], prefix: Path = ()) -> list[tuple[Path, Any]]:
    out: list[tuple[Path, Any]] = []
    for name in sorted(hparams_cfg):
        spec = hparams_cfg[name]
        path = (*prefix, name)
        if _is_leaf(spec):
            out.append((path, spec))
        else:
            out.extend(_leaves(spec, path))
    return out


def _skeleton(hparams_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Nested groups as empty dicts, so an empty group still appears in a trial's hparams."""
    return {name: _skeleton(spec) for name, spec in hparams_cfg.items() if not _is_leaf(spec)}


def _set_path(target: dict[str, Any], path: Path, value: Any) -> None:
    for name in path[:-1]:
        target = target.setdefault(name, {})
    target[path[-1]] = value


def _dotted(path: Path) -> str:
    return "hyperparameters." + ".".join(path)


def sample_value(spec: Any, rng: random.Random) -> Any:
    if not isinstance(spec, Mapping):
        return copy.deepcopy(spec)
    kind = spec["type"]
    if kind == "const":
        return copy.deepcopy(spec["val"])
    if kind == "int":
        return rng.randint(int(spec["minval"]), int(spec["maxval"]))
    if kind == "double":
        return rng.uniform(float(spec["minval"]), float(spec["maxval"]))
    if kind == "log":
        base = float(spec["base"])
        return base ** rng.uniform(float(spec["minval"]), float(spec["maxval"]))
    if kind == "categorical":
        vals = spec["vals"]
        return copy.deepcopy(vals[rng.randrange(len(vals))])
    raise ValueError(f"unknown hyperparameter type {kind!r}")


class HParamSpace:
    """A hyperparameter config walked once, so that sampling a trial does not re-walk it."""

    def __init__(self, hparams_cfg: Mapping[str, Any]) -> None:
        self._hparams_cfg = hparams_cfg
        self._leaves = _leaves(hparams_cfg)
        self._flat = all(len(path) == 1 for path, _ in self._leaves) and not _skeleton(hparams_cfg)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        if self._flat:
            return {path[0]: sample_value(spec, rng) for path, spec in self._leaves}
        out = _skeleton(self._hparams_cfg)
        for path, spec in self._leaves:
            _set_path(out, path, sample_value(spec, rng))
        return out


def sample_hparams(hparams_cfg: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    return HParamSpace(hparams_cfg).sample(rng)


def _round_half_away(x: float) -> int:
    # Go's math.Round, which Determined's grid uses; Python's round() is banker's rounding.
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _count(spec: Mapping[str, Any], path: Path) -> int:
    count = spec.get("count")
    if count is None:
        raise ValueError(f"{_dotted(path)}: grid search needs 'count' for a {spec['type']} hyperparameter")
    if int(count) < 1:
        raise ValueError(f"{_dotted(path)}: 'count' must be at least 1")
    return int(count)


def grid_values(spec: Any, path: Path = ("?",)) -> list[Any]:
    """The values one hyperparameter takes on the grid (Determined's grid.go)."""
    if not isinstance(spec, Mapping):
        return [copy.deepcopy(spec)]
    kind = spec["type"]
    if kind == "const":
        return [copy.deepcopy(spec["val"])]
    if kind == "categorical":
        return [copy.deepcopy(v) for v in spec["vals"]]
    count = _count(spec, path)
    lo, hi = spec["minval"], spec["maxval"]
    if kind == "int":
        lo, hi = int(lo), int(hi)
        # More points than integers in the range would only repeat values.
        count = min(count, hi - lo + 1)
        if count == 1:
            return [_round_half_away((lo + hi) / 2.0)]
        vals = [_round_half_away(lo + i * (hi - lo) / (count - 1)) for i in range(count)]
        return list(dict.fromkeys(vals))
    if kind in ("double", "log"):
        lo, hi = float(lo), float(hi)
        points = [(lo + hi) / 2.0] if count == 1 else [lo + i * (hi - lo) / (count - 1) for i in range(count)]
        if kind == "double":
            return points
        base = float(spec["base"])
        return [base**p for p in points]
    raise ValueError(f"{_dotted(path)}: unknown hyperparameter type {kind!r}")


def axis_length(spec: Any, path: Path = ("?",)) -> int:
    """``len(grid_values(spec))`` without building the list (a count can be huge)."""
    if not isinstance(spec, Mapping):
        return 1
    kind = spec["type"]
    if kind == "const":
        return 1
    if kind == "categorical":
        return len(spec["vals"])
    count = _count(spec, path)
    if kind == "int":
        # grid_values' clamp: its points are then at least one apart, so none collapse.
        return min(count, int(spec["maxval"]) - int(spec["minval"]) + 1)
    if kind in ("double", "log"):
        return count
    raise ValueError(f"{_dotted(path)}: unknown hyperparameter type {kind!r}")


class Grid:
    """The cartesian product of every hyperparameter's grid values, indexed without materializing it.

    Point order matches ``itertools.product`` over the sorted leaf names (first name slowest).
    """

    def __init__(self, hparams_cfg: Mapping[str, Any]) -> None:
        self._hparams_cfg = hparams_cfg
        self.size = grid_size(hparams_cfg)
        self._axes = [(path, grid_values(spec, path)) for path, spec in _leaves(hparams_cfg)]

    def point(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(f"grid point {index} out of range (size {self.size})")
        out = _skeleton(self._hparams_cfg)
        for path, vals in reversed(self._axes):
            index, digit = divmod(index, len(vals))
            _set_path(out, path, copy.deepcopy(vals[digit]))
        return out


def grid_size(hparams_cfg: Mapping[str, Any]) -> int:
    """Number of trials a grid search over ``hparams_cfg`` creates: the one place that counts it
    (config validation asks this too).

    Raises ``ValueError`` (message starts with the field path) when a numeric hyperparameter has no
    ``count``, so config validation can report it like any other bad field.
    """
    return math.prod(axis_length(spec, path) for path, spec in _leaves(hparams_cfg))


class TrialFactory:
    """Seeded source of ``Create`` operations.

    The n-th trial's request id, seed and sampled hparams come from an RNG seeded by
    ``(experiment_seed, n)``, so the only state to persist is ``creates``: a restored search makes
    exactly the trials the uninterrupted one would have made.
    """

    def __init__(self, hparams_cfg: Mapping[str, Any], experiment_seed: int, creates: int = 0) -> None:
        self._space = HParamSpace(hparams_cfg)
        self._experiment_seed = int(experiment_seed)
        self.creates = creates

    def _rng(self, n: int) -> random.Random:
        digest = hashlib.sha256(f"shipyard-searcher/{self._experiment_seed}/{n}".encode()).digest()
        return random.Random(int.from_bytes(digest[:16], "big"))

    def create(self, hparams: dict[str, Any] | None = None) -> Create:
        rng = self._rng(self.creates)
        self.creates += 1
        request_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        # 31 bits: fits the signed 32-bit seed column and every framework's seed argument.
        trial_seed = rng.getrandbits(31)
        if hparams is None:
            hparams = self._space.sample(rng)
        return Create(request_id=request_id, hparams=hparams, trial_seed=trial_seed)
