"""services/trials.py called directly, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Experiment, Trial
from control_plane.errors import Invalid, NotFound, PermissionDenied
from control_plane.services import metrics as trial_metrics
from control_plane.services import trials
from control_plane.services.trials import SearcherOperation
from tests.control_plane.services.builders import RANDOM, create_experiment


def test_the_searcher_operation_of_a_trial(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)  # single searcher, max_length 100
    with master.read_sessions() as s:
        (trial,) = trials.trials_of(s, exp_id)
        assert trials.searcher_operation(s, trial) == SearcherOperation(100, False)
    with transaction(master.sessions) as s:
        s.get(Experiment, exp_id).state = st.ExperimentState.PAUSED
    with master.read_sessions() as s:
        assert trials.searcher_operation(s, s.get(Trial, trial.id)) == SearcherOperation(None, False)
    with transaction(master.sessions) as s:
        s.get(Experiment, exp_id).state = st.ExperimentState.ACTIVE
        t = s.get(Trial, trial.id)
        with pytest.raises(Invalid) as err:
            trials.complete_operation(s, master, t, 50, 0.1)
        assert err.value.details[0].field == "op.length"
        trials.complete_operation(s, master, t, 100, 0.1)
        trials.complete_operation(s, master, t, 100, 0.1)  # again: a no-op
    trial_metrics.report_progress(master, trial.id, lambda _s: Principal(kind=TokenKind.ALLOCATION, token_id=0, trial_id=trial.id),
                                 3.0)  # capped at 1
    with master.read_sessions() as s:
        t = s.get(Trial, trial.id)
        assert t.searcher_completed_length == 100 and t.progress == 1.0
        assert trials.searcher_operation(s, t) == SearcherOperation(None, True)


def test_trials_are_filtered_and_ordered(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master, RANDOM)
    now = master.clock()
    with transaction(master.sessions) as s:
        a, b, c = trials.trials_of(s, exp_id)
        a.state, a.best_validation, a.end_time = st.TrialState.COMPLETED, 0.4, now - timedelta(seconds=5)
        b.state, b.best_validation = st.TrialState.RUNNING, float("nan")
        c.best_validation = 0.1
        ids = [a.id, b.id, c.id]
    with master.read_sessions() as s:
        assert [t.id for t in trials.trials_of(s, exp_id, {"STATE_ACTIVE"})] == ids[1:]
        found = trials.trials_of(s, exp_id)
        by_metric = trials.ordered(found, "SORT_BY_BEST_VALIDATION_METRIC", False, {}, now)
        assert [t.id for t in by_metric] == [ids[2], ids[0], ids[1]]  # NaN last
        by_metric_desc = trials.ordered(found, "SORT_BY_BEST_VALIDATION_METRIC", True, {}, now)
        assert [t.id for t in by_metric_desc] == [ids[0], ids[2], ids[1]]
        by_end = trials.ordered(found, "SORT_BY_END_TIME", True, {}, now)
        assert by_end[0].id == ids[0]
        by_size = trials.ordered(found, "SORT_BY_CHECKPOINT_SIZE", True, {ids[1]: 10}, now)
        assert [t.id for t in by_size] == [ids[1], ids[2], ids[0]]  # ties by id, in the same direction


def test_progress_is_reported_only_by_the_trials_own_allocation_or_its_owner(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master, RANDOM)
    with master.read_sessions() as s:
        first, second = trials.trials_of(s, exp_id)[:2]
    other = Principal(kind=TokenKind.ALLOCATION, token_id=0, trial_id=second.id)
    with pytest.raises(PermissionDenied):
        trial_metrics.report_progress(master, first.id, lambda _s: other, 0.5)
    with pytest.raises(NotFound):
        trial_metrics.report_progress(master, 2_000_000_000, lambda _s: other, 0.5)
    trial_metrics.report_progress(master, second.id, lambda _s: other, 0.25)
    with master.read_sessions() as s:
        assert s.get(Trial, first.id).progress in (None, 0.0)  # the refused report wrote nothing
        assert s.get(Trial, second.id).progress == 0.25
