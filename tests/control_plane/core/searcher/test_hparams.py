from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.core.searcher import grid_size
from control_plane.core.searcher.hparams import Grid, TrialFactory, grid_values, sample_hparams
from tests.control_plane.core.searcher.helpers import HPARAMS


def test_samples_stay_in_their_spaces() -> None:
    rng = random.Random(7)
    for _ in range(500):
        hp = sample_hparams(HPARAMS, rng)
        assert 1e-4 <= hp["lr"] <= 1e-1
        assert isinstance(hp["layers"], int) and 1 <= hp["layers"] <= 8
        assert 0.0 <= hp["dropout"] <= 0.5
        assert hp["opt"] in ("sgd", "adam", "adamw")
        assert hp["epochs_hint"] == 3
        assert hp["model"]["act"] == "relu" and hp["model"]["width"] in (64, 128)


def test_samples_cover_int_and_categorical_ranges() -> None:
    rng = random.Random(1)
    samples = [sample_hparams(HPARAMS, rng) for _ in range(2000)]
    assert {s["layers"] for s in samples} == set(range(1, 9))
    assert {s["opt"] for s in samples} == {"sgd", "adam", "adamw"}
    # log-uniform: about a third of the samples per decade
    decades = [math.floor(math.log10(s["lr"])) for s in samples]
    for d in (-4, -3, -2):
        assert 0.25 < decades.count(d) / len(decades) < 0.42


def test_factory_is_deterministic_and_ignores_key_order() -> None:
    reordered = dict(reversed(list(HPARAMS.items())))
    fa, fb, fc = TrialFactory(HPARAMS, 42), TrialFactory(reordered, 42), TrialFactory(HPARAMS, 43)
    a = [fa.create() for _ in range(20)]
    b = [fb.create() for _ in range(20)]
    c = [fc.create() for _ in range(20)]
    assert a == b
    assert [x.request_id for x in a] != [x.request_id for x in c]
    assert len({x.request_id for x in a}) == 20
    assert all(0 <= x.trial_seed < 2**31 for x in a)


def test_factory_resumes_from_its_counter() -> None:
    full = TrialFactory(HPARAMS, 5)
    ops = [full.create() for _ in range(10)]
    resumed = TrialFactory(HPARAMS, 5, creates=6)
    assert [resumed.create() for _ in range(4)] == ops[6:]


def test_int_grid_includes_both_ends_and_clamps_count() -> None:
    assert grid_values({"type": "int", "minval": 0, "maxval": 10, "count": 3}) == [0, 5, 10]
    assert grid_values({"type": "int", "minval": 1, "maxval": 4, "count": 10}) == [1, 2, 3, 4]
    assert grid_values({"type": "int", "minval": 1, "maxval": 6, "count": 4}) == [1, 3, 4, 6]
    assert grid_values({"type": "int", "minval": 2, "maxval": 5, "count": 1}) == [4]  # round half away
    assert grid_values({"type": "int", "minval": -5, "maxval": -2, "count": 1}) == [-4]


@given(lo=st.integers(-50, 50), span=st.integers(0, 60), count=st.integers(1, 80))
def test_int_grid_is_sorted_unique_and_within_range(lo: int, span: int, count: int) -> None:
    vals = grid_values({"type": "int", "minval": lo, "maxval": lo + span, "count": count})
    assert vals == sorted(set(vals))
    assert len(vals) == min(count, span + 1)
    assert all(lo <= v <= lo + span for v in vals)
    if count > 1 and span > 0:
        assert vals[0] == lo and vals[-1] == lo + span


def test_double_log_categorical_const_grids() -> None:
    assert grid_values({"type": "double", "minval": 0.0, "maxval": 1.0, "count": 5}) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert grid_values({"type": "double", "minval": 0.0, "maxval": 1.0, "count": 1}) == [0.5]
    logs = grid_values({"type": "log", "minval": -3, "maxval": -1, "base": 10, "count": 3})
    assert logs == pytest.approx([1e-3, 1e-2, 1e-1])
    assert grid_values({"type": "log", "minval": 1, "maxval": 3, "base": 2, "count": 3}) == [2.0, 4.0, 8.0]
    assert grid_values({"type": "categorical", "vals": ["a", 1, None]}) == ["a", 1, None]
    assert grid_values({"type": "const", "val": {"k": 1}}) == [{"k": 1}]
    assert grid_values(7) == [7]


def test_grid_is_the_cartesian_product_in_sorted_name_order() -> None:
    cfg = {
        "b": {"type": "categorical", "vals": ["x", "y"]},
        "a": {"type": "int", "minval": 1, "maxval": 3, "count": 3},
        "c": 0.5,
        "nested": {"d": {"type": "double", "minval": 0, "maxval": 1, "count": 2}},
    }
    grid = Grid(cfg)
    points = [grid.point(i) for i in range(grid.size)]
    expected = [
        {"a": a, "b": b, "c": 0.5, "nested": {"d": d}}
        for a, b, d in itertools.product([1, 2, 3], ["x", "y"], [0.0, 1.0])
    ]
    assert points == expected
    assert grid_size(cfg) == 12
    with pytest.raises(IndexError):
        grid.point(12)


def test_grid_size_of_an_empty_space_is_one_point() -> None:
    assert grid_size({}) == 1
    assert Grid({}).point(0) == {}


def test_grid_size_does_not_materialize_huge_grids() -> None:
    cfg = {f"h{i}": {"type": "int", "minval": 0, "maxval": 99, "count": 100} for i in range(6)}
    assert grid_size(cfg) == 100**6


def test_grid_needs_count_for_numeric_hparams() -> None:
    with pytest.raises(ValueError, match=r"hyperparameters\.model\.lr: grid search needs 'count'"):
        grid_size({"model": {"lr": {"type": "double", "minval": 0, "maxval": 1}}})
