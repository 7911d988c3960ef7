"""The autoscaler's history in the database (services/scaling_history.py), on SQLite and PostgreSQL
(the `master` fixture): a row per change, steady ticks collapsed, pruning by age and count, and
what the API and the pool page read of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.db.engine import transaction
from control_plane.services import dashboard, scaling_history
from control_plane.services.scaling_history import Retention
from tests.conftest import login

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
KEEP = Retention(timedelta(days=7), 1000)


def _steady(s, at: datetime, keep: Retention = KEEP, reason: str = "nothing pending") -> None:  # type: ignore[no-untyped-def]
    scaling_history.record_decision(s, "default", at, keep, launches=[], terminated=[], reasons=[reason])


def test_changes_are_rows_and_steady_ticks_collapse(master) -> None:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        for i in range(30):  # a quiet pool: one row however many ticks
            _steady(s, T0 + timedelta(seconds=3 * i), reason=f"tick {i}")
        scaling_history.record_decision(s, "default", T0 + timedelta(seconds=90), KEEP,
                                        launches=[("m5.large", "spot"), ("m5.large", "spot")], terminated=[],
                                        reasons=["2 pending slots"])
        _steady(s, T0 + timedelta(seconds=93))
        scaling_history.record_decision(s, "default", T0 + timedelta(seconds=96), KEEP, launches=[],
                                        terminated=[{"id": "L1", "reason": "idle for 60s", "cause": "idle"}],
                                        reasons=[])
        scaling_history.record_consolidation(s, "default", T0 + timedelta(seconds=99), KEEP, instance="L2",
                                             allocations=["a1"], reason="fits elsewhere", saving=0.1, unit="$/h")
        _steady(s, T0 + timedelta(seconds=120), keep=KEEP)  # another pool's history is its own
        scaling_history.record_decision(s, "other", T0, KEEP, launches=[("", "")], terminated=[], reasons=[])
    with master.read_sessions() as s:
        rows = scaling_history.recent(s, "default")
        assert [r.kind for r in rows] == ["steady", "consolidate", "terminate", "steady", "launch", "steady"]
        first = rows[-1]
        assert (first.ticks, first.at, first.until) == (30, T0, T0 + timedelta(seconds=87))
        assert first.detail["reasons"] == ["tick 29"]  # the run's last reasons
        launch = rows[-2]
        assert launch.launch == 2 and launch.detail["launches"] == [{"instanceType": "m5.large", "capacity": "spot"}] * 2
        assert rows[2].detail["terminations"] == [{"id": "L1", "reason": "idle for 60s", "cause": "idle"}]
        assert rows[1].detail["moves"]["allocations"] == ["a1"]
        assert [r.kind for r in scaling_history.recent(s, "other")] == ["launch"]
        assert len(scaling_history.recent(s, "default", limit=2)) == 2


def test_pruned_by_count_and_age(master) -> None:  # type: ignore[no-untyped-def]
    keep = Retention(timedelta(hours=1), 5)
    with transaction(master.sessions) as s:
        for i in range(12):
            scaling_history.record_decision(s, "default", T0 + timedelta(minutes=i), keep, launches=[("", "")],
                                            terminated=[], reasons=[f"launch {i}"])
    with master.read_sessions() as s:
        assert [r.detail["reasons"][0] for r in scaling_history.recent(s, "default")] == [
            f"launch {i}" for i in (11, 10, 9, 8, 7)]
    with transaction(master.sessions) as s:  # two hours later: the old rows go, the new one stays
        scaling_history.record_decision(s, "default", T0 + timedelta(hours=2), keep, launches=[("", "")],
                                        terminated=[], reasons=["late"])
    with master.read_sessions() as s:
        assert [r.detail["reasons"][0] for r in scaling_history.recent(s, "default")] == ["late"]


def test_the_api_and_the_pool_view_read_the_table(master, client) -> None:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        _steady(s, T0)
        scaling_history.record_decision(s, "default", T0 + timedelta(seconds=3), KEEP, launches=[("n2", "on-demand")],
                                        terminated=[], reasons=["1 pending slot"])
    headers = login(client)
    events = client.get("/api/v1/resource-pools/default/scaling-history", headers=headers).json()["events"]
    assert [e["kind"] for e in events] == ["launch", "steady"]
    assert events[0]["launches"] == [{"instanceType": "n2", "capacity": "on-demand"}]
    assert events[0]["at"] == "2026-11-27T12:00:03.000000Z" and events[0]["reasons"] == ["1 pending slot"]
    pool = client.get("/api/v1/resource-pools/default", headers=headers).json()["resourcePool"]
    assert pool["scalingHistory"] == events
    r = client.get("/api/v1/resource-pools/default/scaling-history", headers=headers, params={"limit": 0})
    assert r.status_code == 400 and "limit" in r.text
    assert client.get("/api/v1/resource-pools/nope/scaling-history", headers=headers).status_code == 404
    with master.read_sessions() as s:
        (view,) = [p for p in dashboard.cluster_view(s, master, T0) if p.name == "default"]
    # The default test pool has no provider: the page shows no autoscaler history for it.
    assert view.history == []
