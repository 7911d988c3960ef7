"""The authorization matrix over every route of the app (issue 30): each route (HTTP and WebSocket,
in the OpenAPI document or not: the proxy, the web UI, /metrics) is classified in ROUTES, one line
per method and path template, by who may call it; a route the app serves that ROUTES lacks fails
`test_every_route_is_classified`. Every route is then called by every caller class, in one app per
database (sqlite and postgres), in process.

Callers: anonymous; a user with no role; a Viewer, an Editor (through a group) and a WorkspaceAdmin
of workspace W; a user holding ClusterAdmin cluster-wide (not the admin flag); the records' owner
(who made P, E, the template while an Editor of W and holds no role in W any more: ownership stands
on its own); an admin; an agent's credential; the allocation token of E's trial, and that of another
user's trial (code E's owner does not trust, principle 10 of DESIGN.md). An allowed call
answers 2xx/3xx, or one of the row's `ok` statuses: a request built to pass authorization and then
fail validation (a made-up record, a state that forbids it), which proves authorization passed. A
refused one answers 401 (anonymous; the UI's pages redirect to /login, counted as 401), 403, or 404
where the route hides records (the proxy, a task's context). A destructive call by a caller meant
to be allowed targets a record made for that call; a refused caller targets the shared one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.routing import Mount

from control_plane import auth
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Task
from control_plane.ui.session import LOGIN_CSRF_COOKIE, SESSION_COOKIE, csrf_token
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING, _from_migrated_schema, login
from tests.control_plane.api.test_checkpoints import ckpt_body
from tests.control_plane.api.test_experiments import CONFIG, create_ok, make_user, only_trial, v1file

CALLERS = ("anon", "none", "viewer", "editor", "wsadmin", "clusteradmin", "owner", "admin", "agent", "alloc",
           "alloc2")
USERS = frozenset({"none", "viewer", "editor", "wsadmin", "clusteradmin", "owner", "admin"})
CLUSTER_ADMIN, WORKSPACE_ADMIN, VIEWER, EDITOR = 1, 2, 4, 5
UNKNOWN_UUID = "00000000-0000-4000-8000-000000000000"

# Who may call (the caller classes allowed); everyone else is refused: anonymous 401, the rest 403.
PUBLIC = frozenset(CALLERS)
USER = USERS  # any signed-in user: reads are open (services/authz.py)
USER_OR_TRIAL = USERS | {"alloc"}  # a user, or the allocation token of the trial concerned
ADMIN = frozenset({"clusteradmin", "admin"})  # the admin flag or ClusterAdmin cluster-wide
AGENT = frozenset({"agent"})
# Changing a record of W (experiment, project, template): its owner, or Editor and above in W.
EDIT_W = frozenset({"editor", "wsadmin", "clusteradmin", "owner", "admin"})
TRIAL_WRITE = EDIT_W | {"alloc"}  # reports about a trial: also its own allocation
CREATE_W = frozenset({"editor", "wsadmin", "clusteradmin", "admin"})  # creating in W: a role
ADMIN_W = frozenset({"wsadmin", "clusteradmin", "admin"})  # the workspace itself and its roles
# A record of Uncategorized (models, tasks): its owner or a role there (the roles above are in W).
EDIT_1 = frozenset({"clusteradmin", "owner", "admin"})
OWNER_HIDDEN = frozenset({"owner", "admin"})  # others get 404, as for a record that does not exist
UI_USER = USERS  # pages: a session cookie; anonymous is sent to the login page


@dataclass(frozen=True)
class Row:
    allowed: frozenset[str]
    call: Callable[[World, str], Req]
    hide: bool = False  # refusals are 404 (the record is hidden), not 403
    ui: bool = False  # the session cookie (and CSRF header) instead of Authorization
    # What an allowed call may answer besides 2xx/3xx: a request made to pass authorization and then
    # fail validation (a made-up record, a value out of range, a state that forbids it).
    ok: frozenset[int] = frozenset()
    deny: dict[str, int] = field(default_factory=dict)  # a refusal other than 401/403 for one caller
    callers: tuple[str, ...] = CALLERS  # who calls it (all but where a call costs much and proves nothing more)


@dataclass
class Req:
    method: str
    url: str
    json: Any = None
    params: dict[str, Any] | None = None
    data: dict[str, str] | None = None
    cookies: dict[str, str] | None = None


@dataclass
class World:
    """The records of the matrix, made once per database."""

    client: TestClient
    master: Any
    headers: dict[str, dict[str, str]]
    tokens: dict[str, str]
    ids: dict[str, int]
    ws: int
    ws_x: int
    project: int
    experiment: int
    trial: int
    task_id: str
    allocation: str
    checkpoint: str
    model: str
    template: str
    group: int
    command: str
    notebook: str
    tensorboard: str
    shell: str
    job: str
    n: Iterator[int] = field(default_factory=itertools.count)
    # Whether the caller of the call being built is to be allowed: only then does a destructive
    # call need a record of its own (a refused one leaves the shared record as it was).
    spend: bool = True

    def fresh_experiment(self) -> int:
        """An experiment of P owned by the owner (who may no longer create in W: the admin makes it)."""
        from control_plane.db.models import Experiment

        if not self.spend:
            return self.experiment
        exp = create_ok(self.client, self.headers["admin"], projectId=self.project)["experiment"]["id"]
        with transaction(self.master.sessions) as s:
            s.get(Experiment, exp).owner_id = self.ids["owner"]
        return exp

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.n)}"


def get(url: str, **params: Any) -> Callable[[World, str], Req]:
    return lambda w, who: Req("GET", url.format(**vars(w)),
                              params={k: str(v).format(**vars(w)) for k, v in params.items()} or None)


def post(url: str, body: Any = None) -> Callable[[World, str], Req]:
    return lambda w, who: Req("POST", url.format(**vars(w)), json=body)


def _exp_action(action: str) -> Callable[[World, str], Req]:
    return lambda w, who: Req("POST", f"/api/v1/experiments/{w.fresh_experiment()}/{action}")


def _ui_exp_action(w: World, who: str) -> Req:
    return Req("POST", f"/experiments/{w.fresh_experiment()}/actions/pause")


def _task_body(kind: str, experiment: int = 0) -> dict[str, Any]:
    extra = {"entrypoint": ["true"]} if kind == "commands" else {}
    more = {"experimentIds": [experiment]} if kind == "tensorboards" else {}
    return {"config": {"resources": {"slots": 0}, **extra}, **more}


def _launch(kind: str) -> Callable[[World, str], Req]:
    """A launch into W: creating there needs a role (the fixtures' tasks are in Uncategorized)."""
    return lambda w, who: Req("POST", f"/api/v1/{kind}", json={**_task_body(kind, w.experiment), "workspaceId": w.ws})


def _kill_task(kind: str) -> Callable[[World, str], Req]:
    def call(w: World, who: str) -> Req:
        if not w.spend:
            return Req("POST", f"/api/v1/{kind}s/{getattr(w, kind)}/kill")
        r = w.client.post(f"/api/v1/{kind}s", headers=w.headers["owner"], json=_task_body(f"{kind}s", w.experiment))
        assert r.status_code == 200, r.text
        return Req("POST", f"/api/v1/{kind}s/{r.json()[kind]['id']}/kill")
    return call


def _ui_task_kill(w: World, who: str) -> Req:
    if not w.spend:
        return Req("POST", f"/tasks/{w.command}/kill")
    r = w.client.post("/api/v1/commands", headers=w.headers["owner"], json=_task_body("commands"))
    return Req("POST", f"/tasks/{r.json()['command']['id']}/kill")


def _new_user(w: World, who: str) -> Req:
    return Req("POST", "/api/v1/users", json={"user": {"username": w.unique(f"u-{who}")}, "password": "pw-123456789"})


def _new_workspace(w: World, who: str) -> Req:
    return Req("POST", "/api/v1/workspaces", json={"name": w.unique(f"ws-{who}")})


def _fresh_project(w: World) -> int:
    if not w.spend:
        return w.project
    r = w.client.post(f"/api/v1/workspaces/{w.ws}/projects", headers=w.headers["admin"],
                      json={"name": w.unique("p")})
    assert r.status_code == 200, r.text
    pid = r.json()["project"]["id"]
    # Owned by the owner: made by the admin, then... the owner cannot create in W any more, so
    # ownership is given in the database.
    from control_plane.db.models import Project

    with transaction(w.master.sessions) as s:
        s.get(Project, pid).owner_id = w.ids["owner"]
    return pid


def _delete_project(w: World, who: str) -> Req:
    return Req("DELETE", f"/api/v1/projects/{_fresh_project(w)}")


def _fresh_template(w: World) -> str:
    if not w.spend:
        return w.template
    name = w.unique("t")
    r = w.client.post(f"/api/v1/templates/{name}", headers=w.headers["admin"],
                      json={"name": name, "config": {"description": "x"}, "workspaceId": w.ws})
    assert r.status_code == 200, r.text
    from control_plane.db.models import ConfigTemplate

    with transaction(w.master.sessions) as s:
        s.get(ConfigTemplate, name).owner_id = w.ids["owner"]
    return name


def _delete_template(w: World, who: str) -> Req:
    return Req("DELETE", f"/api/v1/templates/{_fresh_template(w)}")


def _new_template(w: World, who: str) -> Req:
    name = w.unique(f"t-{who}")
    return Req("POST", f"/api/v1/templates/{name}", json={"name": name, "config": {"description": "x"},
                                                           "workspaceId": w.ws})


def _delete_group(w: World, who: str) -> Req:
    if not w.spend:
        return Req("DELETE", f"/api/v1/groups/{w.group}")
    r = w.client.post("/api/v1/groups", headers=w.headers["admin"], json={"name": w.unique("g")})
    assert r.status_code == 200, r.text
    return Req("DELETE", f"/api/v1/groups/{r.json()['group']['groupId']}")


def _delete_experiment(w: World, who: str) -> Req:
    from tests.control_plane.api.test_experiments import finish_experiment

    exp = w.fresh_experiment()
    if w.spend:
        finish_experiment(w.master, exp)
    return Req("DELETE", f"/api/v1/experiments/{exp}")


def _kill_trial(w: World, who: str) -> Req:
    exp = w.fresh_experiment()
    return Req("POST", f"/api/v1/trials/{only_trial(w.master, exp).id}/kill")


def _assign(w: World, workspace: int | None) -> dict[str, Any]:
    return {"userRoleAssignments": [{"userId": w.ids["none"], "roleAssignment": {
        "role": {"roleId": VIEWER}, "scopeWorkspaceId": workspace}}]}


def _move_experiment(w: World, who: str) -> Req:
    return Req("POST", f"/api/v1/experiments/{w.fresh_experiment()}/move",
               json={"destinationProjectId": w.project})


def _ckpt(w: World, who: str) -> Req:
    trial = only_trial(w.master, w.experiment)
    return Req("POST", "/api/v1/checkpoints", json=ckpt_body(trial, 1))


def _metrics(w: World, group: str) -> dict[str, Any]:
    return {"metrics": {"trialId": w.trial, "trialRunId": 1, "stepsCompleted": next(w.n) + 1,
                        "metrics": {"avgMetrics": {"loss": 1.0}}}, "group": group}


def _ui_login(w: World, who: str) -> Req:
    w.client.cookies.clear()
    csrf = w.client.get("/login").cookies[LOGIN_CSRF_COOKIE]
    return Req("POST", "/login", data={"username": "victim", "password": "victim-password-1", "csrf": csrf},
               cookies={LOGIN_CSRF_COOKIE: csrf})


def _logout(w: World, who: str) -> Req:
    return Req("POST", "/api/v1/auth/logout")


def _proxy(method: str) -> Callable[[World, str], Req]:
    return lambda w, who: Req(method, f"/proxy/{w.notebook}/api/status")


def _delete_model(w: World, who: str) -> Req:
    """A fresh model of the owner's, with a version, for each caller who may delete it."""
    if not w.spend:
        return Req("DELETE", f"/api/v1/models/{w.model}")
    name = w.unique("m")
    owner = w.headers["owner"]
    assert w.client.post("/api/v1/models", headers=owner, json={"name": name}).status_code == 200
    r = w.client.post(f"/api/v1/models/{name}/versions", headers=owner, json={"checkpointUuid": w.checkpoint})
    assert r.status_code == 200, r.text
    return Req("DELETE", f"/api/v1/models/{name}")


def _model_version(w: World, who: str) -> Req:
    return Req("POST", f"/api/v1/models/{w.model}/versions", json={"checkpointUuid": w.checkpoint})


# One line per route: (method, path template) -> who may call it, and the request each caller sends.
ROUTES: dict[tuple[str, str], Row] = {
    # -- documentation, health, sign-in
    ("GET", "/openapi.json"): Row(PUBLIC, get("/openapi.json")),
    ("GET", "/docs"): Row(PUBLIC, get("/docs")),
    ("GET", "/docs/oauth2-redirect"): Row(PUBLIC, get("/docs/oauth2-redirect")),
    ("GET", "/redoc"): Row(PUBLIC, get("/redoc")),
    ("GET", "/health"): Row(PUBLIC, get("/health")),
    ("GET", "/info"): Row(PUBLIC, get("/info")),
    ("GET", "/api/v1/master"): Row(PUBLIC, get("/api/v1/master")),
    ("GET", "/api/v1/master/leader"): Row(USER, get("/api/v1/master/leader")),
    ("POST", "/api/v1/auth/login"): Row(PUBLIC, post("/api/v1/auth/login", {"username": "admin",
                                                                             "password": ADMIN_PASSWORD})),
    ("POST", "/api/v1/auth/logout"): Row(USERS, _logout),
    ("GET", "/api/v1/agent/package"): Row(AGENT, get("/api/v1/agent/package")),  # the boot's token
    # -- users
    ("GET", "/api/v1/me"): Row(USER, get("/api/v1/me")),
    ("POST", "/api/v1/users"): Row(ADMIN, _new_user),
    ("GET", "/api/v1/users"): Row(USER, get("/api/v1/users")),
    ("GET", "/api/v1/users/{userId}"): Row(USER, lambda w, who: Req("GET", f"/api/v1/users/{w.ids['victim']}")),
    ("GET", "/api/v1/users/{username}/by-username"): Row(USER, get("/api/v1/users/victim/by-username")),
    ("POST", "/api/v1/users/{userId}/password"): Row(ADMIN, lambda w, who: Req(
        "POST", f"/api/v1/users/{w.ids['victim']}/password", json="victim-password-1")),
    ("PATCH", "/api/v1/users/{userId}"): Row(ADMIN, lambda w, who: Req(
        "PATCH", f"/api/v1/users/{w.ids['victim']}", json={"displayName": who})),
    # -- experiments (in project P of workspace W)
    ("POST", "/api/v1/experiments"): Row(CREATE_W, lambda w, who: Req("POST", "/api/v1/experiments", json={
        "config": CONFIG, "modelDefinition": [v1file("train.py")], "projectId": w.project})),
    ("GET", "/api/v1/experiments"): Row(USER, get("/api/v1/experiments")),
    ("GET", "/api/v1/experiments/{experimentId}"): Row(USER_OR_TRIAL, get("/api/v1/experiments/{experiment}")),
    ("POST", "/api/v1/experiments/{experimentId}/activate"): Row(EDIT_W, _exp_action("activate")),
    ("POST", "/api/v1/experiments/{experimentId}/pause"): Row(EDIT_W, _exp_action("pause")),
    ("POST", "/api/v1/experiments/{experimentId}/cancel"): Row(EDIT_W, _exp_action("cancel")),
    ("POST", "/api/v1/experiments/{experimentId}/kill"): Row(EDIT_W, _exp_action("kill")),
    ("POST", "/api/v1/experiments/{experimentId}/archive"): Row(EDIT_W, _exp_action("archive"),
                                                              ok=frozenset({409})),  # not ended
    ("POST", "/api/v1/experiments/{experimentId}/unarchive"): Row(EDIT_W, _exp_action("unarchive")),
    ("PATCH", "/api/v1/experiments/{experimentId}"): Row(EDIT_W, lambda w, who: Req(
        "PATCH", f"/api/v1/experiments/{w.experiment}", json={"notes": who})),
    ("PUT", "/api/v1/experiments/{experimentId}/labels/{label}"): Row(EDIT_W, lambda w, who: Req(
        "PUT", f"/api/v1/experiments/{w.experiment}/labels/{who}")),
    ("DELETE", "/api/v1/experiments/{experimentId}/labels/{label}"): Row(EDIT_W, lambda w, who: Req(
        "DELETE", f"/api/v1/experiments/{w.experiment}/labels/{who}")),
    ("DELETE", "/api/v1/experiments/{experimentId}"): Row(EDIT_W, _delete_experiment),
    # Moving needs a role that creates in the destination (P, in W): the owner holds none there.
    ("POST", "/api/v1/experiments/{experimentId}/move"): Row(CREATE_W, _move_experiment),
    ("POST", "/api/v1/experiments/{experimentId}/gc"): Row(EDIT_W, post("/api/v1/experiments/{experiment}/gc"),
                                                         ok=frozenset({409})),  # it is still running
    ("GET", "/api/v1/experiments/{experimentId}/model_def"): Row(USER_OR_TRIAL,
                                                                 get("/api/v1/experiments/{experiment}/model_def")),
    ("GET", "/api/v1/experiments/{experimentId}/trials"): Row(USER_OR_TRIAL,
                                                              get("/api/v1/experiments/{experiment}/trials")),
    ("GET", "/api/v1/experiments/{id}/checkpoints"): Row(USER_OR_TRIAL,
                                                         get("/api/v1/experiments/{experiment}/checkpoints")),
    # -- trials and what their code reports
    ("GET", "/api/v1/trials/{trialId}"): Row(USER_OR_TRIAL, get("/api/v1/trials/{trial}")),
    ("POST", "/api/v1/trials/{trialId}/kill"): Row(EDIT_W, _kill_trial),
    ("GET", "/api/v1/trials/{id}/checkpoints"): Row(USER_OR_TRIAL, get("/api/v1/trials/{trial}/checkpoints")),
    ("POST", "/api/v1/trials/{trialId}/metrics"): Row(TRIAL_WRITE, lambda w, who: Req(
        "POST", f"/api/v1/trials/{w.trial}/metrics", json={"metrics": {
            "trialId": w.trial, "trialRunId": 1, "stepsCompleted": 1, "metrics": {"avgMetrics": {"loss": 1.0}}},
            "group": "training"})),
    ("POST", "/api/v1/trials/{trialId}/metrics/batch"): Row(TRIAL_WRITE, lambda w, who: Req(
        "POST", f"/api/v1/trials/{w.trial}/metrics/batch", json={"reports": [_metrics(w, "training")]})),
    ("POST", "/api/v1/trials/{trialId}/training_metrics"): Row(TRIAL_WRITE, lambda w, who: Req(
        "POST", f"/api/v1/trials/{w.trial}/training_metrics", json=_metrics(w, "training")["metrics"])),
    ("POST", "/api/v1/trials/{trialId}/validation_metrics"): Row(TRIAL_WRITE, lambda w, who: Req(
        "POST", f"/api/v1/trials/{w.trial}/validation_metrics", json=_metrics(w, "validation")["metrics"])),
    ("GET", "/api/v1/trials/metrics/trial_metrics"): Row(USER_OR_TRIAL, get(
        "/api/v1/trials/metrics/trial_metrics", trialIds="{trial}", group="training")),
    ("GET", "/api/v1/trials/metrics/training_metrics"): Row(USER_OR_TRIAL, get(
        "/api/v1/trials/metrics/training_metrics", trialIds="{trial}")),
    ("GET", "/api/v1/trials/metrics/validation_metrics"): Row(USER_OR_TRIAL, get(
        "/api/v1/trials/metrics/validation_metrics", trialIds="{trial}")),
    ("GET", "/api/v1/trials/{trialId}/metrics"): Row(USER_OR_TRIAL, get("/api/v1/trials/{trial}/metrics")),
    ("GET", "/api/v1/trials/{trialId}/workloads"): Row(USER_OR_TRIAL, get("/api/v1/trials/{trial}/workloads")),
    ("GET", "/api/v1/trials/{trialId}/searcher/operation"): Row(USER_OR_TRIAL,
                                                                get("/api/v1/trials/{trial}/searcher/operation")),
    ("POST", "/api/v1/trials/{trialId}/searcher/completed_operation"): Row(TRIAL_WRITE, post(
        "/api/v1/trials/{trial}/searcher/completed_operation", {"op": {"length": 0}, "searcherMetric": 1.0}),
                                                                          ok=frozenset({400, 409})),
    ("POST", "/api/v1/trials/{trialId}/early_exit"): Row(TRIAL_WRITE, post(
        "/api/v1/trials/{trial}/early_exit", {"reason": "NOT_A_REASON"}), ok=frozenset({400})),
    ("POST", "/api/v1/trials/{trialId}/progress"): Row(TRIAL_WRITE, post(
        "/api/v1/trials/{trial}/progress", {"progress": 0.1, "isRaw": True})),
    ("POST", "/api/v1/runs/start"): Row(USER_OR_TRIAL, lambda w, who: Req("POST", "/api/v1/runs/start",
                                                                           json={"runId": w.trial})),
    ("GET", "/api/v1/allocations/{allocationId}/signals/preemption"): Row(USER_OR_TRIAL, get(
        "/api/v1/allocations/{allocation}/signals/preemption")),
    ("GET", "/api/v1/allocations/{allocationId}/resources/{resourcesId}/rendezvous"): Row(USER_OR_TRIAL, get(
        "/api/v1/allocations/{allocation}/resources/r1/rendezvous"), ok=frozenset({404})),  # not running
    # Acknowledging changes nothing (the allocation's state decides): a read.
    ("POST", "/api/v1/allocations/{allocationId}/signals/ack_preemption"): Row(USER_OR_TRIAL, post(
        "/api/v1/allocations/{allocation}/signals/ack_preemption", {})),
    # -- logs
    # A task's output: its own allocation (or its agent), or an admin; not its owner.
    ("POST", "/api/v1/task/logs"): Row(ADMIN | {"alloc"}, lambda w, who: Req("POST", "/api/v1/task/logs", json={
        "logs": [{"taskId": w.task_id, "log": "x\n"}]})),
    ("GET", "/api/v1/trials/{trialId}/logs"): Row(USER_OR_TRIAL, get("/api/v1/trials/{trial}/logs")),
    ("GET", "/api/v1/tasks/{taskId}/logs"): Row(USER_OR_TRIAL, get("/api/v1/tasks/{task_id}/logs")),
    # -- checkpoints
    ("POST", "/api/v1/checkpoints"): Row(TRIAL_WRITE, _ckpt),
    ("GET", "/api/v1/checkpoints/{checkpointUuid}"): Row(USER_OR_TRIAL, get("/api/v1/checkpoints/{checkpoint}")),
    ("GET", "/checkpoints/{checkpointUuid}"): Row(USER_OR_TRIAL, get("/checkpoints/{checkpoint}"),
                                                  ok=frozenset({404})),  # no files in its storage
    # E's checkpoint and an unknown one: 404 only once authorized for E's (nothing is changed).
    ("DELETE", "/api/v1/checkpoints"): Row(EDIT_W, lambda w, who: Req(
        "DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [w.checkpoint, UNKNOWN_UUID]}), ok=frozenset({404})),
    ("POST", "/api/v1/checkpoints/rm"): Row(EDIT_W, lambda w, who: Req("POST", "/api/v1/checkpoints/rm", json={
        "checkpointUuids": [w.checkpoint, UNKNOWN_UUID], "checkpointGlobs": ["model.pt"]}), ok=frozenset({404})),
    ("PATCH", "/api/v1/checkpoints"): Row(EDIT_W, lambda w, who: Req(
        "PATCH", "/api/v1/checkpoints", json={"checkpoints": [{"uuid": w.checkpoint, "resources": {}},
                                                              {"uuid": UNKNOWN_UUID, "resources": {}}]}),
        ok=frozenset({404})),
    ("POST", "/api/v1/checkpoints/{checkpointUuid}/metadata"): Row(TRIAL_WRITE, post(
        "/api/v1/checkpoints/{checkpoint}/metadata", {"checkpoint": {"metadata": {"k": "v"}}})),
    # -- agents
    # Agents' own routes: the agent's credential; an answer past it is a refusal of the body or the
    # session (the agent daemon's tests cover the real exchange).
    ("POST", "/api/v1/agents/tokens"): Row(ADMIN, post("/api/v1/agents/tokens", {"pool": 7}), ok=frozenset({400})),
    ("POST", "/api/v1/agents/register"): Row(AGENT, post("/api/v1/agents/register", {"agentId": 7}),
                                             ok=frozenset({400})),
    ("GET", "/api/v1/agents/{agentId}/commands"): Row(AGENT, get("/api/v1/agents/a1/commands", sessionId="other",
                                                                 timeoutSeconds=0), ok=frozenset({409})),
    ("POST", "/api/v1/agents/{agentId}/events"): Row(AGENT, post("/api/v1/agents/a1/events", {"sessionId": 7}),
                                                     ok=frozenset({400})),
    ("POST", "/api/v1/agents/{agentId}/interruption"): Row(AGENT, post("/api/v1/agents/a1/interruption", {"x": 7}),
                                                           ok=frozenset({400})),
    ("DELETE", "/api/v1/agents/{agentId}/enrolment"): Row(ADMIN, lambda w, who: Req(
        "DELETE", "/api/v1/agents/no-such-agent/enrolment"), ok=frozenset({404})),
    ("GET", "/api/v1/agents"): Row(USER, get("/api/v1/agents")),
    ("GET", "/api/v1/agents/{agentId}"): Row(USER, get("/api/v1/agents/a1")),
    ("POST", "/api/v1/agents/{agentId}/enable"): Row(ADMIN, post("/api/v1/agents/a1/enable")),
    ("POST", "/api/v1/agents/{agentId}/disable"): Row(ADMIN, post("/api/v1/agents/no-such-agent/disable", {}),
                                                      ok=frozenset({404})),
    # -- pools and the job queue
    ("GET", "/api/v1/resource-pools"): Row(USER, get("/api/v1/resource-pools")),
    ("GET", "/api/v1/resource-pools/{name}"): Row(USER, get("/api/v1/resource-pools/default")),
    ("GET", "/api/v1/resource-pools/{name}/scaling-history"): Row(USER, get(
        "/api/v1/resource-pools/default/scaling-history")),
    ("POST", "/api/v1/resource-pools/{name}/teardown"): Row(ADMIN, post("/api/v1/resource-pools/nope/teardown"),
                                                            ok=frozenset({404})),
    ("POST", "/api/v1/resource-pools/{name}/enable"): Row(ADMIN, post("/api/v1/resource-pools/default/enable"),
                                                          ok=frozenset({400})),  # not torn down
    # An unknown workspace: 400 only once authorized (who may not bind learns nothing of the names).
    ("POST", "/api/v1/resource-pools/{resourcePoolName}/workspace-bindings"): Row(ADMIN, post(
        "/api/v1/resource-pools/team/workspace-bindings", {"workspaceNames": ["W", "nope"]}), ok=frozenset({400})),
    ("DELETE", "/api/v1/resource-pools/{resourcePoolName}/workspace-bindings"): Row(ADMIN, lambda w, who: Req(
        "DELETE", "/api/v1/resource-pools/team/workspace-bindings", json={"workspaceNames": ["W"]})),
    ("PUT", "/api/v1/resource-pools/{resourcePoolName}/workspace-bindings"): Row(ADMIN, lambda w, who: Req(
        "PUT", "/api/v1/resource-pools/team/workspace-bindings", json={"workspaceNames": ["W"]})),
    ("GET", "/api/v1/resource-pools/{resourcePoolName}/workspace-bindings"): Row(USER, get(
        "/api/v1/resource-pools/default/workspace-bindings")),
    ("GET", "/api/v1/job-queues-v2"): Row(USER, get("/api/v1/job-queues-v2")),
    ("GET", "/api/v1/job-queues"): Row(USER, get("/api/v1/job-queues")),
    ("GET", "/api/v1/job-queues/stats"): Row(USER, get("/api/v1/job-queues/stats")),
    ("POST", "/api/v1/job-queues"): Row(EDIT_W, lambda w, who: Req("POST", "/api/v1/job-queues", json={
        "updates": [{"jobId": w.job, "priority": 40}]})),
    # -- tasks: commands, notebooks, TensorBoards, shells (launched into W; the fixtures are in Uncategorized)
    ("GET", "/api/v1/tasks"): Row(USER, get("/api/v1/tasks")),
    ("GET", "/api/v1/tasks/{taskId}"): Row(USER, get("/api/v1/tasks/{command}"),
                                            deny={"alloc": 404, "alloc2": 404}),
    # The uploaded context: its owner, an admin, or its own allocation (the trial's token: hidden).
    ("GET", "/api/v1/tasks/{taskId}/context"): Row(OWNER_HIDDEN, get("/api/v1/tasks/{command}/context"), hide=True,
                                                   deny={"agent": 403}),
    # A notebook's, TensorBoard's or shell's own allocation token, once (tests/control_plane/api/
    # test_proxy.py); a trial's token is told the allocation does not exist.
    ("POST", "/api/v1/allocations/{allocationId}/proxy_address"): Row(frozenset(), post(
        "/api/v1/allocations/{allocation}/proxy_address", {"proxyAddress": "127.0.0.1"}), deny={"alloc": 404}),
    ("POST", "/api/v1/commands"): Row(CREATE_W, _launch("commands")),
    ("GET", "/api/v1/commands"): Row(USER, get("/api/v1/commands")),
    ("GET", "/api/v1/commands/{commandId}"): Row(USER, get("/api/v1/commands/{command}")),
    ("POST", "/api/v1/commands/{commandId}/kill"): Row(EDIT_1, _kill_task("command")),
    ("POST", "/api/v1/notebooks"): Row(CREATE_W, _launch("notebooks")),
    ("GET", "/api/v1/notebooks"): Row(USER, get("/api/v1/notebooks")),
    ("GET", "/api/v1/notebooks/{notebookId}"): Row(USER, get("/api/v1/notebooks/{notebook}")),
    ("POST", "/api/v1/notebooks/{notebookId}/kill"): Row(EDIT_1, _kill_task("notebook")),
    ("POST", "/api/v1/tensorboards"): Row(CREATE_W, _launch("tensorboards")),
    ("GET", "/api/v1/tensorboards"): Row(USER, get("/api/v1/tensorboards")),
    ("GET", "/api/v1/tensorboards/{tensorboardId}"): Row(USER, get("/api/v1/tensorboards/{tensorboard}")),
    ("POST", "/api/v1/tensorboards/{tensorboardId}/kill"): Row(EDIT_1, _kill_task("tensorboard")),
    ("POST", "/api/v1/shells"): Row(CREATE_W, _launch("shells")),
    ("GET", "/api/v1/shells"): Row(USER, get("/api/v1/shells")),
    ("GET", "/api/v1/shells/{shellId}"): Row(USER, get("/api/v1/shells/{shell}")),
    ("POST", "/api/v1/shells/{shellId}/kill"): Row(EDIT_1, _kill_task("shell")),
    # Priority 0 is out of range: 400 once authorized (owner or UPDATE_NSC in Uncategorized), nothing changed.
    **{("POST", f"/api/v1/{kind}s/{{{kind}Id}}/set_priority"): Row(EDIT_1, post(
        f"/api/v1/{kind}s/{{{kind}}}/set_priority", {"priority": 0}), ok=frozenset({400}))
       for kind in ("command", "notebook", "tensorboard", "shell")},
    # 502: nothing listens at the notebook's address; what passes authorization is forwarded.
    **{(m, "/proxy/{taskId}/{path}"): Row(OWNER_HIDDEN, _proxy(m), hide=True, ok=frozenset({502}))
       for m in ("DELETE", "GET", "OPTIONS", "PATCH", "POST", "PUT")},
    ("WS", "/proxy/{taskId}/{path}"): Row(OWNER_HIDDEN, _proxy("WS"), hide=True, ok=frozenset({502})),
    # -- the model registry (models stay in Uncategorized)
    ("POST", "/api/v1/models"): Row(USER, lambda w, who: Req("POST", "/api/v1/models", json={
        "name": w.unique(f"m-{who}")})),
    ("GET", "/api/v1/models"): Row(USER, get("/api/v1/models")),
    ("GET", "/api/v1/models/{modelName}"): Row(USER, get("/api/v1/models/{model}")),
    ("PATCH", "/api/v1/models/{modelName}"): Row(EDIT_1, lambda w, who: Req(
        "PATCH", f"/api/v1/models/{w.model}", json={"description": who})),
    ("DELETE", "/api/v1/models/{modelName}"): Row(EDIT_1, _delete_model),
    ("POST", "/api/v1/models/{modelName}/versions"): Row(EDIT_1, _model_version),
    ("GET", "/api/v1/models/{modelName}/versions"): Row(USER, get("/api/v1/models/{model}/versions")),
    ("GET", "/api/v1/models/{modelName}/versions/{modelVersionNum}"): Row(USER, get(
        "/api/v1/models/{model}/versions/1")),
    # -- workspaces and projects (W is the admin's; P and the templates the owner's)
    ("POST", "/api/v1/workspaces"): Row(USER, _new_workspace),
    ("GET", "/api/v1/workspaces"): Row(USER, get("/api/v1/workspaces")),
    ("GET", "/api/v1/workspaces/{id}"): Row(USER, get("/api/v1/workspaces/{ws}")),
    ("PATCH", "/api/v1/workspaces/{id}"): Row(ADMIN_W, lambda w, who: Req(
        "PATCH", f"/api/v1/workspaces/{w.ws}", json={"defaultComputePool": "nope"}), ok=frozenset({400})),
    ("DELETE", "/api/v1/workspaces/{id}"): Row(ADMIN_W, lambda w, who: Req("DELETE", f"/api/v1/workspaces/{w.ws}"),
                                               ok=frozenset({409})),  # W holds projects
    ("GET", "/api/v1/workspaces/{workspaceId}/available-resource-pools"): Row(USER, get(
        "/api/v1/workspaces/{ws}/available-resource-pools")),
    ("GET", "/api/v1/workspaces/{id}/projects"): Row(USER, get("/api/v1/workspaces/{ws}/projects")),
    ("POST", "/api/v1/workspaces/{workspaceId}/projects"): Row(CREATE_W, lambda w, who: Req(
        "POST", f"/api/v1/workspaces/{w.ws}/projects", json={"name": w.unique(f"p-{who}")})),
    ("POST", "/api/v1/workspaces/{id}/archive"): Row(ADMIN_W, post("/api/v1/workspaces/{ws}/archive")),
    ("POST", "/api/v1/workspaces/{id}/unarchive"): Row(ADMIN_W, post("/api/v1/workspaces/{ws}/unarchive")),
    ("GET", "/api/v1/projects/{id}"): Row(USER, get("/api/v1/projects/{project}")),
    ("PATCH", "/api/v1/projects/{id}"): Row(EDIT_W, lambda w, who: Req(
        "PATCH", f"/api/v1/projects/{w.project}", json={"description": who})),
    ("DELETE", "/api/v1/projects/{id}"): Row(EDIT_W, _delete_project),
    ("POST", "/api/v1/projects/{id}/archive"): Row(EDIT_W, post("/api/v1/projects/{project}/archive")),
    ("POST", "/api/v1/projects/{id}/unarchive"): Row(EDIT_W, post("/api/v1/projects/{project}/unarchive")),
    ("PUT", "/api/v1/projects/{projectId}/notes"): Row(EDIT_W, lambda w, who: Req(
        "PUT", f"/api/v1/projects/{w.project}/notes", json={"notes": [{"name": who, "contents": ""}]})),
    # Into X, the admin's workspace where no one else holds a role: creating there needs one.
    ("POST", "/api/v1/projects/{projectId}/move"): Row(ADMIN, lambda w, who: Req(
        "POST", f"/api/v1/projects/{_fresh_project(w)}/move", json={"destinationWorkspaceId": w.ws_x})),
    # -- templates
    ("GET", "/api/v1/templates"): Row(USER, get("/api/v1/templates")),
    ("GET", "/api/v1/templates/{templateName}"): Row(USER, get("/api/v1/templates/{template}")),
    ("POST", "/api/v1/templates/{templateName}"): Row(CREATE_W, _new_template),
    ("PUT", "/api/v1/templates/{templateName}"): Row(EDIT_W, lambda w, who: Req(
        "PUT", f"/api/v1/templates/{w.template}", json={"config": {"description": who}, "workspaceId": w.ws})),
    ("PATCH", "/api/v1/templates/{templateName}"): Row(EDIT_W, lambda w, who: Req(
        "PATCH", f"/api/v1/templates/{w.template}", json={"description": who})),
    ("DELETE", "/api/v1/templates/{templateName}"): Row(EDIT_W, _delete_template),
    # -- groups and roles
    ("POST", "/api/v1/groups"): Row(ADMIN, lambda w, who: Req("POST", "/api/v1/groups", json={
        "name": w.unique(f"g-{who}")})),
    ("POST", "/api/v1/groups/search"): Row(USER, post("/api/v1/groups/search", {"limit": 10})),
    ("GET", "/api/v1/groups/{groupId}"): Row(USER, get("/api/v1/groups/{group}")),
    ("PUT", "/api/v1/groups/{groupId}"): Row(ADMIN, lambda w, who: Req(
        "PUT", f"/api/v1/groups/{w.group}", json={"groupId": w.group, "name": "team"})),
    ("DELETE", "/api/v1/groups/{groupId}"): Row(ADMIN, _delete_group),
    ("POST", "/api/v1/roles/search"): Row(USER, post("/api/v1/roles/search", {"limit": 10})),
    ("POST", "/api/v1/roles/search/by-assignability"): Row(USER, post(
        "/api/v1/roles/search/by-assignability", {"limit": 10, "workspaceId": 1})),
    ("POST", "/api/v1/roles/search/by-ids"): Row(USER, post("/api/v1/roles/search/by-ids", {"roleIds": [VIEWER]})),
    ("GET", "/api/v1/roles/search/by-user/{userId}"): Row(USER, lambda w, who: Req(
        "GET", f"/api/v1/roles/search/by-user/{w.ids['viewer']}")),
    ("GET", "/api/v1/roles/search/by-group/{groupId}"): Row(USER, get("/api/v1/roles/search/by-group/{group}")),
    ("GET", "/api/v1/permissions/summary"): Row(USER, get("/api/v1/permissions/summary")),
    ("POST", "/api/v1/roles/add-assignments"): Row(ADMIN_W, lambda w, who: Req(
        "POST", "/api/v1/roles/add-assignments", json=_assign(w, w.ws))),
    ("POST", "/api/v1/roles/remove-assignments"): Row(ADMIN_W, lambda w, who: Req(
        "POST", "/api/v1/roles/remove-assignments", json=_assign(w, w.ws))),
    # -- the master
    ("GET", "/api/v1/master/config"): Row(ADMIN, get("/api/v1/master/config")),
    ("GET", "/api/v1/master/cluster_message"): Row(USER, get("/api/v1/master/cluster_message")),
    ("PUT", "/api/v1/master/cluster_message"): Row(ADMIN, lambda w, who: Req(
        "PUT", "/api/v1/master/cluster_message", json={"message": f"from {who}", "duration": "1h"})),
    ("DELETE", "/api/v1/master/cluster_message"): Row(ADMIN, lambda w, who: Req(
        "DELETE", "/api/v1/master/cluster_message")),
    ("GET", "/api/v1/master/logs"): Row(ADMIN, get("/api/v1/master/logs", limit=1)),
    # -- the web UI (its session cookie; anonymous is sent to the login page)
    ("GET", "/login"): Row(PUBLIC, get("/login"), ui=True),
    ("POST", "/login"): Row(PUBLIC, _ui_login, ui=True),
    ("POST", "/logout"): Row(UI_USER, post("/logout"), ui=True),  # a token of its own (_send)
    ("GET", "/"): Row(UI_USER, get("/"), ui=True),
    ("GET", "/experiments"): Row(PUBLIC, get("/experiments"), ui=True),
    ("GET", "/ui/fragments/experiments"): Row(UI_USER, get("/ui/fragments/experiments"), ui=True),
    ("GET", "/experiments/{experiment_id}"): Row(UI_USER, get("/experiments/{experiment}"), ui=True),
    ("GET", "/ui/fragments/experiments/{experiment_id}"): Row(UI_USER, get(
        "/ui/fragments/experiments/{experiment}"), ui=True),
    ("GET", "/ui/data/experiments/{experiment_id}/metrics"): Row(UI_USER, get(
        "/ui/data/experiments/{experiment}/metrics"), ui=True),
    ("GET", "/ui/data/experiments/{experiment_id}/curves"): Row(UI_USER, get(
        "/ui/data/experiments/{experiment}/curves"), ui=True, ok=frozenset({400})),  # names no metric
    ("POST", "/experiments/{experiment_id}/actions/{action}"): Row(EDIT_W, _ui_exp_action, ui=True),
    ("POST", "/experiments/{experiment_id}/labels"): Row(EDIT_W, post("/experiments/{experiment}/labels"), ui=True,
                                                         ok=frozenset({400})),  # an empty form
    ("GET", "/trials/{trial_id}"): Row(UI_USER, get("/trials/{trial}"), ui=True),
    ("GET", "/ui/fragments/trials/{trial_id}"): Row(UI_USER, get("/ui/fragments/trials/{trial}"), ui=True),
    ("GET", "/ui/data/trials/{trial_id}/metrics"): Row(UI_USER, get("/ui/data/trials/{trial}/metrics"), ui=True),
    ("GET", "/ui/data/trials/{trial_id}/logs"): Row(UI_USER, get("/ui/data/trials/{trial}/logs"), ui=True),
    ("GET", "/cluster"): Row(UI_USER, get("/cluster"), ui=True),
    ("GET", "/ui/fragments/cluster"): Row(UI_USER, get("/ui/fragments/cluster"), ui=True),
    ("GET", "/ui/data/pools/{name}/history"): Row(UI_USER, get("/ui/data/pools/default/history"), ui=True),
    ("GET", "/models"): Row(UI_USER, get("/models"), ui=True),
    ("GET", "/models/{model_name}"): Row(UI_USER, get("/models/{model}"), ui=True),
    ("POST", "/models/{model_name}/edit"): Row(EDIT_1, post("/models/{model}/edit"), ui=True),
    ("GET", "/tasks"): Row(UI_USER, get("/tasks"), ui=True),
    ("GET", "/tasks/{task_id}"): Row(UI_USER, get("/tasks/{command}"), ui=True),
    ("POST", "/tasks/{task_id}/kill"): Row(EDIT_1, _ui_task_kill, ui=True),
    ("GET", "/ui/data/tasks/{task_id}/logs"): Row(UI_USER, get("/ui/data/tasks/{command}/logs"), ui=True),
    ("GET", "/workspaces"): Row(UI_USER, get("/workspaces"), ui=True),
    ("GET", "/workspaces/{workspace_id}"): Row(UI_USER, get("/workspaces/{ws}"), ui=True),
    ("GET", "/projects/{project_id}"): Row(UI_USER, get("/projects/{project}"), ui=True),
    ("POST", "/workspaces"): Row(UI_USER, post("/workspaces"), ui=True, ok=frozenset({400})),
    ("POST", "/workspaces/{workspace_id}/archive"): Row(ADMIN_W, post("/workspaces/{ws}/archive"), ui=True),
    ("POST", "/workspaces/{workspace_id}/projects"): Row(CREATE_W, post("/workspaces/{ws}/projects"), ui=True,
                                                         ok=frozenset({409})),  # an empty form: no name
    ("POST", "/projects/{project_id}/archive"): Row(EDIT_W, post("/projects/{project}/archive"), ui=True),
    ("GET", "/ui/static/{path}"): Row(PUBLIC, get("/ui/static/app.css"), ui=True),
    ("GET", "/favicon.ico"): Row(PUBLIC, get("/favicon.ico"), ui=True),
    # Reads no token at all; each scrape renders every series this test process has counted (~0.5 s).
    ("GET", "/metrics"): Row(PUBLIC, get("/metrics"), callers=("anon", "none", "agent")),
}


def app_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves; "WS" for a WebSocket route."""
    found: set[tuple[str, str]] = set()
    for ctx in iter_route_contexts(app.routes):
        route = ctx.original_route
        path = ctx.path_format or getattr(route, "path_format", route.path)
        if isinstance(route, Mount):
            found.add(("GET", path))
        elif not getattr(route, "methods", None):
            found.add(("WS", path))
        else:
            found.update((m, path) for m in route.methods if m != "HEAD")
    return found


def _token(master: Any, kind: auth.TokenKind, **kw: Any) -> str:
    with transaction(master.sessions) as s:
        return auth.issue_token(s, kind, now=master.clock(), ttl=timedelta(hours=1), **kw)


def _ok(r: Any) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def _build(client: TestClient, master: Any) -> World:
    """Workspace W (the admin's) with project P, experiment E (trial T, a checkpoint), a template,
    a model and tasks, all made by `owner` while an Editor of W; then the owner's role is taken."""
    admin = login(client)
    headers = {name: make_user(client, admin, name) for name in sorted(USERS - {"admin"}) + ["victim"]}
    headers["admin"] = admin
    ids = {u["username"]: u["id"] for u in _ok(client.get("/api/v1/users", headers=admin))["users"]}
    ws = _ok(client.post("/api/v1/workspaces", headers=admin, json={"name": "W"}))["workspace"]["id"]
    ws_x = _ok(client.post("/api/v1/workspaces", headers=admin, json={"name": "X"}))["workspace"]["id"]
    group = _ok(client.post("/api/v1/groups", headers=admin, json={"name": "team", "addUsers": [ids["editor"]]}))
    group_id = group["group"]["groupId"]

    def assign(role: int, workspace: int | None, remove: bool = False, **who: int) -> None:
        ra = {"role": {"roleId": role}, "scopeWorkspaceId": workspace}
        body = ({"userRoleAssignments": [{"userId": who["user"], "roleAssignment": ra}]} if "user" in who
                else {"groupRoleAssignments": [{"groupId": who["group"], "roleAssignment": ra}]})
        _ok(client.post(f"/api/v1/roles/{'remove' if remove else 'add'}-assignments", headers=admin, json=body))

    assign(VIEWER, ws, user=ids["viewer"])
    assign(EDITOR, ws, group=group_id)
    assign(WORKSPACE_ADMIN, ws, user=ids["wsadmin"])
    assign(CLUSTER_ADMIN, None, user=ids["clusteradmin"])
    assign(EDITOR, ws, user=ids["owner"])
    owner = headers["owner"]
    project = _ok(client.post(f"/api/v1/workspaces/{ws}/projects", headers=owner, json={"name": "P"}))["project"]["id"]
    exp = create_ok(client, owner, projectId=project)["experiment"]
    trial = only_trial(master, exp["id"])
    _ok(client.post("/api/v1/templates/tmpl", headers=owner,
                    json={"name": "tmpl", "config": {"description": "x"}, "workspaceId": ws}))
    assign(EDITOR, ws, remove=True, user=ids["owner"])
    alloc = _token(master, auth.TokenKind.ALLOCATION, trial_id=trial.id, allocation_id=f"{trial.task_id}.1",
                   user_id=ids["owner"])
    headers["alloc"] = {"Authorization": f"Bearer {alloc}"}
    # Another user's trial (in Uncategorized): its token is code the owner of E does not trust.
    other = only_trial(master, create_ok(client, headers["none"])["experiment"]["id"])
    alloc2 = _token(master, auth.TokenKind.ALLOCATION, trial_id=other.id, allocation_id=f"{other.task_id}.1",
                    user_id=ids["none"])
    headers["alloc2"] = {"Authorization": f"Bearer {alloc2}"}
    checkpoint = ckpt_body(trial, 1)
    _ok(client.post("/api/v1/checkpoints", headers=headers["alloc"], json=checkpoint))
    model = _ok(client.post("/api/v1/models", headers=owner, json={"name": "mdl"}))["model"]["name"]
    _ok(client.post(f"/api/v1/models/{model}/versions", headers=owner, json={"checkpointUuid": checkpoint["uuid"]}))
    command = _ok(client.post("/api/v1/commands", headers=owner,
                              json={**_task_body("commands"), "files": [v1file("ctx.py")]}))
    notebook = _ok(client.post("/api/v1/notebooks", headers=owner, json=_task_body("notebooks")))
    tensorboard = _ok(client.post("/api/v1/tensorboards", headers=owner, json=_task_body("tensorboards", exp["id"])))
    shell = _ok(client.post("/api/v1/shells", headers=owner, json=_task_body("shells")))
    nb_id = notebook["notebook"]["id"]
    with transaction(master.sessions) as s:  # as if placed, started and reporting an address (no one listens)
        s.scalar(select(Allocation).where(Allocation.task_id == nb_id)).state = "running"
        s.get(Task, nb_id).proxy_address = "127.0.0.1:9"
        s.add(Agent(id="a1", pool="default", session_id="s", slots=[{"id": "0", "type": "cpu"}],
                    last_seen=master.clock()))
    agent = _token(master, auth.TokenKind.AGENT_CREDENTIAL, agent_id="a1", pool="default")
    headers["agent"] = {"Authorization": f"Bearer {agent}"}
    headers["anon"] = {}
    tokens = {k: v["Authorization"].removeprefix("Bearer ") for k, v in headers.items() if v}
    return World(client=client, master=master, headers=headers, tokens=tokens, ids=ids, ws=ws, ws_x=ws_x, project=project,
                 experiment=exp["id"], trial=trial.id, task_id=trial.task_id, allocation=f"{trial.task_id}.1",
                 checkpoint=checkpoint["uuid"], model=model, template="tmpl", group=group_id,
                 command=command["command"]["id"], notebook=nb_id,
                 tensorboard=tensorboard["tensorboard"]["id"], shell=shell["shell"]["id"], job=exp["jobId"])


@pytest.fixture(scope="module", autouse=True)
def _quiet() -> Iterator[None]:
    """Some 4,000 requests: their INFO lines (the access log, httpx) cost more than the requests."""
    loggers = [logging.getLogger(name) for name in ("httpx", "shipyard.access")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from control_plane.api.app import create_app
    from control_plane.config import load_config
    from control_plane.master import Master

    tmp = tmp_path_factory.mktemp(f"authz-{request.param}")
    if request.param == "sqlite":
        db_url = f"sqlite:///{tmp / 'shipyard.db'}"
    else:
        db_url = request.getfixturevalue("postgres_server").create_database()
    _from_migrated_schema(db_url, request)
    cfg = load_config(env={}, db_url=db_url, state_dir=str(tmp / "state"), admin_password=ADMIN_PASSWORD,
                      resource_pools=[{"name": "default"}, {"name": "team"}], **TEST_PASSWORD_HASHING)
    master = Master(cfg)
    master.prepare()
    try:
        with TestClient(create_app(master)) as client:
            yield _build(client, master)
    finally:
        master.stop()


def _own_token(w: World, who: str) -> str:
    if who == "agent":
        with transaction(w.master.sessions) as s:
            s.merge(Agent(id=f"a-{next(w.n)}", pool="default", session_id="s", slots=[], last_seen=w.master.clock()))
            agent_id = f"a-{next(w.n) - 1}"
        return _token(w.master, auth.TokenKind.AGENT_CREDENTIAL, agent_id=agent_id, pool="default")
    if who in ("alloc", "alloc2"):
        return _token(w.master, auth.TokenKind.ALLOCATION, trial_id=w.trial, allocation_id=w.allocation,
                      user_id=w.ids["owner"])
    return login(w.client, who, ADMIN_PASSWORD if who == "admin" else f"{who}-password-1")["Authorization"][7:]


def _send(w: World, key: tuple[str, str], row: Row, who: str) -> int:
    w.spend = who in row.allowed
    req = row.call(w, who)
    token = w.tokens.get(who)
    if key[1] in ("/api/v1/auth/logout", "/logout") and token is not None:  # logout revokes the token
        token = _own_token(w, who)
    headers: dict[str, str] = {}
    w.client.cookies.clear()
    for name, value in (req.cookies or {}).items():
        w.client.cookies.set(name, value)
    if row.ui:
        if token is not None:
            w.client.cookies.set(SESSION_COOKIE, token)
            headers["x-csrf-token"] = csrf_token(token)
    elif token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if req.method == "WS":
        from starlette.testclient import WebSocketDenialResponse
        from starlette.websockets import WebSocketDisconnect

        try:
            with w.client.websocket_connect(req.url, headers=headers) as ws:
                ws.close()
            return 101
        except WebSocketDenialResponse as e:  # refused with an HTTP answer before the handshake
            return e.status_code
        except WebSocketDisconnect as e:
            return {4401: 401, 1008: 403, 4404: 404, 1011: 502}.get(e.code, e.code)  # 1011: upstream failed
    r = w.client.request(req.method, req.url, headers=headers, json=req.json, params=req.params, data=req.data,
                         follow_redirects=False)
    w.client.cookies.clear()
    if row.ui and who == "anon" and r.status_code in (303, 307) and "/login" in r.headers.get("location", ""):
        return 401
    return r.status_code


def test_every_route_is_classified(world: World) -> None:
    served = app_routes(world.client.app)
    assert sorted(served - set(ROUTES)) == [], "classify these routes in ROUTES"
    assert sorted(set(ROUTES) - served) == [], "ROUTES names routes the app does not serve"


@pytest.mark.parametrize("key", list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_route(world: World, key: tuple[str, str]) -> None:
    row = ROUTES[key]
    # Another trial's token is tried where E's own is let in (elsewhere E's own is refused already).
    callers = [who for who in row.callers if who != "alloc2" or "alloc" in row.allowed]
    got = {who: _send(world, key, row, who) for who in callers}
    wrong = {}
    for who, status in got.items():
        if who in row.allowed:
            ok = status < 400 or status in row.ok
        elif who in row.deny:
            ok = status == row.deny[who]
        elif who == "anon" or (row.ui and who not in USERS):  # pages: no user session
            ok = status == 401
        else:
            ok = status == (404 if row.hide else 403)
        if not ok:
            wrong[who] = status
    assert wrong == {}, f"{key}: {got}"
