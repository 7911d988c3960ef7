"""The UI's read views (services/dashboard.py), on SQLite and PostgreSQL (the `master` fixture)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import insert, select, update

from control_plane.core.expconf.secrets import REDACTED
from control_plane.db.engine import transaction
from control_plane.db.models import Experiment, Metric, Trial
from control_plane.services import dashboard
from control_plane.services.dashboard import ExperimentQuery
from tests.control_plane.services.builders import CONFIG, create_experiment


def _names(master, **query) -> tuple[list[int], int]:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        rows, total = dashboard.experiment_page(s, ExperimentQuery(**query), master.clock())
    return [r.id for r in rows], total


def test_experiment_page_filters_sorts_and_pages(master) -> None:  # type: ignore[no-untyped-def]
    ids = [create_experiment(master, CONFIG.replace("mnist-test", f"run-{i}")) for i in range(5)]
    with transaction(master.sessions) as s:
        s.execute(update(Experiment).where(Experiment.id == ids[1]).values(labels=["keep", 'q"uote'],
                                                                           state="STATE_PAUSED"))
        s.execute(update(Experiment).where(Experiment.id == ids[2]).values(labels=["keeper"], archived=True))
    assert _names(master) == (list(reversed([i for i in ids if i != ids[2]])), 4)
    assert _names(master, archived=True)[1] == 5
    assert _names(master, label="keep") == ([ids[1]], 1)  # exact label, not "keeper"
    assert _names(master, label='q"uote') == ([ids[1]], 1)
    assert _names(master, label="%") == ([], 0)
    assert _names(master, state="STATE_PAUSED") == ([ids[1]], 1)
    assert _names(master, name="RUN-3") == ([ids[3]], 1)
    assert _names(master, owner="admin")[1] == 4
    assert _names(master, owner="nobody") == ([], 0)
    assert _names(master, sort="name", desc=False, limit=2) == ([ids[0], ids[1]], 4)
    assert _names(master, sort="name", desc=False, limit=2, offset=2) == ([ids[3], ids[4]], 4)
    with master.read_sessions() as s:
        rows, _ = dashboard.experiment_page(s, ExperimentQuery(limit=1), master.clock())
    assert rows[0].searcher == "single" and rows[0].metric == "val_loss" and rows[0].trials == 1


def test_series_reads_one_metric_and_downsamples(master, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    now = master.clock()
    with transaction(master.sessions) as s:
        trial_id = s.scalar(select(Trial.id).where(Trial.experiment_id == exp_id))
        rows = [{"trial_id": trial_id, "group_name": "training", "steps_completed": i, "trial_run_id": 0,
                 "metrics": {"avg_metrics": {"loss": 1.0 / i, "acc": "NaN" if i == 3 else i, "note": "text"}},
                 "report_time": now + timedelta(seconds=i)} for i in range(1, 3001)]
        rows.append({"trial_id": trial_id, "group_name": "validation", "steps_completed": 10, "trial_run_id": 0,
                     "metrics": {"validation_metrics": {"val_loss": "Infinity"}}, "report_time": now})
        s.execute(insert(Metric), rows)
    with master.read_sessions() as s:
        srs = dashboard.series(s, trial_id, "training", "loss", max_points=100)
        acc = dashboard.series(s, trial_id, "training", "acc", max_points=5000)
        val = dashboard.series(s, trial_id, "validation", "val_loss")
        names = dashboard.metric_names(s, [trial_id])
        none = dashboard.series(s, trial_id, "training", "missing")
        # A long series is picked on the index (one report per step range) before LTTB.
        monkeypatch.setattr(dashboard, "EXACT_LIMIT", 500)
        picked = dashboard.series(s, trial_id, "training", "loss", max_points=50)
    assert srs.total == 3000 and len(srs.points) == 100
    # SQLite's JSON number parser may be an ulp off: close is what a chart needs.
    assert srs.points[0] == (1, 1.0) and srs.points[-1] == (3000, pytest.approx(1.0 / 3000, rel=1e-12))
    assert picked.total == 3000 and len(picked.points) == 50
    assert picked.points[0] == (1, 1.0) and picked.points[-1][0] == 3000
    assert acc.total == 3000 and (3, 3.0) not in acc.points  # NaN is not drawn
    assert val.total == 1 and val.points == [] and none.total == 3000 and none.points == []
    assert names == {"training": ["acc", "loss"], "validation": ["val_loss"]}  # "note" is text, not a metric to draw


def test_views_of_experiment_trial_cluster_and_models(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with master.read_sessions() as s:
        exp = s.get(Experiment, exp_id)
        view = dashboard.experiment_view(s, exp)
        trial = s.scalar(select(Trial).where(Trial.experiment_id == exp_id))
        tview = dashboard.trial_view(s, trial)
        pools = dashboard.cluster_view(s, master, master.clock())
        hist = dashboard.slot_history(s, "default", master.clock())
        models = dashboard.models_view(s)
    assert view.metric == "val_loss" and view.hparam_names == ["lr"] and "searcher:" in view.config_yaml
    assert tview.exp.id == exp_id and len(tview.allocations) == 1 and tview.allocations[0].state == "pending"
    assert [p.name for p in pools] == ["default"]
    assert [j.exp.id for j in pools[0].queue] == [exp_id]
    assert hist["provisioned"][-1][1] == 0 and hist["used"][-1][1] == 0
    assert models == []


def test_config_yaml_hides_secrets() -> None:
    text = dashboard.config_yaml({"checkpoint_storage": {"type": "s3", "secret_key": "s3cr3t"}, "name": "x"})
    assert "s3cr3t" not in text and REDACTED in text
