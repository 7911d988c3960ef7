"""Input hardening (issue 27): whatever a JSON body holds — NUL and control characters, lone
surrogates, nesting hundreds deep, numbers past any column, loose booleans — the answer is a 4xx
naming the field, never a 5xx. The checks live in one place, the request models' base
(shipyard_common/wire_model.py `StrictWire`). SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from control_plane.db.models import Experiment, Metric, Token, Trial, User
from shipyard_common.wire_model import MAX_JSON_DEPTH
from tests.conftest import ADMIN_PASSWORD
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import CONFIG, allocation_headers, create_ok, only_trial, v1file
from tests.control_plane.api.test_hot_paths import wire


@dataclass
class Cluster:
    admin: dict[str, str]
    trial: Trial
    token: dict[str, str]  # the trial's allocation token
    ckpt: str
    bob_id: int
    job_id: str


@pytest.fixture
def cluster(client, admin_headers, master) -> Cluster:  # type: ignore[no-untyped-def]
    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    token = allocation_headers(master, trial)
    ckpt = report_ckpt(client, token, ckpt_body(trial, 10))
    r = client.post("/api/v1/users", headers=admin_headers, json={"user": {"username": "bob"}, "password": "bob-password-1"})
    assert r.status_code == 200, r.text
    with master.read_sessions() as s:
        job_id = s.get(Experiment, trial.experiment_id).job_id
    return Cluster(admin_headers, trial, token, ckpt, r.json()["user"]["id"], job_id)


def _json(client, method: str, path: str, headers: dict[str, str], body: Any):  # type: ignore[no-untyped-def]
    """`body` as Python's json module writes it (NaN and ±Infinity as its literals)."""
    return client.request(method, path, headers={**headers, "content-type": "application/json"},
                          content=json.dumps(body).encode())


def _refused(r, field: str) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == 400, r.text
    assert [d["field"] for d in r.json()["details"]] == [field], r.json()


# -- the property: no body makes a 5xx -------------------------------------------------------------
Route = Callable[[Cluster], tuple[str, str, dict[str, str], dict[str, Any]]]


def _report(c: Cluster) -> dict[str, Any]:
    return wire(c.trial.id, 5, nested={"a": [1, "x"]})


ROUTES: dict[str, Route] = {
    "login": lambda c: ("POST", "/api/v1/auth/login", {}, {"username": "admin", "password": ADMIN_PASSWORD}),
    "create user": lambda c: ("POST", "/api/v1/users", c.admin, {
        "user": {"username": "carol", "admin": False, "active": True, "displayName": "Carol"},
        "password": "carol-password-1", "isHashed": False}),
    "patch user": lambda c: ("PATCH", f"/api/v1/users/{c.bob_id}", c.admin, {"displayName": "Bob", "active": True}),
    "metrics": lambda c: ("POST", f"/api/v1/trials/{c.trial.id}/metrics", c.token, _report(c)),
    "metrics batch": lambda c: ("POST", f"/api/v1/trials/{c.trial.id}/metrics/batch", c.token,
                                {"reports": [_report(c)]}),
    "training_metrics": lambda c: ("POST", f"/api/v1/trials/{c.trial.id}/training_metrics", c.token,
                                   _report(c)["metrics"]),
    "checkpoint": lambda c: ("POST", "/api/v1/checkpoints", c.token, ckpt_body(c.trial, 20)),
    "checkpoint metadata": lambda c: ("POST", f"/api/v1/checkpoints/{c.ckpt}/metadata", c.admin,
                                      {"checkpoint": {"uuid": c.ckpt, "metadata": {"a": {"b": [1, 2.5]}}}}),
    "create model": lambda c: ("POST", "/api/v1/models", c.admin, {
        "name": "m1", "description": "d", "metadata": {"k": {"v": [1, "x"]}}, "labels": ["l"], "notes": "n"}),
    "agent token": lambda c: ("POST", "/api/v1/agents/tokens", c.admin,
                              {"resourcePool": "default", "agentId": "agent-1", "ttlHours": 1.5}),
    "progress": lambda c: ("POST", f"/api/v1/trials/{c.trial.id}/progress", c.token, {"progress": 0.5, "isRaw": False}),
    "create experiment": lambda c: ("POST", "/api/v1/experiments", c.admin, {
        "config": CONFIG, "modelDefinition": [v1file("train.py")], "validateOnly": True, "activate": False}),
    "patch experiment": lambda c: ("PATCH", f"/api/v1/experiments/{c.trial.experiment_id}", c.admin, {
        "name": "n", "description": "d", "notes": "n", "labels": ["a"]}),
    "job queue": lambda c: ("POST", "/api/v1/job-queues", c.admin, {"updates": [
        {"jobId": c.job_id, "priority": 10, "weight": 1.5, "resourcePool": "default", "queuePosition": 1.0}]}),
    "task logs": lambda c: ("POST", "/api/v1/task/logs", c.token, {"logs": [{"taskId": c.trial.task_id, "log": "x\n"}]}),
    "completed operation": lambda c: ("POST", f"/api/v1/trials/{c.trial.id}/searcher/completed_operation", c.token,
                                      {"op": {"length": 100}, "searcherMetric": 0.5}),
}


def _nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


TEXT = st.sampled_from(["\x00", "a\x00b", "\n", "\r\nts=x level=INFO event=login username=admin", "\x1b[31m",
                        "\ud800", "x\udfff", "\u2028", "\x7f\x85"]) | st.text(max_size=20)
HOSTILE = st.one_of(
    TEXT,
    st.integers(MAX_JSON_DEPTH - 2, 600).map(_nested),
    st.sampled_from([2**31, 2**63, 2**64, 2**70, -(2**63) - 1, 10**400, -(10**400), 1e308, -1e308,
                     float("inf"), float("-inf"), float("nan")]),
    st.sampled_from(["yes", "no", "true", "false", "on", 1, 0, "1", None, [], {}]),
    st.builds(lambda k, v: {k: v}, TEXT, TEXT),
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: its root, each container's members."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def _mutated(body: Any, at: tuple[Any, ...], value: Any, new_key: str | None) -> Any:
    """`body` with `value` at `at`, or, given `new_key`, added under it to the object there."""
    body = json.loads(json.dumps(body))
    if not at:
        return {**body, new_key: value} if new_key is not None and isinstance(body, dict) else value
    parent = body
    for step in at[:-1]:
        parent = parent[step]
    if new_key is not None and isinstance(parent[at[-1]], dict):
        parent[at[-1]][new_key] = value
    else:
        parent[at[-1]] = value
    return body


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_no_hostile_body_gets_a_5xx(client, cluster, route: str) -> None:  # type: ignore[no-untyped-def]
    method, path, headers, base = ROUTES[route](cluster)
    assert _json(client, method, path, headers, base).status_code < 400  # the unchanged body is fine
    places = _paths(base)

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(at=st.sampled_from(places), value=HOSTILE, new_key=st.none() | TEXT)
    def check(at: tuple[Any, ...], value: Any, new_key: str | None) -> None:
        r = _json(client, method, path, headers, _mutated(base, at, value, new_key))
        assert r.status_code < 500, (route, at, new_key, r.status_code, r.text)

    check()


# -- each finding ----------------------------------------------------------------------------------
def test_nul_in_a_login_username_is_400_naming_it(client) -> None:  # type: ignore[no-untyped-def]
    _refused(_json(client, "POST", "/api/v1/auth/login", {}, {"username": "ad\x00min", "password": "x"}), "username")
    _refused(_json(client, "POST", "/api/v1/auth/login", {}, {"username": "ad\ud800min", "password": "x"}), "username")


def test_nul_in_metric_keys_and_values_is_400_naming_where(client, cluster, master) -> None:  # type: ignore[no-untyped-def]
    tid, token = cluster.trial.id, cluster.token
    for values, where in (({"lo\x00ss": 1.0}, "metrics.metrics.avgMetrics"),
                          ({"loss": "a\x00b"}, "metrics.metrics.avgMetrics.loss"),
                          ({"x": {"y": [1, "\x00"]}}, "metrics.metrics.avgMetrics.x.y[1]")):
        _refused(_json(client, "POST", f"/api/v1/trials/{tid}/metrics", token, wire(tid, 1, **values)), where)
        _refused(_json(client, "POST", f"/api/v1/trials/{tid}/metrics/batch", token,
                       {"reports": [wire(tid, 1), wire(tid, 2, **values)]}), "reports[1]." + where)
        _refused(_json(client, "POST", f"/api/v1/trials/{tid}/training_metrics", token,
                       wire(tid, 1, **values)["metrics"]), where.removeprefix("metrics."))
    with master.read_sessions() as s:
        assert s.scalars(select(Metric).where(Metric.trial_id == tid)).all() == []


def test_nul_in_model_metadata_display_name_and_agent_id_is_400(client, cluster) -> None:  # type: ignore[no-untyped-def]
    admin = cluster.admin
    _refused(_json(client, "POST", "/api/v1/models", admin, {"name": "m", "metadata": {"a": "\x00"}}), "metadata.a")
    _refused(_json(client, "POST", f"/api/v1/checkpoints/{cluster.ckpt}/metadata", admin,
                   {"checkpoint": {"metadata": {"\x00": 1}}}), "checkpoint.metadata")
    _refused(_json(client, "PATCH", f"/api/v1/users/{cluster.bob_id}", admin, {"displayName": "B\x00b"}), "displayName")
    _refused(_json(client, "POST", "/api/v1/users", admin, {"user": {"username": "dan", "displayName": "\x00"},
                                                             "password": "dan-password-1"}), "user.displayName")
    _refused(_json(client, "POST", "/api/v1/agents/tokens", admin, {"resourcePool": "default", "agentId": "a\x00"}),
             "agentId")
    _refused(_json(client, "POST", "/api/v1/agents/tokens", admin, {"resourcePool": "default", "agentId": "a" * 129}),
             "agentId")


def test_task_log_lines_with_nul_are_stored_cleaned_not_refused(client, cluster, master) -> None:  # type: ignore[no-untyped-def]
    r = _json(client, "POST", "/api/v1/task/logs", cluster.token,
              {"logs": [{"taskId": cluster.trial.task_id, "log": "a\x00b\n", "source": "t\x00"}]})
    assert r.status_code == 200, r.text
    _refused(_json(client, "POST", "/api/v1/task/logs", cluster.token, {"logs": [{"taskId": "t\x00", "log": "x"}]}),
             "logs[0].taskId")


def test_a_metric_nested_hundreds_deep_is_400(client, cluster) -> None:  # type: ignore[no-untyped-def]
    tid = cluster.trial.id
    for path, body, field in (
        (f"/api/v1/trials/{tid}/metrics", wire(tid, 1, deep=_nested(500)), "metrics.metrics.avgMetrics"),
        (f"/api/v1/trials/{tid}/metrics", wire(tid, 1, deep=_nested(150)), "metrics.metrics.avgMetrics"),
        (f"/api/v1/trials/{tid}/metrics/batch", {"reports": [wire(tid, 1, deep=_nested(MAX_JSON_DEPTH))]},
         "reports[0].metrics.metrics.avgMetrics"),
        ("/api/v1/models", {"name": "deep", "metadata": {"x": _nested(500)}}, "metadata"),
        ("/api/v1/models", None, "(body)"),  # 5000 deep: past what json.loads nests
    ):
        headers = cluster.admin if path == "/api/v1/models" else cluster.token
        r = _json(client, "POST", path, headers, body) if field != "(body)" else client.post(
            path, headers={**headers, "content-type": "application/json"},
            content=b'{"name": "deep", "metadata": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}")
        assert r.status_code == 400, r.text
        assert field == "(body)" or _refused(r, field) is None
    # as deep as the limit allows is fine
    ok = wire(tid, 2, ok=_nested(MAX_JSON_DEPTH - 1))
    assert _json(client, "POST", f"/api/v1/trials/{tid}/metrics", cluster.token, ok).status_code == 200


def test_numbers_past_their_range_are_400(client, cluster, master) -> None:  # type: ignore[no-untyped-def]
    admin, tid = cluster.admin, cluster.trial.id
    for ttl in (1e308, 10**400, "Infinity", float("nan")):
        _refused(_json(client, "POST", "/api/v1/agents/tokens", admin, {"resourcePool": "default", "ttlHours": ttl}),
                 "ttlHours")
    _refused(_json(client, "POST", f"/api/v1/trials/{tid}/metrics", cluster.token, wire(tid, 1, big=10**400)),
             "metrics.metrics.avgMetrics.big")
    for progress in (float("inf"), "NaN", 10**400, -1):
        _refused(_json(client, "POST", f"/api/v1/trials/{tid}/progress", cluster.token, {"progress": progress}),
                 "progress")
    # Determined's progress is a fraction: more than 1 is taken as done
    assert _json(client, "POST", f"/api/v1/trials/{tid}/progress", cluster.token, {"progress": 2**70}).status_code == 200
    with master.read_sessions() as s:
        assert s.get(Trial, tid).progress == 1.0
    with master.read_sessions() as s:
        assert s.scalars(select(Token).where(Token.kind == "agent")).all() == []


def test_booleans_are_strict(client, cluster, master) -> None:  # type: ignore[no-untyped-def]
    admin = cluster.admin
    for loose in ("yes", "true", 1, "on"):
        _refused(_json(client, "POST", "/api/v1/users", admin, {"user": {"username": "eve", "admin": loose},
                                                                 "password": "eve-password-1"}), "user.admin")
        _refused(_json(client, "PATCH", f"/api/v1/users/{cluster.bob_id}", admin, {"admin": loose}), "admin")
        _refused(_json(client, "POST", "/api/v1/auth/login", {}, {"username": "admin", "password": ADMIN_PASSWORD,
                                                                  "isHashed": loose}), "isHashed")
    with master.read_sessions() as s:
        assert s.scalar(select(User).where(User.username == "eve")) is None
        assert s.get(User, cluster.bob_id).admin is False
    r = _json(client, "POST", "/api/v1/users", admin, {"user": {"username": "eve", "admin": True},
                                                       "password": "eve-password-1"})
    assert r.status_code == 200 and r.json()["user"]["admin"] is True


def test_non_finite_numbers_in_metadata_are_stored_as_determineds_strings(client, cluster) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL's json type refuses NaN and Infinity (a 500); every JSON column stores them as the
    strings metric values use (db/engine.py json_text)."""
    body = {"name": "odd", "metadata": {"x": float("nan"), "y": [float("inf"), float("-inf")], "z": 1.5}}
    assert _json(client, "POST", "/api/v1/models", cluster.admin, body).status_code == 200
    r = client.get("/api/v1/models/odd", headers=cluster.admin)
    assert r.status_code == 200 and r.json()["model"]["metadata"] == {"x": "NaN", "y": ["Infinity", "-Infinity"], "z": 1.5}
