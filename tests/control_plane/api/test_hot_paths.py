"""The hot paths (issue 13): metric reports and log batches through their fast path
(frontdoor/fastjson.py: body parsed from bytes, one worker thread, one short write, plain SQL), the
agent command long-poll's read-only re-check and the preemption check. SQLite and PostgreSQL.

What they store must be what the general path stores, bodies the fast path declines must get
FastAPI's usual answers, and the counts (stored / duplicates) must follow the idempotency rules."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from starlette.requests import Request

from control_plane.api.metrics import BatchReportRequest
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Metric, TaskLog, Trial
from control_plane.frontdoor import fastjson
from control_plane.services import agents as agent_service
from control_plane.services import metrics, trials
from control_plane.services.metrics import MetricReport
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial
from tests.control_plane.services import test_agents as agent_steps

T0 = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def wire(trial_id: int, step: int, *, group: str = "training", run: int = 1, **values: Any) -> dict[str, Any]:
    return {"group": group, "metrics": {
        "trialId": trial_id, "trialRunId": run, "stepsCompleted": step,
        "metrics": {"avgMetrics": values or {"loss": 1.0 / step}, "batchMetrics": [{"loss": step, "lr": 0.1}]},
        "reportTime": (T0 + timedelta(seconds=step)).isoformat()}}


def stored(master, trial_id: int) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        return [(m.group_name, m.steps_completed, m.trial_run_id, m.metrics, m.report_time)
                for m in s.scalars(select(Metric).where(Metric.trial_id == trial_id)
                                   .order_by(Metric.group_name, Metric.steps_completed))]


def steps_of(master, trial_id: int) -> int:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        return s.get(Trial, trial_id).steps_completed


def test_reports_on_the_fast_path_store_what_the_general_path_stores(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    fast_trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    fast, general = fast_trial.id, only_trial(master, create_ok(client, admin_headers)["experiment"]["id"]).id
    headers = allocation_headers(master, fast_trial)
    odd = {"loss": float("nan"), "big": 2**70, "text": "é\x1b\"\\", "nested": {"a": [1, None, True]}}

    def batch(trial_id: int, steps: range, run: int = 1) -> dict[str, Any]:
        return {"reports": [wire(trial_id, k, run=run, **(odd if k == 3 else {})) for k in steps]}

    def post(body: dict[str, Any]) -> dict[str, Any]:
        # NaN is not JSON: the body as Python's json module sends it (the harness's encoder)
        r = client.post(f"/api/v1/trials/{fast}/metrics/batch", headers={**headers, "content-type": "application/json"},
                        content=json.dumps(body).encode())
        assert r.status_code == 200, r.text
        return r.json()

    assert post(batch(fast, range(1, 6))) == {"stored": 5, "duplicates": 0}
    # the same reports through the general path (services/metrics.py store_reports)
    parsed = BatchReportRequest.model_validate_json(json.dumps(batch(general, range(1, 6))))
    with transaction(master.sessions) as s:
        trial, exp = metrics.lock_for_reports(s, general, {"training"})
        metrics.store_reports(s, master, trial, exp, [
            MetricReport(r.group, r.metrics.trial_id, r.metrics.trial_run_id, r.metrics.steps_completed,
                         r.metrics.metrics.avg_metrics, r.metrics.metrics.batch_metrics,
                         datetime.fromisoformat(r.metrics.report_time or "")) for r in parsed.reports])
    assert stored(master, fast) == stored(master, general)
    (row,) = [m for m in stored(master, fast) if m[1] == 3]
    assert row[3]["avg_metrics"] == {"loss": "NaN", "big": 2**70, "text": "é\x1b\"\\", "nested": {"a": [1, None, True]}}
    assert row[4] == T0 + timedelta(seconds=3) and steps_of(master, fast) == 5

    # idempotency: a retry, an older run, then a newer run replacing two steps and adding one
    assert post(batch(fast, range(1, 6))) == {"stored": 0, "duplicates": 5}
    assert post(batch(fast, range(4, 8), run=0)) == {"stored": 2, "duplicates": 2}  # 6 and 7 are new
    assert post(batch(fast, range(6, 10), run=2)) == {"stored": 4, "duplicates": 0}
    assert [(m[1], m[2]) for m in stored(master, fast)] == [(k, 1) for k in range(1, 6)] + [(k, 2) for k in range(6, 10)]
    assert steps_of(master, fast) == 9
    # a step twice in one batch (the general path): stored once
    assert post({"reports": [wire(fast, 20), wire(fast, 20)]}) == {"stored": 1, "duplicates": 1}
    # the single-report routes answer {} as Determined does
    r = client.post(f"/api/v1/trials/{fast}/metrics", headers=headers, json=wire(fast, 21))
    assert r.status_code == 200 and r.json() == {}
    r = client.post(f"/api/v1/trials/{fast}/training_metrics", headers=headers, json=wire(fast, 22)["metrics"])
    assert r.status_code == 200 and r.json() == {}
    assert steps_of(master, fast) == 22


def test_bodies_the_fast_path_declines_get_the_usual_answers(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    tid = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"]).id
    path = f"/api/v1/trials/{tid}/metrics/batch"
    good = {"reports": [wire(tid, 1)]}
    cases = [
        (b'{"reports": [', {"content-type": "application/json"}, 400, "request body is not valid JSON"),
        (json.dumps(good).encode(), {"content-type": "text/plain"}, 400, None),
        (b"", {"content-type": "application/json"}, 400, None),
        (json.dumps({"reports": []}).encode(), {}, 400, "reports"),
        (json.dumps({"reports": [wire(tid, 1, group="a.b")]}).encode(), {}, 400, "reports[0].group"),
    ]
    for body, extra, status, field in cases:
        r = client.post(path, headers={**admin_headers, **extra}, content=body)
        assert r.status_code == status, (body, r.text)
        if field:
            assert field in r.text, (field, r.text)
    assert client.post(path, json=good).status_code == 401
    assert client.post(path, headers={"Authorization": "Bearer nope"}, json=good).status_code == 401
    bob = make_user(client, admin_headers, "bob")
    assert client.post(path, headers=bob, json=good).status_code == 403
    assert client.post("/api/v1/trials/0/metrics/batch", headers=admin_headers, json=good).status_code == 400
    assert client.post("/api/v1/trials/999999/metrics/batch", headers=admin_headers,
                       json={"reports": [wire(999999, 1)]}).status_code == 404
    assert stored(master, tid) == []


def test_parse_body_declines_what_it_cannot_take_as_is() -> None:
    def request(body: bytes, content_type: str | None) -> Request:
        headers = [(b"content-type", content_type.encode())] if content_type else []
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return Request({"type": "http", "method": "POST", "headers": headers, "path": "/"}, receive)

    def parse(body: bytes, content_type: str | None) -> Any:
        return asyncio.run(fastjson.parse_body(request(body, content_type), BatchReportRequest))

    ok = b'{"reports": [{"group": "g", "metrics": {"trialId": 1, "trialRunId": 0, "stepsCompleted": 0, ' \
         b'"metrics": {"avgMetrics": {}}}}]}'
    assert parse(ok, None) is not None and parse(ok, "application/json; charset=utf-8") is not None
    for body, ctype in ((ok, "text/plain"), (b"", "application/json"), (b"{", "application/json"),
                        (ok.replace(b'"g"', b'"g", "x": 1'), "application/json")):
        assert parse(body, ctype) is None


def test_log_batches_on_the_fast_path_are_stored_as_sent(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    texts = ["plain\n", "tab\tquote\" backslash\\ é 🚀\n", "esc \x1b[31mred\x1b[0m", "nul\x00byte"]
    entries = [{"taskId": trial.task_id, "log": t, "timestamp": (T0 + timedelta(microseconds=k)).isoformat(),
                "level": "LOG_LEVEL_WARNING" if k else None, "rankId": k or None, "stdtype": "stderr" if k else None}
               for k, t in enumerate(texts)]
    r = client.post("/api/v1/task/logs", headers=allocation_headers(master, trial), json={"logs": entries})
    assert r.status_code == 200 and r.json() == {}, r.text
    with master.read_sessions() as s:
        got = [(row.log, row.timestamp, row.level, row.rank, row.stdtype, row.source)
               for row in s.scalars(select(TaskLog).where(TaskLog.task_id == trial.task_id).order_by(TaskLog.id))]
    assert got == [(t.replace("\x00", "\ufffd"), T0 + timedelta(microseconds=k), "WARNING" if k else "INFO",
                    k or None, "stderr" if k else "stdout", "task") for k, t in enumerate(texts)]
    # a bad line refuses the batch (nothing stored), naming it
    r = client.post("/api/v1/task/logs", headers=admin_headers,
                    json={"logs": [{"taskId": trial.task_id, "log": "x"}, {"taskId": trial.task_id, "log": "y",
                                                                           "level": "LOUD"}]})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "logs[1].level"
    r = client.post("/api/v1/task/logs", headers=make_user(client, admin_headers, "carol"),
                    json={"logs": [{"taskId": trial.task_id, "log": "x"}]})
    assert r.status_code == 403
    with master.read_sessions() as s:
        assert len(list(s.scalars(select(TaskLog.id).where(TaskLog.task_id == trial.task_id)))) == len(texts)


def test_progress_on_the_fast_path(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    exp = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, exp)
    own = allocation_headers(master, trial)
    r = client.post(f"/api/v1/trials/{trial.id}/progress", headers=own, json={"progress": 0.25, "isRaw": False})
    assert r.status_code == 200 and r.json() == {}, r.text
    assert progress_of(master, trial.id) == 0.25
    r = client.post(f"/api/v1/trials/{trial.id}/progress", headers=admin_headers, content=b'{"progress": 7}')
    assert r.status_code == 200 and progress_of(master, trial.id) == 1.0  # the owner (an admin) may; capped at 1
    # what the fast path declines or refuses gets the usual answers, and writes nothing
    r = client.post(f"/api/v1/trials/{trial.id}/progress", headers=own, json={"progress": -1})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "progress", r.text
    r = client.post(f"/api/v1/trials/{trial.id}/progress", headers=make_user(client, admin_headers, "dave"),
                    json={"progress": 0.5})
    assert r.status_code == 403, r.text
    r = client.post("/api/v1/trials/999999/progress", headers=admin_headers, json={"progress": 0.5})
    assert r.status_code == 404, r.text
    r = client.post(f"/api/v1/trials/{trial.id}/progress", headers={"Authorization": "Bearer nope"},
                    json={"progress": 0.5})
    assert r.status_code == 401, r.text
    assert progress_of(master, trial.id) == 1.0


def progress_of(master, trial_id: int) -> float | None:  # type: ignore[no-untyped-def]
    with master.read_sessions() as s:
        return s.get(Trial, trial_id).progress


def test_long_poll_checks(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = agent_steps.one_task(master)
    news = agent_service.has_news
    with master.read_sessions() as s:
        assert news(s, master, p, "a1", session)  # the start is owed until the agent reports it
    agent_steps.report(master, p, session, cmd.allocation_id, "running")
    with master.read_sessions() as s:
        assert not news(s, master, p, "a1", session)  # nothing to say: the poll waits without writing
        assert news(s, master, p, "a1", "an-old-session")  # a refusal is news: the write path says it
        assert trials.must_stop_by_id(s, cmd.allocation_id) is False
        assert trials.must_stop_by_id(s, "no-such-allocation") is None
    with transaction(master.sessions) as s:
        s.get(Allocation, cmd.allocation_id).preempt_requested = True  # type: ignore[union-attr]
    with master.read_sessions() as s:
        assert trials.must_stop_by_id(s, cmd.allocation_id) is True
        assert not news(s, master, p, "a1", session)  # preemption is the trial's business, not a command
    with transaction(master.sessions) as s:
        s.get(Allocation, cmd.allocation_id).kill_requested = True  # type: ignore[union-attr]
    with master.read_sessions() as s:
        assert news(s, master, p, "a1", session)
    agent_steps.report(master, p, session, cmd.allocation_id, "exited", exit_code=0)
    with master.read_sessions() as s:
        assert s.get(Allocation, cmd.allocation_id).state == st.AllocationState.TERMINATED  # type: ignore[union-attr]
        assert trials.must_stop_by_id(s, cmd.allocation_id) is True and not news(s, master, p, "a1", session)


def test_log_shipments_that_arrive_together_are_committed_together(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """frontdoor/log_batches.py: shipments queued while a batch is written go in the next one; each is
    checked on its own, so a refused one (a stranger's task, a bad level) answers only itself and
    the others are stored; each request returns only once its lines are committed."""
    from control_plane.auth import Principal, TokenKind
    from control_plane.errors import Invalid, PermissionDenied
    from control_plane.frontdoor import log_batches
    from control_plane.services import logs as log_records

    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    own = Principal(kind=TokenKind.ALLOCATION, token_id=0, allocation_id=f"{trial.task_id}.1", trial_id=trial.id)
    stranger = Principal(kind=TokenKind.USER, token_id=0, user_id=99, username="mallory")
    writer = log_batches.LogBatches(master)

    def shipment(who: Principal, text: str, level: str | None = None) -> log_records.Shipment:
        return ((lambda _s: who), [log_records.LogTarget(trial.task_id, None)],
                lambda: [log_records.LogLine(task_id=trial.task_id, log=text, level=level)])

    async def scenario() -> list[Any]:
        posts = [writer.post(shipment(own, f"line {k}")) for k in range(40)]
        posts.insert(5, writer.post(shipment(stranger, "not mine")))
        posts.insert(9, writer.post(shipment(own, "loud", level="LOUD")))
        return await asyncio.gather(*posts, return_exceptions=True)

    answers = asyncio.run(scenario())
    assert isinstance(answers[5], PermissionDenied)
    assert isinstance(answers[9], Invalid) and answers[9].details[0].field == "logs[0].level"
    assert [a for k, a in enumerate(answers) if k not in (5, 9)] == [None] * 40
    assert 1 <= writer.batches <= 3  # the first alone (the writer was idle), the rest together
    with master.read_sessions() as s:
        stored = sorted(s.scalars(select(TaskLog.log).where(TaskLog.task_id == trial.task_id)))
    assert stored == sorted(f"line {k}" for k in range(40))


def test_a_shipment_the_database_refuses_fails_alone(client, admin_headers, master, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from control_plane.auth import Principal, TokenKind
    from control_plane.frontdoor import log_batches
    from control_plane.services import logs as log_records

    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    admin = Principal(kind=TokenKind.USER, token_id=0, user_id=1, username="admin", admin=True)
    real_insert = log_records._insert

    def picky_insert(conn, rows):  # type: ignore[no-untyped-def]
        if any(row[-1] == "poison" for row in rows):
            raise RuntimeError("the database refuses this batch")
        return real_insert(conn, rows)

    monkeypatch.setattr(log_records, "_insert", picky_insert)
    writer = log_batches.LogBatches(master)

    def shipment(text: str) -> log_records.Shipment:
        return ((lambda _s: admin), [log_records.LogTarget(trial.task_id, None)],
                lambda: [log_records.LogLine(task_id=trial.task_id, log=text)])

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(writer.post(shipment(t)) for t in ["a", "b", "poison", "c"]),
                                    return_exceptions=True)

    answers = asyncio.run(scenario())
    assert answers[0] is None and answers[1] is None and answers[3] is None
    assert isinstance(answers[2], RuntimeError)
    with master.read_sessions() as s:
        assert sorted(s.scalars(select(TaskLog.log).where(TaskLog.task_id == trial.task_id))) == ["a", "b", "c"]


def test_single_reports_that_arrive_together_are_committed_together(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """frontdoor/metric_batches.py: single reports queued while a batch is written go in the next one, a
    trial's reports by one upsert; each request is checked on its own (a stranger, another trial's
    token, a body naming another trial, an unknown trial answer only themselves); a step sent twice
    is stored once; each request returns only once its report is committed."""
    from control_plane.auth import Principal, TokenKind
    from control_plane.errors import Invalid, NotFound, PermissionDenied
    from control_plane.frontdoor import metric_batches
    from control_plane.services.metrics import MetricReport as Report

    a = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    b = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    own_a = Principal(kind=TokenKind.ALLOCATION, token_id=0, allocation_id=f"{a.task_id}.1", trial_id=a.id)
    own_b = Principal(kind=TokenKind.ALLOCATION, token_id=0, allocation_id=f"{b.task_id}.1", trial_id=b.id)
    stranger = Principal(kind=TokenKind.USER, token_id=0, user_id=99, username="mallory")
    admin = Principal(kind=TokenKind.USER, token_id=0, user_id=1, username="admin", admin=True)
    writer = metric_batches.MetricBatches(master)

    def report(who: Principal, path_trial: int, step: int, body_trial: int | None = None) -> metrics.Report:
        def caller(_s: Any) -> Principal:
            return who

        return (path_trial, caller, lambda: [Report("training", body_trial or path_trial, 1, step, {"loss": 1.0 / step},
                                                    None, T0 + timedelta(seconds=step))])

    async def scenario() -> list[Any]:
        posts = [writer.post(report(own_a if k % 2 else own_b, a.id if k % 2 else b.id, k)) for k in range(1, 41)]
        posts.insert(3, writer.post(report(stranger, a.id, 100)))  # no right to a
        posts.insert(7, writer.post(report(own_b, a.id, 101)))  # b's token for a
        posts.insert(11, writer.post(report(own_a, a.id, 102, body_trial=b.id)))  # the body names b
        posts.insert(15, writer.post(report(admin, 999999, 1)))  # no such trial
        posts.append(writer.post(report(own_a, a.id, 39)))  # step 39 again
        return await asyncio.gather(*posts, return_exceptions=True)

    answers = asyncio.run(scenario())
    assert isinstance(answers[3], PermissionDenied) and isinstance(answers[7], PermissionDenied)
    assert isinstance(answers[11], Invalid) and isinstance(answers[15], NotFound)
    assert [x for k, x in enumerate(answers) if k not in (3, 7, 11, 15)] == [None] * 41
    assert 1 <= writer.batches <= 3  # the first alone (the writer was idle), the rest together
    assert [m[1] for m in stored(master, a.id)] == list(range(1, 41, 2))
    assert [m[1] for m in stored(master, b.id)] == list(range(2, 41, 2))
    assert steps_of(master, a.id) == 39 and steps_of(master, b.id) == 40


def test_a_report_the_database_refuses_fails_alone(client, admin_headers, master, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from control_plane.auth import Principal, TokenKind
    from control_plane.frontdoor import metric_batches
    from control_plane.services.metrics import MetricReport as Report

    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    admin = Principal(kind=TokenKind.USER, token_id=0, user_id=1, username="admin", admin=True)
    real_upsert = metrics._upsert

    def picky_upsert(conn, trial_id, docs):  # type: ignore[no-untyped-def]
        if any(d.report.steps_completed == 13 for d in docs):
            raise RuntimeError("the database refuses this batch")
        return real_upsert(conn, trial_id, docs)

    monkeypatch.setattr(metrics, "_upsert", picky_upsert)
    writer = metric_batches.MetricBatches(master)

    def report(step: int) -> metrics.Report:
        return (trial.id, lambda _s: admin, lambda: [Report("training", trial.id, 1, step, {"loss": 0.5}, None, T0)])

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(writer.post(report(k)) for k in (1, 2, 13, 4)), return_exceptions=True)

    answers = asyncio.run(scenario())
    assert answers[0] is None and answers[1] is None and answers[3] is None
    assert isinstance(answers[2], RuntimeError)
    assert [m[1] for m in stored(master, trial.id)] == [1, 2, 4]


def test_a_single_report_over_http_is_committed_when_answered_and_a_validation_goes_on_its_own(  # type: ignore[no-untyped-def]
        client, admin_headers, master) -> None:
    from control_plane.frontdoor import metric_batches

    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    headers = allocation_headers(master, trial)
    writer = metric_batches.of(master)
    before = writer.batches
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers=headers, json=wire(trial.id, 5))
    assert r.status_code == 200 and r.json() == {}
    assert writer.batches == before + 1 and [m[1] for m in stored(master, trial.id)] == [5]
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers=headers,
                    json={"group": "validation", "metrics": {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 5,
                                                             "metrics": {"avgMetrics": {"loss": 0.25}}}})
    assert r.status_code == 200 and writer.batches == before + 1  # not through the writer
    assert [(m[0], m[1]) for m in stored(master, trial.id)] == [("training", 5), ("validation", 5)]
    # a refusal through the writer is the usual HTTP answer
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers=headers, json=wire(trial.id + 1, 6))
    assert r.status_code == 400 and "trialId" in r.text


def test_a_report_that_does_not_move_the_step_count_does_not_wait_for_the_trials_row(  # type: ignore[no-untyped-def]
        client, admin_headers, master, db_url) -> None:
    """PostgreSQL: while another transaction holds the trial's row (its progress being written),
    a batch of steps below the trial's count is stored at once; one beyond it waits for that
    transaction, then raises the count. A deleted trial's report is 404 either way."""
    import threading

    import pytest
    from sqlalchemy import text

    from control_plane.auth import Principal, TokenKind

    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    admin = Principal(kind=TokenKind.USER, token_id=0, user_id=1, username="admin", admin=True)

    def send(steps: int) -> int:
        return metrics.report(master, trial.id, lambda _s: admin, lambda: [
            MetricReport("training", trial.id, 0, steps, {"loss": 1.0})])

    send(100)
    if db_url.startswith("postgresql"):  # SQLite has one writer at a time: no row lock to wait for
        holder = master.engine.connect()
        tx = holder.begin()
        holder.execute(text("UPDATE trials SET progress = 0.5 WHERE id = :id"), {"id": trial.id})
        try:
            below = threading.Thread(target=send, args=(50,), daemon=True)
            below.start()
            below.join(10)
            assert not below.is_alive()  # it would wait for the row if every report locked it
            beyond = threading.Thread(target=send, args=(200,), daemon=True)
            beyond.start()
            beyond.join(0.5)
            assert beyond.is_alive()  # raising the count waits for the row
        finally:
            tx.commit()
            holder.close()
        beyond.join(30)
        assert not beyond.is_alive()
    else:
        assert send(50) == 1 and send(200) == 1
    with master.read_sessions() as s:
        assert s.get(Trial, trial.id).steps_completed == 200
        assert sorted(s.scalars(select(Metric.steps_completed).where(Metric.trial_id == trial.id))) == [50, 100, 200]
    with transaction(master.sessions) as s:
        s.execute(text("DELETE FROM metrics WHERE trial_id = :id"), {"id": trial.id})
        s.execute(text("DELETE FROM trials WHERE id = :id"), {"id": trial.id})
    from control_plane.errors import NotFound

    with pytest.raises(NotFound):
        send(10)
