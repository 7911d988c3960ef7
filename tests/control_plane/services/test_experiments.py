"""services/experiments.py called directly, on SQLite and PostgreSQL (the `master` fixture)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Checkpoint, Experiment, Metric, ModelDefinition, Trial
from control_plane.errors import Conflict, Invalid
from control_plane.services import experiments
from control_plane.services.experiments import ExperimentEdit, ExperimentFilter, NewExperiment
from tests.control_plane.services.builders import CONFIG, RANDOM, TRAIN_PY, admin, create_experiment


def counts(master) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        return tuple(s.scalar(select(func.count()).select_from(t)) or 0  # type: ignore[return-value]
                     for t in (Experiment, ModelDefinition, Trial))


@pytest.mark.parametrize(
    ("config", "files", "field"),
    [
        (CONFIG.replace("max_length: {batches: 100}", "max_length: {batches: -1}"), [TRAIN_PY],
         "config.searcher.max_length"),
        (CONFIG.replace("slots_per_trial: 1", "slots_per_trial: 1\n  resource_pool: nowhere"), [TRAIN_PY],
         "config.resources.resource_pool"),
        (CONFIG, [{**TRAIN_PY, "path": "../escape.py"}], "modelDefinition[0].path"),
        ("", [TRAIN_PY], "config"),
    ],
)
def test_a_refused_submission_names_the_field_and_leaves_no_row(master, config, files, field) -> None:  # type: ignore[no-untyped-def]
    before = counts(master)
    with pytest.raises(Invalid) as err, transaction(master.sessions) as s:
        experiments.create(s, master, admin(master), NewExperiment(config, files))
    assert [d.field for d in err.value.details][:1] == [field], err.value.details
    assert field in err.value.message
    assert counts(master) == before


def test_create_stores_the_config_the_archive_and_the_searchers_first_trials(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master, RANDOM)
    with master.read_sessions() as s:
        exp = s.get(Experiment, exp_id)
        assert exp.name == f"Experiment {exp_id}"  # no name in the config
        assert exp.state == st.ExperimentState.ACTIVE and exp.owner_id == admin(master).user_id
        assert exp.config["searcher"]["max_trials"] == 3 and exp.original_config == RANDOM
        assert s.get(ModelDefinition, exp.model_definition_id).file_count == 1
        trials = list(s.scalars(select(Trial).where(Trial.experiment_id == exp_id)))
        assert len(trials) == 3 and {t.state for t in trials} == {st.TrialState.QUEUED}
        assert len({t.hparams["lr"] for t in trials}) == 3
        assert experiments.model_definition(s, exp)[:2] == b"\x1f\x8b"  # gzip


def test_validate_only_writes_nothing(master) -> None:  # type: ignore[no-untyped-def]
    before = counts(master)
    with transaction(master.sessions) as s:
        v = experiments.validate(s, master, NewExperiment(CONFIG, [TRAIN_PY]))
    assert v.config_dict["searcher"]["metric"] == "val_loss" and [f.path for f in v.files] == ["train.py"]
    assert counts(master) == before


def test_a_missing_parent_is_refused(master) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Invalid) as err, transaction(master.sessions) as s:
        experiments.create(s, master, admin(master), NewExperiment(CONFIG, [TRAIN_PY], parent_id=999))
    assert err.value.details[0].field == "parentId"


def test_edit_and_labels(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with transaction(master.sessions) as s:
        exp = s.get(Experiment, exp_id)
        experiments.edit(s, exp, ExperimentEdit(name="n\x00", labels=["x", "y", "x"]))
        assert exp.name == "n\ufffd" and exp.labels == ["x", "y"]
        assert experiments.add_label(exp, "z") == ["x", "y", "z"]
        assert experiments.add_label(exp, "z") == ["x", "y", "z"]
        assert experiments.remove_label(exp, "x") == ["y", "z"]
    with pytest.raises(Invalid) as err, transaction(master.sessions) as s:
        experiments.edit(s, s.get(Experiment, exp_id), ExperimentEdit(labels=["ok", " "]))
    assert err.value.details[0].field == "labels[1]"
    with master.read_sessions() as s:
        assert s.get(Experiment, exp_id).labels == ["y", "z"]


def test_archive_and_delete_need_a_finished_experiment(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with pytest.raises(Conflict), transaction(master.sessions) as s:
        experiments.archive(s.get(Experiment, exp_id))
    with pytest.raises(Conflict), transaction(master.sessions) as s:
        experiments.delete_experiment(s, master, s.get(Experiment, exp_id), admin(master))
    assert counts(master)[0] == 1
    with master.read_sessions() as s:
        assert s.get(Experiment, exp_id).archived is False


def test_delete_removes_the_data_and_leaves_checkpoints_to_gc(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with transaction(master.sessions) as s:
        exp = s.get(Experiment, exp_id)
        trial = s.scalar(select(Trial).where(Trial.experiment_id == exp_id))
        s.add(Metric(trial_id=trial.id, group_name="training", steps_completed=1, trial_run_id=1,
                     metrics={"avg_metrics": {}}, report_time=master.clock()))
        s.add(Checkpoint(uuid="6f1c2f3e-0000-4000-8000-000000000001", trial_id=trial.id, experiment_id=exp_id,
                         task_id=trial.task_id, state=st.CheckpointState.COMPLETED, report_time=master.clock(),
                         steps_completed=1, resources={}, metadata_={}, storage={}, size_bytes=0))
        exp.state = st.ExperimentState.COMPLETED
        for alloc in s.scalars(select(Allocation).where(Allocation.experiment_id == exp_id)):
            alloc.state = st.AllocationState.TERMINATED
    with transaction(master.sessions) as s:
        experiments.delete_experiment(s, master, s.get(Experiment, exp_id), admin(master))
    assert counts(master) == (0, 0, 0)
    with master.read_sessions() as s:
        assert s.scalar(select(func.count()).select_from(Metric)) == 0
        (ckpt,) = s.scalars(select(Checkpoint))
        assert ckpt.state == st.CheckpointState.DELETING and ckpt.trial_id is None


def test_list_by_searcher_metric_puts_experiments_without_one_last(master) -> None:  # type: ignore[no-untyped-def]
    ids = [create_experiment(master) for _ in range(3)]
    with transaction(master.sessions) as s:
        for exp_id, best in zip(ids, [0.5, None, 0.2], strict=True):
            s.scalar(select(Trial).where(Trial.experiment_id == exp_id)).best_validation = best
    with master.read_sessions() as s:
        for desc, expected in ((False, [ids[2], ids[0], ids[1]]), (True, [ids[0], ids[2], ids[1]])):
            found = experiments.list_experiments(s, ExperimentFilter(), sort_by="SORT_BY_SEARCHER_METRIC_VAL",
                                                 desc=desc, offset=0, limit=0)
            assert [e.id for e in found] == expected
        flt = ExperimentFilter(id_gt=ids[0], states={st.ExperimentState.ACTIVE})
        assert experiments.count_experiments(s, flt) == 2
        page = experiments.list_experiments(s, flt, sort_by="SORT_BY_ID", desc=True, offset=1, limit=1)
        assert [e.id for e in page] == [ids[1]]
