"""The express lane (frontdoor/express.py): the hot report routes answered by their fast path from the
front door; whatever the fast path declines goes to the whole application with its body intact.
SQLite and PostgreSQL."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from control_plane.db.models import Metric
from control_plane.frontdoor.express import ExpressLane, replay_body
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, only_trial


class Recorder:
    """The "whole application" behind the lane: records what reaches it and answers through the
    real app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        self.bodies.append(body)
        await self.app(scope, replay_body(body, receive), send)


def test_reports_take_the_lane_and_what_it_declines_reaches_the_app_whole(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    app = client.app
    behind = Recorder(partial(FastAPI.__call__, app))  # the app past its front door, as api/app.py wires it
    lane = ExpressLane(app, behind, master.config)
    assert {r.path for r, _ in lane.routes} >= {"/api/v1/trials/{trialId}/metrics/batch", "/api/v1/task/logs",
                                                "/api/v1/trials/{trialId}/progress"}
    headers = allocation_headers(master, trial)
    report = {"group": "training", "metrics": {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 10,
                                               "metrics": {"avgMetrics": {"loss": 0.5}}}}
    with TestClient(lane) as c:
        r = c.post(f"/api/v1/trials/{trial.id}/metrics", headers=headers, json=report)
        assert r.status_code == 200 and r.json() == {}, r.text
        r = c.post(f"/api/v1/trials/{trial.id}/progress", headers=headers, json={"progress": 0.5})
        assert r.status_code == 200, r.text
        assert behind.bodies == []  # both answered by the lane alone
        # a refusal from the fast path keeps the API's error shape
        r = c.post(f"/api/v1/trials/{trial.id + 1}/metrics", headers=headers, json=report)
        assert r.status_code == 403 and "another trial" in r.json()["message"], r.text
        r = c.post("/api/v1/trials/999999/progress", headers=admin_headers, json={"progress": 0.5})
        assert r.status_code == 404 and r.json()["code"] == 404, r.text
        assert behind.bodies == []
        # declined (not JSON of the model): the app answers, with the very bytes the client sent
        bad = b'{"group": "training", "metrics": {"trialId": "x"}}'
        r = c.post(f"/api/v1/trials/{trial.id}/metrics", headers={**headers, "content-type": "application/json"},
                   content=bad)
        assert r.status_code == 400 and r.json()["details"], r.text
        assert behind.bodies == [bad]
        # no Content-Length (chunked): the app's path, which enforces the body limit as it reads
        r = c.post(f"/api/v1/trials/{trial.id}/metrics", headers={**headers, "content-type": "application/json"},
                   content=iter([b'{"group": "training", ', b'"metrics": {"trialId": 1}}']))
        assert r.status_code == 400 and len(behind.bodies) == 2
        # other routes are not the lane's
        r = c.get("/api/v1/experiments", headers=admin_headers)
        assert r.status_code == 200 and len(behind.bodies) == 3
    with master.read_sessions() as s:
        assert s.scalar(select(func.count()).select_from(Metric).where(Metric.trial_id == trial.id)) == 1
