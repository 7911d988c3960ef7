"""Bounds on reading a config's YAML (core/expconf/loading.py): checked on the event stream, before
PyYAML composes anything, with the same reasons as the checks on the loaded tree."""

from __future__ import annotations

import pytest

from control_plane.core.expconf import ConfigInvalid, parse_experiment_config

BASE = "entrypoint: x\nsearcher: {name: single, metric: loss, max_length: {batches: 1}}\n"


def _reason(text: str) -> str:
    with pytest.raises(ConfigInvalid) as err:
        parse_experiment_config(text)
    return err.value.errors[0].reason


@pytest.mark.parametrize("nested", [" " + "[" * 6000, " " + "{a: " * 1500, " " + "[{a: " * 1000,
                                    "\n" + "".join(" " * (i + 1) + "a:\n" for i in range(100))])
def test_deep_documents_are_refused_before_composing(nested: str) -> None:
    # 6 KB of flow nesting cost PyYAML seconds (a recursive composer, a quadratic scanner)
    assert _reason(BASE + "data:" + nested + "\n").startswith("nested more than 64 levels deep")


def test_alias_expansion_is_counted_without_expanding() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]  # 10^12 values
    assert "after expanding aliases" in _reason(BASE + "\n".join(lines) + "\n")


def test_documents_with_too_many_nodes_are_refused() -> None:
    many = BASE + "hyperparameters:\n" + "".join(f"  k{i}: {{type: const, val: {i}}}\n" for i in range(7000))
    assert _reason(many).startswith("config is too large")


def test_a_config_within_the_bounds_still_reads() -> None:
    ok = BASE + "data: {x: " + "[" * 60 + "]" * 60 + "}\nhyperparameters:\n" + "".join(
        f"  k{i}: {{type: const, val: {i}}}\n" for i in range(1000))
    cfg, _ = parse_experiment_config(ok, default_checkpoint_storage={"type": "shared_fs", "host_path": "/tmp/x"})
    assert len(cfg.hyperparameters) == 1000
