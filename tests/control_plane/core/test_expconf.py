"""Tests for the experiment-config schema: defaults, every searcher and hyperparameter type, every
refusal (with its path and reason), master defaults, warnings and round-trips."""

import copy
import json
import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.core.expconf import (
    AdaptiveASHASearcher,
    CategoricalHyperparameter,
    ConfigInvalid,
    ConstHyperparameter,
    DoubleHyperparameter,
    ExperimentConfig,
    FieldError,
    GCSStorage,
    GridSearcher,
    IntHyperparameter,
    LogHyperparameter,
    RandomSearcher,
    S3Storage,
    SharedFSStorage,
    SingleSearcher,
    config_to_dict,
    flatten_hyperparameters,
    grid_axis,
    grid_size,
    merge_defaults,
    parse_experiment_config,
)

STORAGE = {"type": "shared_fs", "host_path": "/mnt/checkpoints"}
MINIMAL = {"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss"}}


def parse(doc: dict[str, Any] | str | bytes, **kwargs: Any) -> tuple[ExperimentConfig, list[str]]:
    kwargs.setdefault("default_checkpoint_storage", STORAGE)
    kwargs.setdefault("experiment_seed", 42)
    text = doc if isinstance(doc, (str, bytes)) else yaml.safe_dump(doc, sort_keys=False)
    return parse_experiment_config(text, **kwargs)


def errors(doc: dict[str, Any] | str | bytes, **kwargs: Any) -> list[FieldError]:
    with pytest.raises(ConfigInvalid) as info:
        parse(doc, **kwargs)
    assert info.value.errors, "ConfigInvalid must carry at least one error"
    return info.value.errors


def only_error(doc: dict[str, Any] | str | bytes, **kwargs: Any) -> FieldError:
    errs = errors(doc, **kwargs)
    assert len(errs) == 1, errs
    return errs[0]


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def searcher(**fields: Any) -> dict[str, Any]:
    return with_(MINIMAL, searcher=fields)


# ----------------------------------------------------------------------------------------------
# Defaults
# ----------------------------------------------------------------------------------------------

EXPECTED_MINIMAL = {
    "name": None,
    "description": None,
    "labels": [],
    "workspace": None,
    "project": None,
    "data": {},
    "entrypoint": "python3 train.py",
    "hyperparameters": {},
    "searcher": {
        "name": "single",
        "metric": "loss",
        "smaller_is_better": True,
        "source_trial_id": None,
        "source_checkpoint_uuid": None,
        "max_length": None,
    },
    "resources": {
        "slots_per_trial": 1,
        "max_slots": None,
        "weight": 1.0,
        "priority": None,
        "resource_pool": "default",
        "shm_size": None,
        "memory": None,
        "is_single_node": False,
        "preemptible": True,
        "devices": [],
        "agent_label": "",
        "native_parallel": False,
    },
    "max_restarts": 5,
    "min_validation_period": {"batches": 0},
    "min_checkpoint_period": {"batches": 0},
    "perform_initial_validation": False,
    "checkpoint_policy": "best",
    "checkpoint_storage": {
        "type": "shared_fs",
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 1,
        "host_path": "/mnt/checkpoints",
        "storage_path": None,
        "propagation": "rprivate",
    },
    "environment": {
        "image": {"cpu": None, "cuda": None, "rocm": None},
        "environment_variables": {"cpu": [], "cuda": [], "rocm": []},
        "force_pull_image": False,
        "registry_auth": None,
        "pod_spec": None,
        "add_capabilities": [],
        "drop_capabilities": [],
        "ports": {},
        "proxy_ports": [],
    },
    "bind_mounts": [],
    "records_per_epoch": 0,
    "scheduling_unit": 100,
    "reproducibility": {"experiment_seed": 42},
    "profiling": {"enabled": False, "begin_on_batch": 0, "end_after_batch": None, "sync_timings": True},
    "optimizations": {},
    "log_policies": [],
    "debug": False,
}


def test_minimal_config_comes_back_fully_defaulted() -> None:
    cfg, warnings = parse(MINIMAL)
    assert config_to_dict(cfg) == EXPECTED_MINIMAL
    assert warnings == []


def test_defaulted_dict_is_json_safe_and_keys_are_in_stable_order() -> None:
    cfg, _ = parse(MINIMAL)
    stored = config_to_dict(cfg)
    assert json.loads(json.dumps(stored, allow_nan=False)) == stored
    assert list(stored["searcher"])[0] == "name"
    assert list(stored["checkpoint_storage"])[0] == "type"


def test_typed_access() -> None:
    cfg, _ = parse(MINIMAL)
    assert isinstance(cfg.searcher, SingleSearcher)
    assert cfg.searcher.name == "single"
    assert cfg.searcher.metric == "loss"
    assert cfg.resources.slots_per_trial == 1
    assert cfg.resources.resource_pool == "default"
    assert isinstance(cfg.checkpoint_storage, SharedFSStorage)
    assert cfg.reproducibility.experiment_seed == 42
    assert cfg.min_validation_period.unit == "batches"
    assert cfg.min_validation_period.value == 0


def test_config_is_frozen() -> None:
    cfg, _ = parse(MINIMAL)
    with pytest.raises(ValueError):
        cfg.resources.slots_per_trial = 4  # type: ignore[misc]


def test_explicit_null_means_default_like_determined() -> None:
    doc = with_(
        MINIMAL,
        description=None,
        labels=None,
        resources={"slots_per_trial": None, "max_slots": None, "resource_pool": None},
        environment=None,
        reproducibility={"experiment_seed": None},
        hyperparameters={"dropout": None},
    )
    cfg, _ = parse(doc)
    assert cfg.labels == []
    assert cfg.resources.slots_per_trial == 1
    assert cfg.resources.resource_pool == "default"
    assert cfg.reproducibility.experiment_seed == 42
    # A null hyperparameter is a constant None, not "unset".
    assert cfg.hyperparameters["dropout"] == ConstHyperparameter(type="const", val=None)


# ----------------------------------------------------------------------------------------------
# Searchers
# ----------------------------------------------------------------------------------------------


def test_single_searcher_with_max_length() -> None:
    cfg, _ = parse(searcher(name="single", metric="acc", smaller_is_better=False, max_length={"epochs": 3}))
    assert isinstance(cfg.searcher, SingleSearcher)
    assert cfg.searcher.smaller_is_better is False
    assert cfg.searcher.max_length is not None
    assert (cfg.searcher.max_length.unit, cfg.searcher.max_length.value) == ("epochs", 3)
    assert cfg.searcher.training_length() == ("epochs", 3)


def test_random_searcher_defaults() -> None:
    cfg, _ = parse(searcher(name="random", metric="loss", max_trials=8, max_length={"batches": 1000}))
    assert isinstance(cfg.searcher, RandomSearcher)
    assert cfg.searcher.max_trials == 8
    assert cfg.searcher.max_concurrent_trials == 16  # Determined's default
    assert cfg.searcher.training_length() == ("batches", 1000)


def test_random_searcher_requires_max_trials() -> None:
    err = only_error(searcher(name="random", metric="loss"))
    assert err == FieldError("searcher.max_trials", "required field is missing")


def test_random_max_concurrent_zero_means_unlimited_and_is_allowed() -> None:
    cfg, _ = parse(searcher(name="random", metric="loss", max_trials=3, max_concurrent_trials=0))
    assert cfg.searcher.max_concurrent_trials == 0


def test_grid_searcher_defaults() -> None:
    doc = searcher(name="grid", metric="loss", max_length={"records": 5000})
    doc["hyperparameters"] = {"lr": {"type": "double", "minval": 0.1, "maxval": 0.3, "count": 3}}
    cfg, _ = parse(doc)
    assert isinstance(cfg.searcher, GridSearcher)
    assert cfg.searcher.max_concurrent_trials == 16


def test_adaptive_asha_defaults() -> None:
    cfg, _ = parse(searcher(name="adaptive_asha", metric="loss", max_trials=64, max_length={"batches": 1000}))
    s = cfg.searcher
    assert isinstance(s, AdaptiveASHASearcher)
    assert (s.mode, s.divisor, s.max_rungs, s.max_concurrent_trials, s.stop_once) == (
        "standard",
        4.0,
        5,
        16,
        False,
    )
    assert s.bracket_rungs == []
    assert s.training_length() == ("batches", 1000)


def test_adaptive_asha_with_max_time_and_time_metric() -> None:
    doc = searcher(
        name="adaptive_asha",
        metric="loss",
        max_trials=16,
        max_time=1024,
        time_metric="batches",
        mode="aggressive",
        divisor=2,
        max_rungs=4,
        stop_once=True,
    )
    cfg, _ = parse(doc)
    s = cfg.searcher
    assert isinstance(s, AdaptiveASHASearcher)
    assert (s.max_time, s.time_metric, s.mode, s.divisor, s.max_rungs, s.stop_once) == (
        1024,
        "batches",
        "aggressive",
        2.0,
        4,
        True,
    )
    assert s.training_length() == ("batches", 1024)


@pytest.mark.parametrize(
    ("fields", "path", "reason"),
    [
        (
            {"name": "nope", "metric": "x"},
            "searcher.name",
            "unknown searcher 'nope'; expected one of single, random, grid, adaptive_asha",
        ),
        ({"name": "pbt", "metric": "x"}, "searcher.name", "unknown searcher 'pbt'"),
        ({"metric": "x"}, "searcher.name", "required field is missing"),
        ({"name": "single"}, "searcher.metric", "required field is missing"),
        ({"name": "single", "metric": ""}, "searcher.metric", "must not be empty"),
        ({"name": "single", "metric": 3}, "searcher.metric", "must be a string (got integer)"),
        (
            {"name": "single", "metric": "x", "smaller_is_better": "maybe"},
            "searcher.smaller_is_better",
            "must be a boolean (true or false) (got string)",
        ),
        ({"name": "single", "metric": "x", "max_trials": 2}, "searcher.max_trials", "unknown field"),
        ({"name": "random", "metric": "x", "max_trials": 0}, "searcher.max_trials", "must be >= 1 (got 0)"),
        (
            {"name": "random", "metric": "x", "max_trials": 2, "max_concurrent_trials": -1},
            "searcher.max_concurrent_trials",
            "must be >= 0 (got -1)",
        ),
        (
            {
                "name": "adaptive_asha",
                "metric": "x",
                "max_trials": 4,
                "max_length": {"batches": 4096},
                "mode": "wild",
            },
            "searcher.mode",
            "must be one of 'aggressive', 'standard' or 'conservative' (got 'wild')",
        ),
        (
            {
                "name": "adaptive_asha",
                "metric": "x",
                "max_trials": 4,
                "max_length": {"batches": 4096},
                "divisor": 1,
            },
            "searcher.divisor",
            "must be > 1 (got 1)",
        ),
        (
            {
                "name": "adaptive_asha",
                "metric": "x",
                "max_trials": 4,
                "max_length": {"batches": 4096},
                "max_rungs": 0,
            },
            "searcher.max_rungs",
            "must be >= 1 (got 0)",
        ),
        (
            {"name": "single", "metric": "x", "source_trial_id": 3, "source_checkpoint_uuid": "abc"},
            "searcher.source_checkpoint_uuid",
            "set at most one of source_trial_id and source_checkpoint_uuid",
        ),
    ],
)
def test_searcher_errors(fields: dict[str, Any], path: str, reason: str) -> None:
    err = only_error(searcher(**fields))
    assert err.path == path
    assert err.reason.startswith(reason), err.reason


def test_searcher_must_be_a_mapping() -> None:
    assert only_error(with_(MINIMAL, searcher="grid")) == FieldError(
        "searcher", "must be a mapping (got string)"
    )


def test_searcher_is_required() -> None:
    doc = dict(MINIMAL)
    del doc["searcher"]
    assert only_error(doc) == FieldError("searcher", "required field is missing")


def test_unknown_searcher_field_suggests_the_right_name() -> None:
    err = only_error(searcher(name="single", metric="x", max_lenght={"batches": 5}))
    assert err == FieldError("searcher.max_lenght", "unknown field (did you mean 'max_length'?)")


# ----------------------------------------------------------------------------------------------
# Lengths
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "reason"),
    [
        ({}, "must have exactly one of batches, records, epochs (got none)"),
        (
            {"batches": 10, "epochs": 1},
            "must have exactly one of batches, records, epochs (got batches and epochs)",
        ),
        ({"batches": 0}, "batches must be >= 1 (got 0)"),
        ({"records": -5}, "records must be >= 1 (got -5)"),
        ({"epochs": 1.5}, "epochs must be an integer (got number)"),
        ({"epochs": True}, "epochs must be an integer (got boolean)"),
        ({"steps": 10}, "unknown unit 'steps'; use exactly one of batches, records, epochs"),
        (100, "must be a mapping with exactly one of batches, records, epochs (got integer)"),
    ],
)
def test_max_length_errors(length: Any, reason: str) -> None:
    err = only_error(searcher(name="single", metric="loss", max_length=length))
    assert err == FieldError("searcher.max_length", reason)


def test_min_periods_allow_zero_but_not_negative() -> None:
    cfg, _ = parse(
        with_(MINIMAL, min_validation_period={"epochs": 0}, min_checkpoint_period={"records": 640})
    )
    assert (cfg.min_validation_period.unit, cfg.min_validation_period.value) == ("epochs", 0)
    assert config_to_dict(cfg)["min_checkpoint_period"] == {"records": 640}
    err = only_error(with_(MINIMAL, min_checkpoint_period={"batches": -1}))
    assert err == FieldError("min_checkpoint_period", "batches must be >= 0 (got -1)")


# ----------------------------------------------------------------------------------------------
# Hyperparameters
# ----------------------------------------------------------------------------------------------

DETERMINED_DOC_HPARAMS = {
    "global_batch_size": 64,
    "optimizer_config": {
        "optimizer": {"type": "categorical", "vals": ["SGD", "Adam", "RMSprop"]},
        "learning_rate": {"type": "log", "minval": -5.0, "maxval": 1.0, "base": 10.0},
    },
    "num_layers": {"type": "int", "minval": 1, "maxval": 3},
    "layer1_dropout": {"type": "double", "minval": 0.2, "maxval": 0.5},
}


def test_every_hyperparameter_type_and_nesting() -> None:
    doc = with_(MINIMAL, hyperparameters=DETERMINED_DOC_HPARAMS)
    doc["hyperparameters"]["layers"] = [64, 32]
    doc["hyperparameters"]["explicit"] = {"type": "const", "val": {"a": 1}}
    cfg, _ = parse(doc)
    hps = cfg.hyperparameters
    assert hps["global_batch_size"] == ConstHyperparameter(type="const", val=64)
    assert hps["layers"] == ConstHyperparameter(type="const", val=[64, 32])
    assert hps["explicit"] == ConstHyperparameter(type="const", val={"a": 1})
    assert hps["num_layers"] == IntHyperparameter(type="int", minval=1, maxval=3)
    assert hps["layer1_dropout"] == DoubleHyperparameter(type="double", minval=0.2, maxval=0.5)
    nested = hps["optimizer_config"]
    assert isinstance(nested, dict)
    assert nested["optimizer"] == CategoricalHyperparameter(
        type="categorical", vals=["SGD", "Adam", "RMSprop"]
    )
    assert nested["learning_rate"] == LogHyperparameter(type="log", minval=-5.0, maxval=1.0, base=10.0)
    flat = flatten_hyperparameters(hps)
    assert list(flat) == [
        ("global_batch_size",),
        ("optimizer_config", "optimizer"),
        ("optimizer_config", "learning_rate"),
        ("num_layers",),
        ("layer1_dropout",),
        ("layers",),
        ("explicit",),
    ]


def test_hyperparameters_are_stored_in_explicit_form() -> None:
    cfg, _ = parse(with_(MINIMAL, hyperparameters={"bs": 32, "group": {"lr": 0.1}}))
    stored = config_to_dict(cfg)["hyperparameters"]
    assert stored == {"bs": {"type": "const", "val": 32}, "group": {"lr": {"type": "const", "val": 0.1}}}


def test_deep_nesting_is_allowed_like_determined() -> None:
    cfg, _ = parse(
        with_(MINIMAL, hyperparameters={"a": {"b": {"c": {"type": "int", "minval": 1, "maxval": 2}}}})
    )
    assert list(flatten_hyperparameters(cfg.hyperparameters)) == [("a", "b", "c")]


@pytest.mark.parametrize(
    ("hp", "path", "reason"),
    [
        (
            {"type": "int", "minval": 5, "maxval": 1},
            "hyperparameters.x.minval",
            "minval (5) must be less than maxval (1)",
        ),
        (
            {"type": "int", "minval": 3, "maxval": 3},
            "hyperparameters.x.minval",
            "minval (3) must be less than maxval (3)",
        ),
        (
            {"type": "double", "minval": 0.5, "maxval": 0.1},
            "hyperparameters.x.minval",
            "minval (0.5) must be less than maxval (0.1)",
        ),
        (
            {"type": "log", "minval": 2, "maxval": -2, "base": 10},
            "hyperparameters.x.minval",
            "minval (2.0) must be less than maxval (-2.0)",
        ),
        ({"type": "categorical", "vals": []}, "hyperparameters.x.vals", "must not be empty"),
        ({"type": "categorical"}, "hyperparameters.x.vals", "required field is missing"),
        (
            {"type": "int", "minval": 1, "maxval": 9, "count": 0},
            "hyperparameters.x.count",
            "must be >= 1 (got 0)",
        ),
        (
            {"type": "int", "minval": 1.5, "maxval": 9},
            "hyperparameters.x.minval",
            "must be an integer (got number)",
        ),
        (
            {"type": "double", "minval": "a", "maxval": 9},
            "hyperparameters.x.minval",
            "must be a number (got string)",
        ),
        ({"type": "log", "minval": 1, "maxval": 2}, "hyperparameters.x.base", "required field is missing"),
        (
            {"type": "log", "minval": 1, "maxval": 2, "base": 0},
            "hyperparameters.x.base",
            "must be > 0 (got 0)",
        ),
        ({"type": "double", "minval": 0, "maxval": 1, "step": 2}, "hyperparameters.x.step", "unknown field"),
        (
            {"type": "bogus"},
            "hyperparameters.x.type",
            "unknown hyperparameter type 'bogus'; expected one of const, int, double, log, categorical",
        ),
        ({"type": "const"}, "hyperparameters.x.val", "required field is missing"),
    ],
)
def test_hyperparameter_errors(hp: dict[str, Any], path: str, reason: str) -> None:
    err = only_error(with_(MINIMAL, hyperparameters={"x": hp}))
    assert err == FieldError(path, reason)


def test_nested_hyperparameter_error_path() -> None:
    doc = with_(MINIMAL, hyperparameters={"opt": {"lr": {"type": "double", "minval": 1, "maxval": 0}}})
    assert only_error(doc) == FieldError(
        "hyperparameters.opt.lr.minval", "minval (1.0) must be less than maxval (0.0)"
    )


def test_range_errors_are_reported_next_to_other_broken_hyperparameters() -> None:
    doc = with_(
        MINIMAL,
        hyperparameters={
            "lr": {"type": "double", "minval": 1, "maxval": 0.1},
            "opt": {"type": "categorical", "vals": []},
            "group": {"a": {"type": "int", "minval": 9, "maxval": 1}, "b": {"type": "nope"}},
        },
    )
    paths = {e.path for e in errors(doc)}
    assert paths == {
        "hyperparameters.lr.minval",
        "hyperparameters.opt.vals",
        "hyperparameters.group.a.minval",
        "hyperparameters.group.b.type",
    }


def test_hyperparameters_must_be_a_mapping() -> None:
    assert only_error(with_(MINIMAL, hyperparameters=[1, 2])) == FieldError(
        "hyperparameters", "must be a mapping (got list)"
    )


def test_log_base_one_is_a_warning() -> None:
    _, warnings = parse(
        with_(MINIMAL, hyperparameters={"x": {"type": "log", "minval": 0, "maxval": 1, "base": 1}})
    )
    assert any(w.startswith("hyperparameters.x.base:") for w in warnings)


# ----------------------------------------------------------------------------------------------
# Grid search
# ----------------------------------------------------------------------------------------------


def test_grid_axis_matches_determined() -> None:
    assert grid_axis(IntHyperparameter(type="int", minval=1, maxval=10, count=4)) == [1, 4, 7, 10]
    # count is clamped to the number of integers in the range, so points stay distinct
    assert grid_axis(IntHyperparameter(type="int", minval=1, maxval=3, count=10)) == [1, 2, 3]
    assert grid_axis(IntHyperparameter(type="int", minval=1, maxval=4, count=1)) == [3]  # Go rounds half away
    assert grid_axis(IntHyperparameter(type="int", minval=-4, maxval=-1, count=1)) == [-3]
    assert grid_axis(DoubleHyperparameter(type="double", minval=0, maxval=1, count=3)) == [0.0, 0.5, 1.0]
    assert grid_axis(DoubleHyperparameter(type="double", minval=0, maxval=1, count=1)) == [0.5]
    log = grid_axis(LogHyperparameter(type="log", minval=-3, maxval=-1, base=10, count=3))
    assert [round(v, 12) for v in log] == [0.001, 0.01, 0.1]
    assert grid_axis(CategoricalHyperparameter(type="categorical", vals=["a", "b"])) == ["a", "b"]
    assert grid_axis(ConstHyperparameter(type="const", val=7)) == [7]
    with pytest.raises(ValueError):
        grid_axis(DoubleHyperparameter(type="double", minval=0, maxval=1))


def test_grid_size_multiplies_axes_including_nested() -> None:
    cfg, _ = parse(
        with_(
            searcher(name="grid", metric="loss"),
            hyperparameters={
                "a": {"type": "int", "minval": 1, "maxval": 3, "count": 10},  # clamped to 3
                "b": {"type": "categorical", "vals": [1, 2]},
                "c": 5,
                "g": {"d": {"type": "log", "minval": 0, "maxval": 1, "base": 2, "count": 4}},
            },
        )
    )
    assert grid_size(cfg.hyperparameters) == 3 * 2 * 1 * 4
    assert grid_size({}) == 1


def test_grid_requires_count_for_numeric_hyperparameters() -> None:
    doc = with_(
        searcher(name="grid", metric="loss"),
        hyperparameters={
            "a": {"type": "int", "minval": 1, "maxval": 3},
            "g": {"b": {"type": "double", "minval": 0, "maxval": 1}},
            "c": {"type": "categorical", "vals": [1]},
        },
    )
    reason = "grid search requires count for int, double and log hyperparameters"
    assert errors(doc) == [
        FieldError("hyperparameters.a.count", reason),
        FieldError("hyperparameters.g.b.count", reason),
    ]


def test_count_is_optional_for_random_search() -> None:
    doc = with_(
        searcher(name="random", metric="loss", max_trials=2),
        hyperparameters={"a": {"type": "int", "minval": 1, "maxval": 3}},
    )
    parse(doc)


def _grid(n_a: int, n_b: int, **kw: Any) -> dict[str, Any]:
    return with_(
        searcher(name="grid", metric="loss", **kw),
        hyperparameters={
            "a": {"type": "int", "minval": 0, "maxval": 10_000, "count": n_a},
            "b": {"type": "double", "minval": 0, "maxval": 1, "count": n_b},
        },
    )


def test_grid_at_the_limit_is_accepted() -> None:
    parse(_grid(100, 100), max_grid_trials=10_000)


def test_grid_over_the_limit_is_refused_with_its_size() -> None:
    err = only_error(_grid(100, 101), max_grid_trials=10_000)
    assert err == FieldError(
        "hyperparameters",
        "grid search would create 10100 trials (a: 100 x b: 101), more than the limit of 10000",
    )


def test_grid_limit_is_the_callers() -> None:
    err = only_error(_grid(3, 3), max_grid_trials=8)
    assert err.path == "hyperparameters"
    assert "9 trials" in err.reason


def test_huge_grid_is_refused_without_enumerating_it() -> None:
    err = only_error(_grid(2_000_000_000, 2_000_000_000))
    assert err.path == "hyperparameters"
    assert "10001" in err.reason  # int axis clamped to the 10001 integers in [0, 10000]


def test_grid_warns_when_concurrency_exceeds_grid() -> None:
    _, warnings = parse(_grid(2, 2, max_concurrent_trials=10))
    assert warnings == [
        "searcher.max_concurrent_trials: 10 is more than the 4 grid points; at most 4 trials will run at once"
    ]


# ----------------------------------------------------------------------------------------------
# Adaptive ASHA
# ----------------------------------------------------------------------------------------------


def asha(**kw: Any) -> dict[str, Any]:
    fields = {"name": "adaptive_asha", "metric": "loss", "max_trials": 16}
    fields.update(kw)
    return searcher(**fields)


def test_asha_smallest_rung_of_exactly_one_unit_is_accepted() -> None:
    parse(asha(max_length={"batches": 256}))  # 256 / 4**4 == 1
    parse(asha(max_length={"batches": 8}, divisor=2, max_rungs=4))  # 8 / 2**3 == 1


def test_asha_smallest_rung_under_one_unit_is_refused_and_says_why() -> None:
    err = only_error(asha(max_length={"batches": 255}))
    assert err.path == "searcher.max_length"
    assert err.reason == (
        "the smallest rung would be 0.996 batches (255 / divisor 4 ** (max_rungs 5 - 1)), less than one unit: "
        "raise it to at least 256 batches, or set max_rungs to 4 or less"
    )


def test_asha_rung_check_uses_the_configured_unit_and_divisor() -> None:
    err = only_error(asha(max_length={"epochs": 10}, divisor=3))
    assert err.path == "searcher.max_length"
    assert "epochs" in err.reason
    assert "at least 81 epochs" in err.reason
    assert "max_rungs to 3 or less" in err.reason
    # and the advice works
    parse(asha(max_length={"epochs": 10}, divisor=3, max_rungs=3))


def test_short_asha_rungs_can_be_a_warning_instead() -> None:
    doc = with_(asha(max_length={"epochs": 1}, max_concurrent_trials=8), records_per_epoch=60_000)
    cfg, warnings = parse(doc, refuse_short_asha_rungs=False)
    assert cfg.searcher.training_length() == ("epochs", 1)
    assert warnings == [
        "searcher.max_length: the smallest rung would be 0.00391 epochs (1 / divisor 4 ** (max_rungs 5 - 1)), "
        "less than one unit; like Determined, at most 1 rung will be used"
    ]


def test_asha_rung_check_applies_to_max_time() -> None:
    err = only_error(asha(max_time=100, time_metric="batches"))
    assert err.path == "searcher.max_time"
    assert "0.391 batches" in err.reason


@pytest.mark.parametrize(
    ("fields", "path", "reason"),
    [
        ({}, "searcher.max_length", "adaptive_asha requires max_length (or max_time with time_metric)"),
        ({"max_time": 1000}, "searcher.time_metric", "required when max_time is set"),
        ({"time_metric": "batches"}, "searcher.max_time", "required when time_metric is set"),
        (
            {"max_time": 1000, "time_metric": "batches", "max_length": {"batches": 1000}},
            "searcher.max_time",
            "set either max_length or max_time with time_metric, not both",
        ),
        ({"max_time": 0, "time_metric": "batches"}, "searcher.max_time", "must be >= 1 (got 0)"),
    ],
)
def test_asha_length_rules(fields: dict[str, Any], path: str, reason: str) -> None:
    assert only_error(asha(**fields)) == FieldError(path, reason)


def test_asha_requires_max_trials() -> None:
    doc = searcher(name="adaptive_asha", metric="loss", max_length={"batches": 1000})
    assert only_error(doc) == FieldError("searcher.max_trials", "required field is missing")


def test_max_concurrent_above_max_trials_is_a_warning() -> None:
    _, warnings = parse(asha(max_length={"batches": 1000}, max_trials=4, max_concurrent_trials=8))
    assert warnings == [
        "searcher.max_concurrent_trials: 8 is more than max_trials (4); at most 4 trials will run at once"
    ]


def test_default_concurrency_above_small_max_trials_warns_too() -> None:
    _, warnings = parse(searcher(name="random", metric="loss", max_trials=2))
    assert len(warnings) == 1 and warnings[0].startswith("searcher.max_concurrent_trials: 16")


# ----------------------------------------------------------------------------------------------
# Resources
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "path", "reason"),
    [
        ({"slots_per_trial": 0}, "resources.slots_per_trial", "must be >= 1 (got 0)"),
        ({"slots_per_trial": -2}, "resources.slots_per_trial", "must be >= 1 (got -2)"),
        ({"slots_per_trial": "2"}, "resources.slots_per_trial", "must be an integer (got string)"),
        ({"slots_per_trial": 2.0}, "resources.slots_per_trial", "must be an integer (got number)"),
        ({"slots_per_trial": True}, "resources.slots_per_trial", "must be an integer (got boolean)"),
        ({"priority": 0}, "resources.priority", "must be >= 1 (got 0)"),
        ({"priority": 100}, "resources.priority", "must be <= 99 (got 100)"),
        ({"weight": 0}, "resources.weight", "must be > 0 (got 0)"),
        ({"max_slots": 0}, "resources.max_slots", "must be >= 1 (got 0)"),
        (
            {"slots_per_trial": 4, "max_slots": 2},
            "resources.max_slots",
            "max_slots (2) is less than slots_per_trial (4); no trial could ever be scheduled",
        ),
        ({"resource_pool": 7}, "resources.resource_pool", "must be a string (got integer)"),
        ({"gpus": 1}, "resources.gpus", "unknown field"),
    ],
)
def test_resource_errors(resources: dict[str, Any], path: str, reason: str) -> None:
    assert only_error(with_(MINIMAL, resources=resources)) == FieldError(path, reason)


def test_resources_must_be_a_mapping() -> None:
    assert only_error(with_(MINIMAL, resources=4)) == FieldError(
        "resources", "must be a mapping (got integer)"
    )


def test_resource_pool_defaults_to_the_masters_default_pool() -> None:
    cfg, _ = parse(MINIMAL, default_resource_pool="gpu-a100")
    assert cfg.resources.resource_pool == "gpu-a100"
    cfg, _ = parse(with_(MINIMAL, resources={"resource_pool": ""}), default_resource_pool="gpu-a100")
    assert cfg.resources.resource_pool == "gpu-a100"
    cfg, _ = parse(with_(MINIMAL, resources={"resource_pool": "cpu"}), default_resource_pool="gpu-a100")
    assert cfg.resources.resource_pool == "cpu"


def test_resources_accepted_fields() -> None:
    doc = with_(
        MINIMAL,
        resources={"slots_per_trial": 8, "max_slots": 16, "weight": 2.5, "priority": 10, "shm_size": "4G"},
    )
    cfg, _ = parse(doc)
    r = cfg.resources
    assert (r.slots_per_trial, r.max_slots, r.weight, r.priority, r.shm_size) == (8, 16, 2.5, 10, "4G")


# ----------------------------------------------------------------------------------------------
# Checkpoint storage and master defaults
# ----------------------------------------------------------------------------------------------


def test_missing_checkpoint_storage_without_master_default_is_an_error() -> None:
    err = only_error(MINIMAL, default_checkpoint_storage=None)
    assert err.path == "checkpoint_storage"
    assert err.reason.startswith("no checkpoint storage configured")


def test_experiment_storage_wins_over_master_default_of_another_type() -> None:
    doc = with_(MINIMAL, checkpoint_storage={"type": "s3", "bucket": "b", "prefix": "runs"})
    master = {"type": "shared_fs", "host_path": "/x", "save_trial_best": 3}
    cfg, _ = parse(doc, default_checkpoint_storage=master)
    storage = cfg.checkpoint_storage
    assert isinstance(storage, S3Storage)
    assert (storage.bucket, storage.prefix) == ("b", "runs")
    # GC policy fields merge across types, like Determined's union merge
    assert storage.save_trial_best == 3


def test_experiment_storage_of_same_type_fills_gaps_from_master() -> None:
    doc = with_(MINIMAL, checkpoint_storage={"type": "s3", "prefix": "mine"})
    master = {"type": "s3", "bucket": "team-bucket", "endpoint_url": "http://minio:9000", "prefix": "default"}
    cfg, _ = parse(doc, default_checkpoint_storage=master)
    assert config_to_dict(cfg)["checkpoint_storage"] == {
        "type": "s3",
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 1,
        "bucket": "team-bucket",
        "prefix": "mine",
        "access_key": None,
        "secret_key": None,
        "endpoint_url": "http://minio:9000",
    }


def test_gc_only_storage_section_uses_master_storage() -> None:
    doc = with_(MINIMAL, checkpoint_storage={"save_trial_best": 2, "save_experiment_best": 5})
    cfg, _ = parse(doc, default_checkpoint_storage={"type": "gcs", "bucket": "ckpts"})
    storage = cfg.checkpoint_storage
    assert isinstance(storage, GCSStorage)
    assert (storage.bucket, storage.save_trial_best, storage.save_experiment_best) == ("ckpts", 2, 5)


def test_gc_only_storage_section_without_master_default_needs_a_type() -> None:
    err = only_error(
        with_(MINIMAL, checkpoint_storage={"save_trial_best": 2}), default_checkpoint_storage=None
    )
    assert err == FieldError("checkpoint_storage.type", "required field is missing")


@pytest.mark.parametrize(
    ("storage", "path", "reason"),
    [
        ({"type": "s3"}, "checkpoint_storage.bucket", "required field is missing"),
        ({"type": "gcs"}, "checkpoint_storage.bucket", "required field is missing"),
        ({"type": "shared_fs"}, "checkpoint_storage.host_path", "required field is missing"),
        (
            {"type": "shared_fs", "host_path": "relative/dir"},
            "checkpoint_storage.host_path",
            "must be an absolute path",
        ),
        (
            {"type": "shared_fs", "host_path": "/a", "storage_path": "/b/c"},
            "checkpoint_storage.storage_path",
            "must be a relative directory or a subdirectory of host_path",
        ),
        (
            {"type": "shared_fs", "host_path": "/a", "storage_path": "../up"},
            "checkpoint_storage.storage_path",
            "must not contain '..'",
        ),
        (
            {"type": "s3", "bucket": "b", "access_key": "AK"},
            "checkpoint_storage.secret_key",
            "access_key and secret_key must be set together",
        ),
        (
            {"type": "s3", "bucket": "b", "secret_key": "SK"},
            "checkpoint_storage.access_key",
            "access_key and secret_key must be set together",
        ),
        (
            {"type": "s3", "bucket": "b", "endpoint_url": "minio:9000"},
            "checkpoint_storage.endpoint_url",
            "must be an http:// or https:// URL",
        ),
        (
            {"type": "gcs", "bucket": "b", "prefix": "a/../../b"},
            "checkpoint_storage.prefix",
            "must not contain '..'",
        ),
        (
            {"type": "azure", "container": "c"},
            "checkpoint_storage.type",
            "unsupported checkpoint storage type 'azure'; expected one of shared_fs, s3, gcs",
        ),
        (
            {"type": "gcs", "bucket": "b", "save_trial_best": -1},
            "checkpoint_storage.save_trial_best",
            "must be >= 0 (got -1)",
        ),
        ({"type": "gcs", "bucket": "b", "access_key": "x"}, "checkpoint_storage.access_key", "unknown field"),
    ],
)
def test_checkpoint_storage_errors(storage: dict[str, Any], path: str, reason: str) -> None:
    assert only_error(
        with_(MINIMAL, checkpoint_storage=storage), default_checkpoint_storage=None
    ) == FieldError(path, reason)


def test_shared_fs_storage_path_inside_host_path_is_fine() -> None:
    for storage_path in ("/a/b", "/a", "sub/dir"):
        doc = with_(
            MINIMAL, checkpoint_storage={"type": "shared_fs", "host_path": "/a", "storage_path": storage_path}
        )
        cfg, _ = parse(doc)
        assert cfg.checkpoint_storage.storage_path == storage_path  # type: ignore[union-attr]


def test_s3_with_both_keys() -> None:
    doc = with_(
        MINIMAL, checkpoint_storage={"type": "s3", "bucket": "b", "access_key": "AK", "secret_key": "SK"}
    )
    cfg, _ = parse(doc)
    assert isinstance(cfg.checkpoint_storage, S3Storage)
    assert cfg.checkpoint_storage.secret_key == "SK"


def test_merge_defaults_is_pure() -> None:
    raw = {"entrypoint": "x", "resources": {"slots_per_trial": 2}}
    before = copy.deepcopy(raw)
    master = {"type": "gcs", "bucket": "b"}
    out = merge_defaults(raw, default_checkpoint_storage=master, default_resource_pool="p", experiment_seed=9)
    assert raw == before
    assert master == {"type": "gcs", "bucket": "b"}
    assert out["resources"] == {"slots_per_trial": 2, "resource_pool": "p"}
    assert out["reproducibility"] == {"experiment_seed": 9}
    assert out["checkpoint_storage"] == {"type": "gcs", "bucket": "b"}


# ----------------------------------------------------------------------------------------------
# Seed, entrypoint, environment and other fields
# ----------------------------------------------------------------------------------------------


def test_caller_seed_is_used_when_config_has_none() -> None:
    cfg, _ = parse(MINIMAL, experiment_seed=123456)
    assert cfg.reproducibility.experiment_seed == 123456


def test_config_seed_wins_over_callers() -> None:
    cfg, _ = parse(with_(MINIMAL, reproducibility={"experiment_seed": 7}), experiment_seed=999)
    assert cfg.reproducibility.experiment_seed == 7


def test_seed_range() -> None:
    err = only_error(with_(MINIMAL, reproducibility={"experiment_seed": 2**31}))
    assert err == FieldError("reproducibility.experiment_seed", "must be <= 2147483647 (got 2147483648)")
    assert (
        only_error(with_(MINIMAL, reproducibility={"experiment_seed": -1})).path
        == "reproducibility.experiment_seed"
    )


def test_without_any_seed_the_stored_seed_is_null() -> None:
    cfg, _ = parse(MINIMAL, experiment_seed=None)
    assert cfg.reproducibility.experiment_seed is None


@pytest.mark.parametrize(
    "entrypoint",
    ["model_def:Trial", "python3 -m determined.launch.torch_distributed train.py", ["python3", "train.py"]],
)
def test_entrypoint_forms(entrypoint: Any) -> None:
    cfg, _ = parse(with_(MINIMAL, entrypoint=entrypoint))
    assert cfg.entrypoint == entrypoint


@pytest.mark.parametrize("entrypoint", ["", "   ", [], [""], ["python", 3], 5, {"a": 1}])
def test_bad_entrypoint(entrypoint: Any) -> None:
    err = only_error(with_(MINIMAL, entrypoint=entrypoint))
    assert err.path == "entrypoint"
    assert err.reason.startswith("must be a non-empty string or a non-empty list of non-empty strings")


def test_entrypoint_is_required() -> None:
    doc = dict(MINIMAL)
    del doc["entrypoint"]
    assert only_error(doc) == FieldError("entrypoint", "required field is missing")


def test_environment_variables_as_list() -> None:
    cfg, _ = parse(with_(MINIMAL, environment={"environment_variables": ["A=1", "B=x=y", "EMPTY="]}))
    env = cfg.environment.environment_variables
    assert env.cpu == env.cuda == env.rocm == ["A=1", "B=x=y", "EMPTY="]
    assert env.as_dict("cuda") == {"A": "1", "B": "x=y", "EMPTY": ""}


def test_environment_variables_as_mapping() -> None:
    cfg, _ = parse(
        with_(MINIMAL, environment={"environment_variables": {"A": 1, "DEBUG": True, "NAME": "x"}})
    )
    assert cfg.environment.environment_variables.cpu == ["A=1", "DEBUG=true", "NAME=x"]


def test_environment_variables_per_device_with_gpu_alias() -> None:
    doc = with_(MINIMAL, environment={"environment_variables": {"cpu": ["A=1"], "gpu": ["NCCL_DEBUG=INFO"]}})
    cfg, _ = parse(doc)
    env = cfg.environment.environment_variables
    assert (env.cpu, env.cuda, env.rocm) == (["A=1"], ["NCCL_DEBUG=INFO"], [])


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (["NOEQUALS"], "entry 0 ('NOEQUALS') must be a string NAME=VALUE"),
        (["A=1", "=x"], "entry 1 ('=x') must be a string NAME=VALUE"),
        ([5], "entry 0 (5) must be a string NAME=VALUE"),
        ({"cpu": ["A=1"], "cuda": ["B"]}, "cuda: entry 0 ('B') must be a string NAME=VALUE"),
        (
            {"cpu": ["A=1"], "gpu": [], "cuda": []},
            "set only one of cuda and gpu (gpu is the old name of cuda)",
        ),
        (
            {"A": {"nested": 1}},
            "'A': a NAME: VALUE mapping needs a non-empty name without '=' and a scalar value",
        ),
        ("A=1", "must be a list of NAME=VALUE strings or a mapping (got string)"),
    ],
)
def test_environment_variable_errors(value: Any, reason: str) -> None:
    err = only_error(with_(MINIMAL, environment={"environment_variables": value}))
    assert err == FieldError("environment.environment_variables", reason)


def test_image_forms() -> None:
    cfg, _ = parse(with_(MINIMAL, environment={"image": "python:3.11"}))
    assert (cfg.environment.image.cpu, cfg.environment.image.cuda) == ("python:3.11", "python:3.11")
    cfg, _ = parse(with_(MINIMAL, environment={"image": {"cpu": "c", "gpu": "g"}}))
    assert (cfg.environment.image.cpu, cfg.environment.image.cuda, cfg.environment.image.rocm) == (
        "c",
        "g",
        None,
    )
    err = only_error(with_(MINIMAL, environment={"image": {"tpu": "t"}}))
    assert err.path == "environment.image"


def test_bind_mounts() -> None:
    cfg, _ = parse(
        with_(MINIMAL, bind_mounts=[{"host_path": "/data", "container_path": "/data", "read_only": True}])
    )
    assert cfg.bind_mounts[0].read_only is True
    assert cfg.bind_mounts[0].propagation == "rprivate"
    errs = errors(
        with_(
            MINIMAL,
            bind_mounts=[
                {"host_path": "/ok", "container_path": "/ok"},
                {"host_path": "data", "container_path": "."},
            ],
        )
    )
    assert errs == [
        FieldError("bind_mounts[1].host_path", "must be an absolute path"),
        FieldError("bind_mounts[1].container_path", "must not be the working directory '.'"),
    ]
    assert only_error(with_(MINIMAL, bind_mounts=[{"host_path": "/x"}])) == FieldError(
        "bind_mounts[0].container_path", "required field is missing"
    )


def test_workspace_and_project_go_together() -> None:
    parse(with_(MINIMAL, workspace="ml", project="vision"))
    assert only_error(with_(MINIMAL, workspace="ml")) == FieldError(
        "project", "workspace and project must be set together"
    )
    assert only_error(with_(MINIMAL, project="vision")) == FieldError(
        "workspace", "workspace and project must be set together"
    )


@pytest.mark.parametrize(
    ("changes", "path", "reason"),
    [
        ({"labels": "a,b"}, "labels", "must be a list (got string)"),
        ({"labels": ["a", 3]}, "labels[1]", "must be a string (got integer)"),
        ({"labels": ["a", ""]}, "labels[1]", "must not be empty"),
        ({"max_restarts": -1}, "max_restarts", "must be >= 0 (got -1)"),
        ({"max_restarts": 1.5}, "max_restarts", "must be an integer (got number)"),
        ({"scheduling_unit": 0}, "scheduling_unit", "must be >= 1 (got 0)"),
        ({"records_per_epoch": -1}, "records_per_epoch", "must be >= 0 (got -1)"),
        (
            {"checkpoint_policy": "sometimes"},
            "checkpoint_policy",
            "must be one of 'best', 'all' or 'none' (got 'sometimes')",
        ),
        ({"data": [1]}, "data", "must be a mapping (got list)"),
        ({"debug": "yes please"}, "debug", "must be a boolean (true or false) (got string)"),
        (
            {"profiling": {"enabled": True, "begin_on_batch": -1}},
            "profiling.begin_on_batch",
            "must be >= 0 (got -1)",
        ),
        ({"searcher_name": "x"}, "searcher_name", "unknown field (did you mean 'searcher'?)"),
        ({"colour": "x"}, "colour", "unknown field"),
        ({"hyperparameter": {}}, "hyperparameter", "unknown field (did you mean 'hyperparameters'?)"),
        ({"environment": {"imagee": "x"}}, "environment.imagee", "unknown field (did you mean 'image'?)"),
    ],
)
def test_field_errors(changes: dict[str, Any], path: str, reason: str) -> None:
    assert only_error(with_(MINIMAL, **changes)) == FieldError(path, reason)


def test_epoch_lengths_without_records_per_epoch_warn() -> None:
    doc = with_(
        searcher(name="single", metric="loss", max_length={"epochs": 2}), min_validation_period={"epochs": 1}
    )
    _, warnings = parse(doc)
    assert [w.split(":")[0] for w in warnings] == ["min_validation_period", "searcher.max_length"]
    _, warnings = parse(with_(doc, records_per_epoch=50_000))
    assert warnings == []


def test_single_searcher_with_varying_hyperparameters_warns() -> None:
    doc = with_(MINIMAL, hyperparameters={"lr": {"type": "double", "minval": 0.1, "maxval": 1}, "bs": 32})
    _, warnings = parse(doc)
    assert warnings == [
        "hyperparameters: the single searcher samples one value for non-constant hyperparameters (lr)"
    ]


def test_duplicate_labels_warn() -> None:
    _, warnings = parse(with_(MINIMAL, labels=["a", "a"]))
    assert warnings == ["labels: duplicate labels are stored once"]


# ----------------------------------------------------------------------------------------------
# The document itself
# ----------------------------------------------------------------------------------------------


def test_malformed_yaml_reports_the_line() -> None:
    text = "entrypoint: train.py\nsearcher:\n  name: single\n  metric: [loss\nresources: {}\n"
    err = only_error(text)
    assert err.path == ""
    assert err.reason.startswith("invalid YAML at line 5")


def test_tab_indentation_is_a_yaml_error_with_line() -> None:
    err = only_error("entrypoint: x\nsearcher:\n\tname: single\n")
    assert err.path == "" and "line 3" in err.reason


def test_non_utf8_bytes() -> None:
    err = only_error(b"entrypoint: caf\xe9\n")
    assert err == FieldError("", "config is not valid UTF-8 (byte 0xe9 at offset 15)")


def test_utf8_bytes_with_bom_are_fine() -> None:
    cfg, _ = parse(("\ufeff" + yaml.safe_dump(with_(MINIMAL, name="résumé"))).encode("utf-8"))
    assert cfg.name == "résumé"


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ("", "an empty document"),
        ("# just a comment\n", "an empty document"),
        ("- a\n- b\n", "a list"),
        ("42\n", "a integer"),
        ("hello\n", "a string"),
    ],
)
def test_top_level_must_be_a_mapping(text: str, got: str) -> None:
    assert only_error(text) == FieldError("", f"the config must be a mapping of fields (got {got})")


def test_duplicate_keys_are_refused_with_both_lines() -> None:
    err = only_error("entrypoint: a\nsearcher: {name: single, metric: x}\nentrypoint: b\n")
    assert err.path == ""
    assert (
        err.reason == "invalid YAML at line 3, column 1: found duplicate key 'entrypoint' (first at line 1)"
    )


def test_yaml_merge_keys_still_work() -> None:
    text = "base: &base {name: single, metric: loss}\nsearcher:\n  <<: *base\n  metric: acc\nentrypoint: x\n"
    # `base` is not a config field, so this is refused, but for that reason only
    assert only_error(text) == FieldError("base", "unknown field")
    text = "entrypoint: x\nsearcher:\n  <<: {name: single, metric: loss}\n  metric: acc\n"
    cfg, _ = parse(text)
    assert cfg.searcher.metric == "acc"


def test_multiple_documents_are_refused() -> None:
    err = only_error("entrypoint: x\n---\nentrypoint: y\n")
    assert err.path == "" and err.reason.startswith("invalid YAML")


def test_non_finite_numbers_and_nul_and_non_string_keys() -> None:
    text = (
        "entrypoint: x\nsearcher: {name: single, metric: loss}\n"
        "hyperparameters:\n  a: .nan\n  b: {type: double, minval: 0, maxval: .inf}\n  1: one\n"
        'description: "bad\\0byte"\n'
    )
    assert errors(text) == [
        FieldError("hyperparameters.a", "must be a finite number (got .nan/.inf)"),
        FieldError("hyperparameters.b.maxval", "must be a finite number (got .nan/.inf)"),
        FieldError("hyperparameters.1", "keys must be strings (got integer)"),
        FieldError("description", "must not contain NUL characters"),
    ]


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("1e-5", 1e-5),
        ("1E5", 1e5),
        ("-2.5e+3", -2.5e3),
        ("1.0e-09", 1e-9),
        (".5", 0.5),
        ("+.5e1", 5.0),
        ("1_000.5", 1000.5),
    ],
)
def test_exponent_floats_are_floats_like_json_and_determined(literal: str, value: float) -> None:
    # PyYAML alone (YAML 1.1) reads "1e-5" as a string; Determined's parser and JSON read a float.
    text = f"entrypoint: x\nsearcher: {{name: single, metric: loss}}\nhyperparameters:\n  lr: {literal}\n"
    cfg, _ = parse(text)
    assert cfg.hyperparameters["lr"] == ConstHyperparameter(type="const", val=value)
    assert isinstance(cfg.hyperparameters["lr"].val, float)  # type: ignore[union-attr]


def test_exponent_bounds_in_a_range() -> None:
    cfg, _ = parse(
        "entrypoint: x\nsearcher: {name: single, metric: loss}\n"
        "hyperparameters:\n  lr: {type: double, minval: 1e-5, maxval: 1e-1}\n"
    )
    assert cfg.hyperparameters["lr"] == DoubleHyperparameter(type="double", minval=1e-5, maxval=0.1)


@pytest.mark.parametrize("literal", ["123", "0x1f", "1e", "e5", "1.2.3", "1e5e5"])
def test_non_floats_are_unchanged(literal: str) -> None:
    text = f"entrypoint: x\nsearcher: {{name: single, metric: loss}}\nhyperparameters:\n  v: {literal}\n"
    cfg, _ = parse(text)
    assert cfg.hyperparameters["v"].val == yaml.safe_load(f"v: {literal}")["v"]  # type: ignore[union-attr]


def test_dates_stay_strings() -> None:
    cfg, _ = parse("entrypoint: x\nsearcher: {name: single, metric: loss}\ndescription: 2024-01-02\n")
    assert cfg.description == "2024-01-02"


def test_binary_values_are_refused() -> None:
    err = only_error(
        "entrypoint: x\nsearcher: {name: single, metric: loss}\ndata: {blob: !!binary aGVsbG8=}\n"
    )
    assert err == FieldError("data.blob", "unsupported YAML value of type bytes")


def test_alias_bomb_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    text = "\n".join(lines) + "\nentrypoint: x\n"
    err = only_error(text)
    assert err.path == ""
    assert err.reason.startswith("config is too large")


def test_deep_nesting_is_refused() -> None:
    text = "entrypoint: x\nsearcher: {name: single, metric: loss}\ndata: " + "[" * 80 + "]" * 80 + "\n"
    err = only_error(text)
    assert err.reason.startswith("nested more than 64 levels deep")


def test_oversized_text_is_refused() -> None:
    text = "entrypoint: x\n# " + "y" * (2 * 1024 * 1024) + "\n"
    assert only_error(text).reason.startswith("config is larger than")


def test_json_input_is_yaml_too() -> None:
    cfg, _ = parse(json.dumps(MINIMAL))
    assert cfg.searcher.name == "single"


# ----------------------------------------------------------------------------------------------
# Collecting every error
# ----------------------------------------------------------------------------------------------


def test_all_errors_are_collected_in_one_pass() -> None:
    doc = {
        "entrypoint": 5,
        "labels": ["ok", 3],
        "hyperparameters": {
            "lr": {"type": "double", "minval": 1, "maxval": 0.1},
            "opt": {"type": "categorical", "vals": []},
        },
        "searcher": {
            "name": "grid",
            "metric": "loss",
            "max_length": {"batches": 0, "epochs": 1},
            "colour": "red",
        },
        "resources": {"slots_per_trial": 0, "priority": 100},
        "checkpoint_storage": {"type": "s3"},
        "bind_mounts": [{"host_path": "rel", "container_path": "/c"}],
        "min_validation_period": {"batches": -1},
        "unknown_top": 1,
    }
    got = {(e.path, e.reason.split(" (")[0]) for e in errors(doc, default_checkpoint_storage=None)}
    assert got == {
        ("labels[1]", "must be a string"),
        ("entrypoint", "must be a non-empty string or a non-empty list of non-empty strings"),
        ("hyperparameters.opt.vals", "must not be empty"),
        ("hyperparameters.lr.minval", "minval"),
        ("searcher.max_length", "must have exactly one of batches, records, epochs"),
        ("searcher.colour", "unknown field"),
        ("resources.slots_per_trial", "must be >= 1"),
        ("resources.priority", "must be <= 99"),
        ("checkpoint_storage.bucket", "required field is missing"),
        ("bind_mounts[0].host_path", "must be an absolute path"),
        ("min_validation_period", "batches must be >= 0"),
        ("unknown_top", "unknown field"),
    }


def test_cross_field_checks_still_run_when_other_fields_are_broken() -> None:
    doc = with_(MINIMAL, workspace="ml", resources={"slots_per_trial": 0})
    assert {e.path for e in errors(doc)} == {"resources.slots_per_trial", "project"}


def test_config_invalid_str_lists_every_error() -> None:
    exc = ConfigInvalid([FieldError("a.b", "broken"), FieldError("", "whole thing")])
    assert str(exc) == "invalid experiment configuration (2 errors):\n  a.b: broken\n  (config): whole thing"
    assert str(ConfigInvalid([FieldError("x", "y")])).startswith(
        "invalid experiment configuration (1 error):"
    )


# ----------------------------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------------------------

FULL = {
    "name": "mnist",
    "description": "a full config",
    "labels": ["a", "b"],
    "workspace": "ml",
    "project": "vision",
    "data": {"url": "s3://x", "n": [1, 2]},
    "entrypoint": ["python3", "train.py"],
    "hyperparameters": DETERMINED_DOC_HPARAMS,
    "searcher": {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_trials": 16,
        "max_length": {"batches": 937},
        "max_concurrent_trials": 4,
        "mode": "conservative",
        "divisor": 3,
        "max_rungs": 4,
        "stop_once": True,
        "source_checkpoint_uuid": "5e4f",
    },
    "resources": {
        "slots_per_trial": 2,
        "max_slots": 8,
        "weight": 0.5,
        "priority": 40,
        "resource_pool": "gpu",
    },
    "max_restarts": 0,
    "min_validation_period": {"batches": 100},
    "min_checkpoint_period": {"epochs": 1},
    "records_per_epoch": 60000,
    "perform_initial_validation": True,
    "checkpoint_policy": "all",
    "checkpoint_storage": {"type": "s3", "bucket": "b", "prefix": "p", "save_experiment_best": 2},
    "environment": {"image": "python:3.11", "environment_variables": {"cpu": ["A=1"], "cuda": ["B=2"]}},
    "bind_mounts": [{"host_path": "/data", "container_path": "/data", "read_only": True}],
    "scheduling_unit": 50,
    "reproducibility": {"experiment_seed": 31337},
    "profiling": {"enabled": True, "begin_on_batch": 10, "end_after_batch": 20},
    "optimizations": {"aggregation_frequency": 2},
    "log_policies": [{"pattern": ".*OOM.*", "action": {"type": "cancel_retries"}}],
    "debug": True,
}


def test_full_config_round_trips_through_yaml_and_json() -> None:
    cfg, warnings = parse(FULL)
    assert warnings == []
    stored = config_to_dict(cfg)
    again, _ = parse(yaml.safe_dump(stored), default_checkpoint_storage=None, experiment_seed=None)
    assert config_to_dict(again) == stored
    again, _ = parse(json.dumps(stored), default_checkpoint_storage=None, experiment_seed=None)
    assert again == cfg


def test_stored_dict_revalidates_directly() -> None:
    cfg, _ = parse(FULL)
    assert ExperimentConfig.model_validate(config_to_dict(cfg)) == cfg


def test_round_trip_does_not_depend_on_master_defaults_any_more() -> None:
    cfg, _ = parse(
        MINIMAL, default_checkpoint_storage={"type": "gcs", "bucket": "x"}, default_resource_pool="p"
    )
    stored = config_to_dict(cfg)
    again, _ = parse(
        json.dumps(stored),
        default_checkpoint_storage={"type": "shared_fs", "host_path": "/other"},
        default_resource_pool="other",
        experiment_seed=1,
    )
    assert config_to_dict(again) == stored


# A small generator of valid configs for the round-trip property.
_names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
)


@st.composite
def _leaf_hparam(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["const", "short", "int", "double", "log", "categorical"]))
    if kind == "short":
        return draw(_scalars)
    if kind == "const":
        return {"type": "const", "val": draw(st.one_of(_scalars, st.lists(_scalars, max_size=3)))}
    if kind == "categorical":
        return {"type": "categorical", "vals": draw(st.lists(_scalars, min_size=1, max_size=4))}
    count = draw(st.integers(min_value=1, max_value=5))
    if kind == "int":
        lo = draw(st.integers(min_value=-1000, max_value=1000))
        return {"type": "int", "minval": lo, "maxval": lo + draw(st.integers(1, 1000)), "count": count}
    lo = draw(st.floats(min_value=-100, max_value=100))
    hp = {
        "type": kind,
        "minval": lo,
        "maxval": lo + draw(st.floats(min_value=0.5, max_value=50)),
        "count": count,
    }
    if kind == "log":
        hp["base"] = draw(st.sampled_from([2, 10, math.e]))
    return hp


_hparams = st.dictionaries(
    _names,
    st.one_of(_leaf_hparam(), st.dictionaries(_names, _leaf_hparam(), min_size=1, max_size=3)),
    max_size=4,
)


@st.composite
def _configs(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["single", "random", "grid", "adaptive_asha"]))
    s: dict[str, Any] = {"name": kind, "metric": draw(_names), "smaller_is_better": draw(st.booleans())}
    if kind in ("random", "adaptive_asha"):
        s["max_trials"] = draw(st.integers(1, 1000))
        s["max_concurrent_trials"] = draw(st.integers(0, 16))
    unit = draw(st.sampled_from(["batches", "records", "epochs"]))
    if kind == "adaptive_asha":
        s["max_rungs"] = draw(st.integers(1, 4))
        s["max_length"] = {unit: 4 ** (s["max_rungs"] - 1) * draw(st.integers(1, 50))}
    elif draw(st.booleans()):
        s["max_length"] = {unit: draw(st.integers(1, 10**6))}
    doc: dict[str, Any] = {
        "entrypoint": draw(st.one_of(st.just("python3 train.py"), st.lists(_names, min_size=1, max_size=3))),
        "searcher": s,
        "hyperparameters": draw(_hparams),
        "records_per_epoch": draw(st.integers(0, 10**6)),
        "resources": {"slots_per_trial": draw(st.integers(1, 64)), "weight": draw(st.floats(0.1, 10))},
        "labels": draw(st.lists(_names, max_size=3, unique=True)),
    }
    if draw(st.booleans()):
        doc["checkpoint_storage"] = draw(
            st.sampled_from(
                [
                    {"type": "gcs", "bucket": "b"},
                    {"type": "s3", "bucket": "b", "prefix": "x/y"},
                    {"type": "shared_fs", "host_path": "/h"},
                ]
            )
        )
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_configs(), st.sampled_from(["yaml", "json"]))
def test_round_trip_property(doc: dict[str, Any], encoding: str) -> None:
    text = yaml.safe_dump(doc) if encoding == "yaml" else json.dumps(doc)
    cfg, _ = parse(text, max_grid_trials=10**9)
    stored = config_to_dict(cfg)
    json.dumps(stored, allow_nan=False)  # JSON-safe
    again, _ = parse(
        json.dumps(stored), default_checkpoint_storage=None, experiment_seed=None, max_grid_trials=10**9
    )
    assert again == cfg
    assert config_to_dict(again) == stored


def test_json_escaped_astral_characters_survive() -> None:
    # json.dumps writes "😀" as the surrogate pair "\ud83d\ude00", which YAML decodes half by half.
    text = json.dumps(with_(MINIMAL, description="ship it 😀", hyperparameters={"emoji": "🚢"}))
    assert "\\ud83d" in text
    cfg, _ = parse(text)
    assert cfg.description == "ship it 😀"
    assert cfg.hyperparameters["emoji"] == ConstHyperparameter(type="const", val="🚢")
    json.dumps(config_to_dict(cfg)).encode("utf-8")


def test_lone_surrogate_is_refused() -> None:
    text = (
        '{"entrypoint": "x", "searcher": {"name": "single", "metric": "loss"}, "description": "bad \\ud83d"}'
    )
    assert only_error(text) == FieldError(
        "description", "must be valid Unicode (found an unpaired surrogate)"
    )


# ----------------------------------------------------------------------------------------------
# Reading a stored config back: ExperimentConfig.from_stored
# ----------------------------------------------------------------------------------------------


def test_from_stored_gives_back_the_config_that_was_stored() -> None:
    cfg, _ = parse(with_(searcher(name="adaptive_asha", metric="acc", smaller_is_better=False,
                                  max_length={"batches": 10}, max_trials=4),
                         max_restarts=2, resources={"slots_per_trial": 3}), refuse_short_asha_rungs=False)
    stored = json.loads(json.dumps(config_to_dict(cfg)))  # what a JSON column hands back
    assert ExperimentConfig.from_stored(stored) == cfg


def test_from_stored_fills_todays_defaults_into_an_older_row() -> None:
    # A row from before these fields were stored, with Determined-style nulls.
    old = {"entrypoint": "python3 train.py", "searcher": {"name": "random", "metric": "loss", "max_trials": 2,
                                                          "smaller_is_better": None},
           "checkpoint_storage": {"type": "shared_fs", "host_path": "/ckpt"}, "max_restarts": None}
    cfg = ExperimentConfig.from_stored(old)
    assert cfg.max_restarts == 5 and cfg.resources.slots_per_trial == 1
    assert cfg.searcher.smaller_is_better is True
    assert isinstance(cfg.searcher, RandomSearcher) and cfg.searcher.max_concurrent_trials == 16
    assert (cfg.checkpoint_storage.save_experiment_best, cfg.checkpoint_storage.save_trial_best,
            cfg.checkpoint_storage.save_trial_latest) == (0, 1, 1)
    assert cfg.searcher_seed == 0  # no seed was ever chosen for it


def test_from_stored_is_cached_by_content() -> None:
    cfg, _ = parse(MINIMAL)
    stored = config_to_dict(cfg)
    reordered = dict(reversed(list(stored.items())))
    assert ExperimentConfig.from_stored(stored) is ExperimentConfig.from_stored(reordered)
    changed = with_(stored, max_restarts=9)
    assert ExperimentConfig.from_stored(changed).max_restarts == 9


def test_from_stored_reads_a_config_its_fast_key_cannot_write() -> None:
    # An integer beyond 64 bits (a const hyperparameter may hold one): the cache key falls back
    # to the standard library's JSON, and the config reads back whole, from the cache as well.
    cfg, _ = parse(with_(MINIMAL, hyperparameters={"big": 2**70}))
    stored = json.loads(json.dumps(config_to_dict(cfg)))
    assert ExperimentConfig.from_stored(stored) == cfg
    assert ExperimentConfig.from_stored(stored) is ExperimentConfig.from_stored(dict(reversed(list(stored.items()))))


def test_from_stored_refuses_a_row_that_no_longer_validates() -> None:
    with pytest.raises(ConfigInvalid) as e:
        ExperimentConfig.from_stored({"entrypoint": "x", "searcher": {"name": "single", "metric": "loss"},
                                      "checkpoint_storage": {"type": "shared_fs", "host_path": "/c"},
                                      "max_restarts": -1})
    assert e.value.errors == [FieldError("max_restarts", "must be >= 0 (got -1)")]


def test_grid_size_is_the_searchers_count() -> None:
    from control_plane.core.searcher import grid_size as searcher_grid_size

    hps = {"a": {"type": "int", "minval": 1, "maxval": 3, "count": 10},
           "g": {"d": {"type": "log", "minval": 0, "maxval": 1, "base": 2, "count": 4}}, "c": 5}
    cfg, _ = parse(with_(searcher(name="grid", metric="loss"), hyperparameters=hps))
    assert grid_size(cfg.hyperparameters) == searcher_grid_size(hps) == 12
    # huge axes are counted, not built
    huge = {f"h{i}": {"type": "double", "minval": 0, "maxval": 1, "count": 2**31 - 1} for i in range(3)}
    assert only_error(with_(searcher(name="grid", metric="loss"), hyperparameters=huge)).reason.startswith(
        f"grid search would create {(2**31 - 1) ** 3} trials"
    )


def test_short_asha_rungs_are_judged_by_the_searchers_rung_count() -> None:
    # max_length 10, divisor 4: the searcher fits 2 rungs, so max_rungs 2 is fine and 3 is not.
    base = dict(name="adaptive_asha", metric="loss", max_length={"batches": 10}, max_trials=4)
    parse(searcher(**base, max_rungs=2))
    err = only_error(searcher(**base, max_rungs=3))
    assert err.path == "searcher.max_length" and err.reason.endswith("or set max_rungs to 2 or less")
    # A divisor just above 1 fits millions of rungs; counting them must not take millions of steps.
    cfg, warnings = parse(searcher(**base, divisor=1.0000001, max_rungs=30))
    assert cfg.searcher.max_rungs == 30 and not [w for w in warnings if "rung" in w]
