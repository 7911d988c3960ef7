"""Trials, metric reports and queries, task logs (ingest, filters, follow). SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from control_plane import auth
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Metric, TaskLog, Trial
from tests.control_plane.api.test_experiments import (
    CONFIG,
    allocation_headers,
    create_ok,
    make_user,
    only_trial,
)

RANDOM_CONFIG = """
entrypoint: python3 train.py
hyperparameters:
  lr: {type: double, minval: 0.01, maxval: 0.1}
searcher:
  name: random
  metric: val_loss
  max_trials: 3
  max_length: {batches: 1000}
"""


def report(trial_id: int, steps: int, metrics: dict[str, Any], group: str = "training", run: int = 1,
           **extra: Any) -> dict[str, Any]:
    return {"group": group, "metrics": {"trialId": trial_id, "trialRunId": run, "stepsCompleted": steps,
                                        "metrics": {"avgMetrics": metrics, **extra}}}


def post(client, headers, trial_id: int, body: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    r = client.post(f"/api/v1/trials/{trial_id}/metrics", headers=headers, json=body)
    assert r.status_code == 200, r.text


def rows(master, trial_id: int) -> list[tuple[str, int, int, dict[str, Any]]]:  # type: ignore[no-untyped-def]
    with master.sessions() as s:
        return [(m.group_name, m.steps_completed, m.trial_run_id, m.metrics)
                for m in s.scalars(select(Metric).where(Metric.trial_id == trial_id)
                                   .order_by(Metric.group_name, Metric.steps_completed))]


def set_trial_state(master, trial_id: int, state: str) -> None:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        s.get(Trial, trial_id).state = state


# -- metric reports --------------------------------------------------------------------------------
def test_metrics_idempotent_and_run_replacement(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial, user_id=1)  # bound to the owner, as the pools issue them

    post(client, token, trial.id, report(trial.id, 10, {"loss": 1.0}, batchMetrics=[{"loss": 1.1}]))
    post(client, token, trial.id, report(trial.id, 10, {"loss": 9.9}))  # retry of the same run: no-op
    assert rows(master, trial.id) == [("training", 10, 1, {"avg_metrics": {"loss": 1.0},
                                                            "batch_metrics": [{"loss": 1.1}]})]
    post(client, token, trial.id, report(trial.id, 10, {"loss": 2.0}, run=2))  # a restarted run replaces it
    post(client, token, trial.id, report(trial.id, 10, {"loss": 3.0}, run=1))  # an older run is ignored
    assert rows(master, trial.id) == [("training", 10, 2, {"avg_metrics": {"loss": 2.0}})]

    # validations: latest and best (smaller is better) follow the reports, also after a replacement
    for steps, loss in [(10, 0.5), (20, 0.3), (30, 0.4)]:
        post(client, token, trial.id, report(trial.id, steps, {"val_loss": loss}, group="validation"))
    t = client.get(f"/api/v1/trials/{trial.id}", headers=admin_headers).json()["trial"]
    assert t["totalBatchesProcessed"] == 30 and t["searcherMetricValue"] == 0.3
    assert t["bestValidation"]["totalBatches"] == 20 and t["bestValidation"]["metrics"]["avgMetrics"] == {"val_loss": 0.3}
    assert t["latestValidation"]["totalBatches"] == 30
    post(client, token, trial.id, report(trial.id, 20, {"val_loss": 0.9}, group="validation", run=2))
    t = client.get(f"/api/v1/trials/{trial.id}", headers=admin_headers).json()["trial"]
    assert t["searcherMetricValue"] == 0.4 and t["bestValidation"]["totalBatches"] == 30
    exp = client.get(f"/api/v1/experiments/{eid}", headers=admin_headers).json()["experiment"]
    assert exp["bestTrialSearcherMetric"] == 0.4 and exp["bestTrialId"] == trial.id

    # the legacy endpoints and the batch endpoint store into the same series
    r = client.post(f"/api/v1/trials/{trial.id}/validation_metrics", headers=token,
                    json={"trialId": trial.id, "trialRunId": 2, "stepsCompleted": 40,
                          "metrics": {"avgMetrics": {"val_loss": 0.2}}})
    assert r.status_code == 200, r.text
    r = client.post(f"/api/v1/trials/{trial.id}/metrics/batch", headers=token, json={"reports": [
        report(trial.id, 50, {"loss": 0.1}, run=2), report(trial.id, 60, {"loss": 0.05}, run=2),
        report(trial.id, 10, {"loss": 2.0}, run=2)]})
    assert r.status_code == 200 and r.json() == {"stored": 2, "duplicates": 1}
    assert client.get(f"/api/v1/trials/{trial.id}", headers=admin_headers).json()["trial"]["searcherMetricValue"] == 0.2
    assert [(g, s) for g, s, _, _ in rows(master, trial.id)] == [
        ("training", 10), ("training", 50), ("training", 60),
        ("validation", 10), ("validation", 20), ("validation", 30), ("validation", 40)]


def test_metric_reports_refused(client, admin_headers, master) -> None:
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    e1 = create_ok(client, alice)["experiment"]["id"]
    e2 = create_ok(client, alice)["experiment"]["id"]
    t1, t2 = only_trial(master, e1), only_trial(master, e2)
    token1 = allocation_headers(master, t1)
    body = report(t1.id, 5, {"loss": 1.0})

    assert client.post(f"/api/v1/trials/{t1.id}/metrics", json=body).status_code == 401
    # an allocation token of another trial, another user, an agent token
    assert client.post(f"/api/v1/trials/{t2.id}/metrics", headers=token1,
                       json=report(t2.id, 5, {"loss": 1.0})).status_code == 403
    assert client.post(f"/api/v1/trials/{t1.id}/metrics", headers=bob, json=body).status_code == 403
    with transaction(master.sessions) as s:
        agent_token = auth.issue_token(s, auth.TokenKind.AGENT, now=master.clock(), ttl=None, pool="default")
    assert client.post(f"/api/v1/trials/{t1.id}/metrics", headers={"Authorization": f"Bearer {agent_token}"},
                       json=body).status_code == 403
    # trial id in the body must match the path
    r = client.post(f"/api/v1/trials/{t1.id}/metrics", headers=alice, json=report(t2.id, 5, {"loss": 1.0}))
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "metrics.trialId"
    bad_bodies = [
        (report(t1.id, -1, {"loss": 1.0}), "metrics.stepsCompleted"),
        (report(t1.id, 5, {"loss": 1.0}, group="a.b"), "group"),
        (report(t1.id, 5, {"loss": 1.0}, group=""), "group"),
        ({"group": "training", "metrics": {"trialId": t1.id, "trialRunId": 1, "stepsCompleted": 5,
                                           "metrics": {"avgMetrics": [1, 2]}}}, "metrics.metrics.avgMetrics"),
        ({**report(t1.id, 5, {"loss": 1.0}), "extra": 1}, "extra"),
        ({"group": "training", "metrics": {"trialId": t1.id, "trialRunId": 1, "stepsCompleted": 5,
                                           "metrics": {"avgMetrics": {}}, "reportTime": "yesterday"}},
         "metrics.reportTime"),
    ]
    for bad, field in bad_bodies:
        r = client.post(f"/api/v1/trials/{t1.id}/metrics", headers=token1, json=bad)
        assert r.status_code == 400, (bad, r.text)
        assert field in [d["field"] for d in r.json()["details"]], (field, r.json())
    # a batch with one bad report stores nothing
    r = client.post(f"/api/v1/trials/{t1.id}/metrics/batch", headers=token1, json={"reports": [
        report(t1.id, 1, {"loss": 1.0}), report(t2.id, 2, {"loss": 1.0})]})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "reports[1].metrics.trialId"
    assert client.post("/api/v1/trials/99999/metrics", headers=alice, json=report(99999, 1, {})).status_code == 404
    assert rows(master, t1.id) == []
    # the owner (and an admin) may report too
    post(client, alice, t1.id, body)
    post(client, admin_headers, t1.id, report(t1.id, 6, {"loss": 1.0}))
    assert len(rows(master, t1.id)) == 2


def test_non_finite_metrics(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    # JSON's non-standard literals, as Python's json module writes them...
    raw = json.dumps(report(trial.id, 10, {"val_loss": float("nan"), "x": float("inf"), "y": float("-inf")},
                            group="validation"))
    assert "NaN" in raw and "-Infinity" in raw
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers={**token, "content-type": "application/json"},
                    content=raw.encode())
    assert r.status_code == 200, r.text
    # ...and the strings Determined's client sends
    post(client, token, trial.id, report(trial.id, 20, {"val_loss": "Infinity"}, group="validation"))
    got = client.get(f"/api/v1/trials/{trial.id}/metrics", headers=token, params={"group": "validation"}).json()
    assert [m["metrics"] for m in got["metrics"]] == [
        {"val_loss": "NaN", "x": "Infinity", "y": "-Infinity"}, {"val_loss": "Infinity"}]
    t = client.get(f"/api/v1/trials/{trial.id}", headers=token).json()["trial"]
    assert t["searcherMetricValue"] == "Infinity"  # NaN is never "best"; +inf is a (bad) number
    assert t["latestValidation"]["metrics"]["avgMetrics"] == {"val_loss": "Infinity"}


def test_metric_queries(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    r = client.post(f"/api/v1/trials/{trial.id}/metrics/batch", headers=token, json={"reports": [
        report(trial.id, s, {"loss": 1.0 / s}) for s in range(1, 31)]})
    assert r.status_code == 200, r.text
    post(client, token, trial.id, report(trial.id, 10, {"val_loss": 0.7}, group="validation"))

    got = client.get(f"/api/v1/trials/{trial.id}/metrics", headers=token,
                     params={"group": "training", "startStep": 10, "endStep": 19}).json()
    assert [m["stepsCompleted"] for m in got["metrics"]] == list(range(10, 20))
    assert got["pagination"]["total"] == 10
    paged = client.get(f"/api/v1/trials/{trial.id}/metrics", headers=token,
                       params={"group": "training", "offset": 5, "limit": 3}).json()
    assert [m["stepsCompleted"] for m in paged["metrics"]] == [6, 7, 8]
    assert paged["metrics"][0]["metrics"] == {"loss": 1.0 / 6} and paged["metrics"][0]["trialRunId"] == 1
    everything = client.get(f"/api/v1/trials/{trial.id}/metrics", headers=token).json()
    assert everything["pagination"]["total"] == 31

    # Determined's streaming GetMetrics: NDJSON lines of {"result": {"metrics": [v1MetricsReport]}}
    r = client.get("/api/v1/trials/metrics/trial_metrics", headers=admin_headers,
                   params={"trialIds": [trial.id], "group": "training", "startBatches": 25})
    assert r.status_code == 200
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    reports = [m for line in lines for m in line["result"]["metrics"]]
    assert [m["totalBatches"] for m in reports] == [25, 26, 27, 28, 29, 30]
    first = reports[0]
    assert set(first) >= {"archived", "endTime", "group", "id", "metrics", "totalBatches", "trialId", "trialRunId"}
    assert first["metrics"]["avg_metrics"] == {"loss": 1.0 / 25} and first["group"] == "training"
    r = client.get("/api/v1/trials/metrics/validation_metrics", headers=admin_headers, params={"trialIds": trial.id})
    val = [m for x in r.text.splitlines() for m in json.loads(x)["result"]["metrics"]]
    assert [m["metrics"] for m in val] == [{"validation_metrics": {"val_loss": 0.7}}]

    for params, status in [({"group": "training"}, 400), ({"trialIds": [trial.id, trial.id], "group": "training"}, 400),
                           ({"trialIds": 999999, "group": "training"}, 404), ({"trialIds": trial.id}, 400)]:
        assert client.get("/api/v1/trials/metrics/trial_metrics", headers=admin_headers,
                          params=params).status_code == status, params
    other = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    assert client.get("/api/v1/trials/metrics/trial_metrics", headers=token,
                      params={"trialIds": other.id, "group": "training"}).status_code == 403
    assert client.get(f"/api/v1/trials/{other.id}/metrics", headers=token).status_code == 403


def test_trial_list_sorting(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers, RANDOM_CONFIG)["experiment"]["id"]
    trials = client.get(f"/api/v1/experiments/{eid}/trials", headers=admin_headers).json()["trials"]
    assert len(trials) == 3
    ids = [t["id"] for t in trials]
    for tid, loss in zip(ids, [0.5, 0.2, 0.9], strict=True):
        post(client, admin_headers, tid, report(tid, 10, {"val_loss": loss}, group="validation"))
    set_trial_state(master, ids[2], st.TrialState.COMPLETED)

    def listed(**params: Any) -> list[int]:
        r = client.get(f"/api/v1/experiments/{eid}/trials", headers=admin_headers, params=params)
        assert r.status_code == 200, r.text
        return [t["id"] for t in r.json()["trials"]]

    assert listed(sortBy="SORT_BY_BEST_VALIDATION_METRIC") == [ids[1], ids[0], ids[2]]
    assert listed(sortBy="SORT_BY_BEST_VALIDATION_METRIC", orderBy="ORDER_BY_DESC") == [ids[2], ids[0], ids[1]]
    assert listed(orderBy="ORDER_BY_DESC", limit=2) == [ids[2], ids[1]]
    assert listed(offset=1) == [ids[1], ids[2]]
    assert listed(states="STATE_COMPLETED") == [ids[2]]
    assert listed(states="STATE_ACTIVE") == [ids[0], ids[1]]  # the active sub-states (queued) count
    assert client.get(f"/api/v1/experiments/{eid}/trials", headers=admin_headers,
                      params={"sortBy": "SORT_BY_MOOD"}).status_code == 400


# -- logs ------------------------------------------------------------------------------------------
def _log_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(x)["result"] for x in text.splitlines() if x.strip()]


def test_post_logs_auth_and_sanitising(client, admin_headers, master) -> None:
    alice = make_user(client, admin_headers, "alice")
    eid = create_ok(client, alice)["experiment"]["id"]
    trial = only_trial(master, eid)
    other = only_trial(master, create_ok(client, alice)["experiment"]["id"])
    token = allocation_headers(master, trial)
    with transaction(master.sessions) as s:
        alloc = s.scalar(select(Allocation).where(Allocation.trial_id == trial.id))
        alloc.agent_id = "agent-1"
        alloc_id = alloc.id
        agent_tokens = {
            name: auth.issue_token(s, auth.TokenKind.AGENT, now=master.clock(), ttl=None, pool=pool, agent_id=agent)
            for name, pool, agent in [("pool", "default", None), ("agent", "default", "agent-1"),
                                      ("wrong-agent", "default", "agent-2"), ("wrong-pool", "gpu", None)]
        }

    def send(headers: dict[str, str], logs: list[dict[str, Any]]) -> int:
        # json.dumps escapes lone surrogates as \udcff, as a client that decoded bytes loosely would
        body = json.dumps({"logs": logs}).encode()
        return client.post("/api/v1/task/logs", headers={**headers, "content-type": "application/json"},
                           content=body).status_code

    line = {"taskId": trial.task_id, "allocationId": alloc_id, "agentId": "agent-1", "log": "ok\n",
            "timestamp": "2024-05-01T10:00:00.123456789Z", "level": "LOG_LEVEL_WARNING", "stdtype": "stderr",
            "rankId": 0}
    assert send({}, [line]) == 401
    assert send(token, [line]) == 200
    assert send(admin_headers, [line]) == 200
    assert send({"Authorization": f"Bearer {agent_tokens['pool']}"}, [line]) == 200
    assert send({"Authorization": f"Bearer {agent_tokens['agent']}"}, [line]) == 200
    assert send({"Authorization": f"Bearer {agent_tokens['wrong-agent']}"}, [line]) == 403
    assert send({"Authorization": f"Bearer {agent_tokens['wrong-pool']}"}, [line]) == 403
    assert send(alice, [line]) == 403  # a non-admin user
    assert send(token, [{**line, "taskId": other.task_id, "allocationId": None}]) == 403  # another task
    assert send(token, [{**line, "taskId": "no-such-task"}]) == 404
    assert send(token, [{**line, "level": "LOG_LEVEL_LOUD"}]) == 400
    assert send(token, [{**line, "bogus": 1}]) == 400
    assert send(token, [{**line, "taskId": "a\x00b"}]) == 400  # PostgreSQL cannot even be asked

    long_line = "x" * (200 * 1024) + "\n"
    garbage = b"bin\x00\xff\xfe\x80 data\n".decode("utf-8", "replace")
    assert send(token, [{"taskId": trial.task_id, "log": long_line}, {"taskId": trial.task_id, "log": garbage},
                        {"taskId": trial.task_id, "log": "nul\x00 and \udcff surrogate\n"}]) == 200
    with master.sessions() as s:
        stored = [r.log for r in s.scalars(select(TaskLog).where(TaskLog.task_id == trial.task_id).order_by(TaskLog.id))]
    assert len(stored) == 7
    assert stored[4].startswith("x" * 1000) and "line truncated" in stored[4] and len(stored[4]) < 70 * 1024
    assert stored[4].endswith("\n")
    assert stored[5] == garbage.replace("\x00", "\ufffd") == "bin\ufffd\ufffd\ufffd\ufffd data\n"
    assert stored[6] == "nul\ufffd and \ufffd surrogate\n"

    r = client.get(f"/api/v1/trials/{trial.id}/logs", headers=alice)
    assert r.status_code == 200
    got = _log_lines(r.text)
    assert len(got) == 7
    first = got[0]
    assert set(first) >= {"id", "level", "message", "timestamp", "trialId"}
    assert first["level"] == "LOG_LEVEL_WARNING" and first["log"] == "ok\n" and first["stdtype"] == "stderr"
    assert first["timestamp"] == "2024-05-01T10:00:00.123456Z" and first["rankId"] == 0
    assert first["message"].startswith("[2024-05-01T10:00:00.123456Z]") and first["message"].endswith("|| WARNING: ok\n")
    assert client.get(f"/api/v1/trials/{other.id}/logs", headers=token).status_code == 403


def test_log_filters_and_tail(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    logs = [{"taskId": trial.task_id, "log": f"line {i}\n", "level": "LOG_LEVEL_ERROR" if i % 3 == 0 else "LOG_LEVEL_INFO",
             "stdtype": "stderr" if i % 2 else "stdout", "timestamp": f"2024-05-01T10:00:{i:02d}Z"} for i in range(12)]
    assert client.post("/api/v1/task/logs", headers=token, json={"logs": logs}).status_code == 200

    def get(**params: Any) -> list[str]:
        r = client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers, params=params)
        assert r.status_code == 200, r.text
        return [x["log"].strip() for x in _log_lines(r.text)]

    assert get(limit=3) == ["line 0", "line 1", "line 2"]
    assert get(limit=3, orderBy="ORDER_BY_DESC") == ["line 11", "line 10", "line 9"]  # tail (client reverses)
    assert get(levels=["LOG_LEVEL_ERROR"]) == ["line 0", "line 3", "line 6", "line 9"]
    assert get(stdtypes="stderr", levels="LOG_LEVEL_ERROR") == ["line 3", "line 9"]
    assert get(searchText="line 1") == ["line 1", "line 10", "line 11"]
    assert get(searchText=r"line [25]$", enableRegex="true") == ["line 2", "line 5"]
    assert get(timestampAfter="2024-05-01T10:00:09Z") == ["line 10", "line 11"]
    r = client.get(f"/api/v1/tasks/{trial.task_id}/logs", headers=admin_headers, params={"limit": 2})
    assert [(x["taskId"], x["log"]) for x in _log_lines(r.text)] == [(trial.task_id, "line 0\n"), (trial.task_id, "line 1\n")]
    assert client.get("/api/v1/tasks/nope/logs", headers=admin_headers).status_code == 404
    assert client.get("/api/v1/tasks/a%00b/logs", headers=admin_headers).status_code == 400
    assert client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers,
                      params={"searchText": "x\x00"}).status_code == 400
    assert client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers,
                      params={"follow": "true", "orderBy": "ORDER_BY_DESC"}).status_code == 400
    assert client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers,
                      params={"searchText": "(", "enableRegex": "true"}).status_code == 400


def test_log_follow_until_trial_ends(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    assert client.post("/api/v1/task/logs", headers=token,
                       json={"logs": [{"taskId": trial.task_id, "log": "before\n"}]}).status_code == 200
    errors: list[str] = []

    def writer() -> None:
        try:
            time.sleep(0.3)  # let the follower reach its polling loop (correctness does not depend on it)
            for i in range(3):
                r = client.post("/api/v1/task/logs", headers=token,
                                json={"logs": [{"taskId": trial.task_id, "log": f"during {i}\n"}]})
                if r.status_code != 200:
                    errors.append(r.text)
            set_trial_state(master, trial.id, st.TrialState.COMPLETED)
        except Exception as e:  # surfaced by the assertion below
            errors.append(repr(e))

    thread = threading.Thread(target=writer)
    thread.start()
    r = client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers, params={"follow": "true"})
    thread.join()
    assert errors == []
    assert r.status_code == 200
    assert [x["log"] for x in _log_lines(r.text)] == ["before\n", "during 0\n", "during 1\n", "during 2\n"]
    # the task endpoint ends the same way once the trial is over
    r = client.get(f"/api/v1/tasks/{trial.task_id}/logs", headers=admin_headers, params={"follow": "true"})
    assert len(_log_lines(r.text)) == 4
    # and an allocation token can follow its own trial
    assert len(_log_lines(client.get(f"/api/v1/trials/{trial.id}/logs", headers=token,
                                     params={"follow": "true"}).text)) == 4


def test_expired_allocation_token_is_refused(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    with transaction(master.sessions) as s:
        token = auth.issue_token(s, auth.TokenKind.ALLOCATION, now=master.clock() - timedelta(hours=2),
                                 ttl=timedelta(hours=1), trial_id=trial.id)
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers={"Authorization": f"Bearer {token}"},
                    json=report(trial.id, 1, {"loss": 1.0}))
    assert r.status_code == 401
    assert CONFIG  # the shared config is what created this experiment
