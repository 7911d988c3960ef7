"""services/metrics.py called directly, on SQLite and PostgreSQL: idempotent storage, the best
and latest validation (NaN included), and the searcher hook."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import select

from control_plane.db.engine import transaction
from control_plane.db.models import Metric, Trial
from control_plane.errors import Invalid
from control_plane.services import metrics
from control_plane.services.metrics import MetricRange, MetricReport
from tests.control_plane.services.builders import CONFIG, create_experiment


def trial_of(master, exp_id: int) -> int:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        return s.scalar(select(Trial.id).where(Trial.experiment_id == exp_id))


def store(master, trial_id: int, *reports: MetricReport) -> int:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        trial, exp = metrics.lock_for_reports(s, trial_id, {r.group for r in reports})
        return metrics.store_reports(s, master, trial, exp, list(reports))


def val(trial_id: int, steps: int, value: Any, run: int = 1) -> MetricReport:
    return MetricReport("validation", trial_id, run, steps, {"val_loss": value})


def best_and_latest(master, trial_id: int) -> tuple[float | None, int | None, int | None]:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        t = s.get(Trial, trial_id)
        latest = t.latest_validation or {}
        best = latest.get("best") or {}
        return t.best_validation, best.get("stepsCompleted"), latest.get("stepsCompleted")


def test_a_retried_report_changes_nothing_and_a_newer_run_replaces_it(master) -> None:  # type: ignore[no-untyped-def]
    tid = trial_of(master, create_experiment(master))
    first = MetricReport("training", tid, 1, 10, {"loss": 1.0}, batch_metrics=[{"loss": 1.5}])
    assert store(master, tid, first) == 1
    assert store(master, tid, MetricReport("training", tid, 1, 10, {"loss": 9.0})) == 0  # the retry
    assert store(master, tid, MetricReport("training", tid, 0, 10, {"loss": 8.0})) == 0  # an older run
    with master.read_sessions() as s:
        (row,) = s.scalars(select(Metric).where(Metric.trial_id == tid))
        assert (row.trial_run_id, row.metrics) == (1, {"avg_metrics": {"loss": 1.0}, "batch_metrics": [{"loss": 1.5}]})
    assert store(master, tid, MetricReport("training", tid, 2, 10, {"loss": 2.0})) == 1
    # a batch with the same step twice stores it once
    assert store(master, tid, MetricReport("training", tid, 1, 20, {"loss": 0.1}),
                 MetricReport("training", tid, 1, 20, {"loss": 0.2})) == 1
    with master.read_sessions() as s:
        rows, total = metrics.metric_page(s, tid, MetricRange(group="training"), 0, 0)
        assert total == 2 and [(m.steps_completed, m.trial_run_id, m.metrics["avg_metrics"]["loss"]) for m in rows] \
            == [(10, 2, 2.0), (20, 1, 0.1)]
        assert s.get(Trial, tid).steps_completed == 20


def test_best_validation_ignores_nan_and_follows_the_direction(master) -> None:  # type: ignore[no-untyped-def]
    tid = trial_of(master, create_experiment(master))
    store(master, tid, val(tid, 10, math.nan))
    assert best_and_latest(master, tid) == (None, None, 10)  # NaN is never a best
    store(master, tid, val(tid, 20, 0.5), val(tid, 30, "NaN"), val(tid, 40, 0.7))
    assert best_and_latest(master, tid) == (0.5, 20, 40)
    store(master, tid, val(tid, 25, 0.3))  # an earlier step arriving late: best moves, latest stays
    assert best_and_latest(master, tid) == (0.3, 25, 40)
    with master.read_sessions() as s:
        latest = s.get(Trial, tid).latest_validation
        assert latest["searcherMetric"] == 0.7 and latest["best"]["searcherMetric"] == 0.3
        (nan_row,) = s.scalars(select(Metric).where(Metric.trial_id == tid, Metric.steps_completed == 30))
        assert nan_row.metrics == {"validation_metrics": {"val_loss": "NaN"}}  # stored as plain JSON

    bigger = create_experiment(master, CONFIG.replace("smaller_is_better: true", "smaller_is_better: false"))
    tid2 = trial_of(master, bigger)
    store(master, tid2, val(tid2, 10, 0.5), val(tid2, 20, 0.9), val(tid2, 30, math.inf), val(tid2, 40, 0.1))
    assert best_and_latest(master, tid2) == (math.inf, 30, 40)


def test_a_replaced_validation_rebuilds_the_best(master) -> None:  # type: ignore[no-untyped-def]
    tid = trial_of(master, create_experiment(master))
    store(master, tid, val(tid, 10, 0.2), val(tid, 20, 0.4))
    assert best_and_latest(master, tid) == (0.2, 10, 20)
    store(master, tid, val(tid, 10, 0.9, run=2))  # the restarted run re-reports step 10, worse
    assert best_and_latest(master, tid) == (0.4, 20, 20)
    store(master, tid, val(tid, 20, "NaN", run=2))
    assert best_and_latest(master, tid) == (0.9, 10, 20)


def test_a_report_for_another_trial_is_refused_with_its_path(master) -> None:  # type: ignore[no-untyped-def]
    tid = trial_of(master, create_experiment(master))
    bad = MetricReport("training", tid + 1000, 1, 10, {"loss": 1.0}, field="reports[1].metrics")
    with pytest.raises(Invalid) as err:
        store(master, tid, MetricReport("training", tid, 1, 5, {"loss": 1.0}), bad)
    assert err.value.details[0].field == "reports[1].metrics.trialId"
    with master.read_sessions() as s:
        assert list(s.scalars(select(Metric).where(Metric.trial_id == tid))) == []  # all or nothing


def test_the_validation_at_the_target_length_completes_the_searcher_operation(master) -> None:  # type: ignore[no-untyped-def]
    tid = trial_of(master, create_experiment(master))  # single searcher, max_length 100
    store(master, tid, val(tid, 50, 0.5))
    with master.read_sessions() as s:
        assert s.get(Trial, tid).searcher_completed_length is None
    store(master, tid, val(tid, 100, 0.4))
    store(master, tid, val(tid, 100, 0.4))  # the retry does not move the searcher twice
    with master.read_sessions() as s:
        t = s.get(Trial, tid)
        assert t.searcher_completed_length == 100 and t.searcher_closed


def test_metric_stream_pages(master) -> None:  # type: ignore[no-untyped-def]
    tid = trial_of(master, create_experiment(master))
    store(master, tid, *[MetricReport("training", tid, 1, step, {"loss": step}) for step in range(1, 8)])
    with master.read_sessions() as s:
        page = metrics.metrics_after(s, tid, "training", 2, MetricRange(end=6), 3)
        assert [m.steps_completed for m in page] == [3, 4, 5]
        assert [m.steps_completed for m in metrics.metrics_after(s, tid, "training", 5, MetricRange(end=6), 3)] == [6]
