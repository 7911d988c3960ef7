"""core/expconf/merge.py: a template under an experiment config, as Determined's schemas.Merge."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from control_plane.core.expconf.merge import merge_template


def test_experiment_wins_and_template_fills_gaps() -> None:
    tpl = {"description": "from template", "resources": {"slots_per_trial": 2, "resource_pool": "gpu"},
           "max_restarts": 3, "environment": {"environment_variables": ["A=1"]}}
    exp = {"description": "mine", "resources": {"slots_per_trial": 1}, "max_restarts": None}
    assert merge_template(exp, tpl) == {
        "description": "mine", "resources": {"slots_per_trial": 1, "resource_pool": "gpu"}, "max_restarts": 3,
        "environment": {"environment_variables": ["A=1"]}}


def test_lists_are_not_concatenated_except_labels_bind_mounts_and_devices() -> None:
    tpl = {"entrypoint": ["python", "a.py"], "labels": ["team", "x"],
           "bind_mounts": [{"host_path": "/data", "container_path": "/data"},
                           {"host_path": "/t", "container_path": "/shared"}],
           "resources": {"devices": [{"host_path": "/dev/a", "container_path": "/dev/a"}]}}
    exp = {"entrypoint": ["python", "b.py"], "labels": ["x", "mine"],
           "bind_mounts": [{"host_path": "/mine", "container_path": "/shared"}]}
    out = merge_template(exp, tpl)
    assert out["entrypoint"] == ["python", "b.py"]
    assert out["labels"] == ["x", "mine", "team"]
    assert out["bind_mounts"] == [{"host_path": "/mine", "container_path": "/shared"},
                                  {"host_path": "/data", "container_path": "/data"}]
    assert out["resources"]["devices"] == [{"host_path": "/dev/a", "container_path": "/dev/a"}]


def test_unions_merge_only_the_same_member() -> None:
    tpl = {"checkpoint_storage": {"type": "s3", "bucket": "b", "save_trial_best": 5},
           "searcher": {"name": "random", "max_trials": 8, "metric": "loss", "smaller_is_better": True},
           "hyperparameters": {"lr": {"type": "double", "minval": 0.1, "maxval": 1.0}, "n": 3}}
    exp = {"checkpoint_storage": {"type": "shared_fs", "host_path": "/c"},
           "searcher": {"name": "single", "max_length": 10},
           "hyperparameters": {"lr": {"type": "const", "val": 0.5}}}
    out = merge_template(exp, tpl)
    assert out["checkpoint_storage"] == {"type": "shared_fs", "host_path": "/c", "save_trial_best": 5}
    assert out["searcher"] == {"name": "single", "max_length": 10, "metric": "loss", "smaller_is_better": True}
    assert out["hyperparameters"] == {"lr": {"type": "const", "val": 0.5}, "n": 3}
    same = merge_template({"checkpoint_storage": {"type": "s3", "prefix": "p"}}, tpl)
    assert same["checkpoint_storage"] == {"type": "s3", "prefix": "p", "bucket": "b", "save_trial_best": 5}


def test_image_forms() -> None:
    out = merge_template({"environment": {"image": {"gpu": "mine:gpu"}}}, {"environment": {"image": "team:1"}})
    assert out["environment"]["image"] == {"gpu": "mine:gpu", "cpu": "team:1"}


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                     max_leaves=10)


@given(st.dictionaries(st.sampled_from(["a", "labels", "searcher", "resources"]), _json, max_size=4),
       st.dictionaries(st.sampled_from(["a", "labels", "searcher", "b"]), _json, max_size=4))
def test_inputs_unchanged_and_every_set_experiment_scalar_kept(exp: dict, tpl: dict) -> None:
    before = (copy.deepcopy(exp), copy.deepcopy(tpl))
    out = merge_template(exp, tpl)
    assert (exp, tpl) == before
    for k, v in exp.items():
        if v is not None and not isinstance(v, (dict, list)):
            assert out[k] == v
    for k, v in tpl.items():
        if exp.get(k) is None:
            assert out[k] == v
    assert merge_template(exp, {}) == exp
