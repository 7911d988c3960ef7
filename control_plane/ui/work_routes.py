"""The web UI's pages for interactive tasks (commands, notebooks and whatever kinds
`core.task_config.TASK_TYPES` lists) and for workspaces and projects, with their actions (kill a
task; create or archive a workspace or a project). Same rules as routes.py: each handler checks the
session, reads and changes through the services the API uses (services/tasks.py,
services/workspaces.py), and a refusal is the API's status and message on a page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.expconf.secrets import redact_config
from control_plane.core.task_config import TASK_TYPES
from control_plane.db.models import Project, User, Workspace
from control_plane.errors import DomainError, bad_request, http_status
from control_plane.master import Master
from control_plane.services import tasks, workspaces
from control_plane.ui import session as sess
from control_plane.ui.routes import (
    UIRoute,
    _final,
    _id,
    _master,
    _read,
    _render,
    _session,
    _write,
    log_answer,
)

router = APIRouter(route_class=UIRoute, include_in_schema=False)


# -- tasks ---------------------------------------------------------------------------------------
def task_row(v: tasks.TaskView, viewer: Principal) -> dict[str, Any]:
    """What the list and the task's page show of a task: its state is its latest allocation's; its
    owner may open it (through /proxy/<id>/) once running with the address it serves on reported
    (a browser reaches its own user's tasks only: services/tasks.py `proxy_target`), and whoever
    sees it (its owner or an admin) may kill it until it ended."""
    state = str(v.alloc.state)
    return {"id": v.task.id, "kind": v.task.kind, "description": v.task.description, "state": state,
            "owner": v.username, "pool": v.task.pool, "slots": v.alloc.slots_needed,
            "created": v.task.created_at, "started": v.alloc.started_at, "ended_at": v.alloc.ended_at,
            "ended": state == st.AllocationState.TERMINATED, "exit": v.alloc.exit_reason,
            "exit_code": v.alloc.exit_code, "waiting": v.alloc.waiting_reason,
            "open": (state == st.AllocationState.RUNNING and v.task.proxy_address is not None
                     and v.task.owner_id == viewer.user_id),
            "kill": state != st.AllocationState.TERMINATED and not v.alloc.kill_requested}


def _tasks_ctx(master: Master, ui: sess.UISession) -> dict[str, Any]:
    with _read(master) as s:
        views = [v for kind in TASK_TYPES for v in tasks.list_tasks(s, ui.principal, kind)]
        s.expunge_all()
    views.sort(key=lambda v: v.task.created_at, reverse=True)
    return {"tasks": [task_row(v, ui.principal) for v in views], "kinds": list(TASK_TYPES)}


@router.get("/tasks")
def tasks_page(request: Request) -> Response:
    ui = _session(request)
    return _render(request, "tasks.html", _tasks_ctx(_master(request), ui), ui=ui)


def _task_id(value: str) -> str:
    if not value or len(value) > 64 or not all(c.isalnum() or c == "-" for c in value):
        raise bad_request(f"{value[:40]!r} is not a valid task id", "taskId")
    return value


def _task_ctx(master: Master, ui: sess.UISession, task_id: str) -> dict[str, Any]:
    with _read(master) as s:
        v = tasks.get(s, ui.principal, task_id)
        s.expunge_all()
    row = task_row(v, ui.principal)
    return {"t": row, "config": redact_config(v.task.config or {}), "final": row["ended"]}  # as the API shows it


FLASH = {"kill": "Killing the task: it stops in a few seconds.", "noop": "Nothing to kill: the task has ended."}


@router.get("/tasks/{task_id}")
def task_page(request: Request, task_id: str) -> Response:
    ui = _session(request)
    ctx = _task_ctx(_master(request), ui, _task_id(task_id))
    page = _render(request, "task.html", {**ctx, "flash": FLASH.get(request.query_params.get("done") or "")}, ui=ui)
    return _final(page, ctx["final"])  # its summary's refresh stops once the task ended


@router.post("/tasks/{task_id}/kill")
async def task_kill(request: Request, task_id: str) -> Response:
    ui = await run_in_threadpool(_session, request)
    await sess.check_csrf(request, ui)
    tid = _task_id(task_id)
    master = _master(request)

    def kill() -> bool:
        with _write(master) as s:
            before = tasks.get(s, ui.principal, tid)
            if before.alloc.state == st.AllocationState.TERMINATED:
                return False
            tasks.kill(s, master, ui.principal, tid)
            return True

    changed = await run_in_threadpool(kill)
    return RedirectResponse(f"/tasks/{tid}?done={'kill' if changed else 'noop'}", status_code=303)


@router.get("/ui/data/tasks/{task_id}/logs")
def task_logs(request: Request, task_id: str) -> Response:
    ui = _session(request)
    tid = _task_id(task_id)

    def find(s: Session) -> tuple[str, bool]:
        v = tasks.get(s, ui.principal, tid)
        return v.task.id, v.alloc.state == st.AllocationState.TERMINATED

    return log_answer(request, ui, find)


# -- workspaces and projects ---------------------------------------------------------------------
def _may_change(ui: sess.UISession, record: Workspace | Project) -> bool:
    """Whether the user may archive the record: the service's own check (owner, admin or a role
    allowing it; never the cluster's default), asked while its session is open."""
    try:
        workspaces._may_reshape(ui.principal, record)
    except DomainError:
        return False
    return True


def _workspaces_ctx(master: Master, ui: sess.UISession, archived: bool) -> dict[str, Any]:
    with _read(master) as s:
        spaces = workspaces.list_workspaces(s, workspaces.WorkspaceFilter(archived=None if archived else False),
                                            by_name=True)
        counts = workspaces.workspace_counts(s, [w.id for w in spaces])
        owners = _usernames(s, [w.owner_id for w in spaces])
        rows = [{"w": w, "n": counts[w.id], "owner": owners.get(w.owner_id, "cluster")} for w in spaces]
        s.expunge_all()
    return {"spaces": rows, "show_archived": archived}


def _usernames(s: Session, ids: list[int | None]) -> dict[int | None, str]:
    wanted = {i for i in ids if i is not None}
    return dict(s.execute(select(User.id, User.username).where(User.id.in_(wanted))).tuples().all()) if wanted else {}


@router.get("/workspaces")
def workspaces_page(request: Request) -> Response:
    ui = _session(request)
    ctx = _workspaces_ctx(_master(request), ui, request.query_params.get("archived") == "1")
    return _render(request, "workspaces.html", ctx, ui=ui)


def _workspace_ctx(master: Master, ui: sess.UISession, ws_id: int) -> dict[str, Any]:
    with _read(master) as s:
        ws = workspaces.get_workspace(s, ws_id)
        projects = workspaces.list_projects(s, workspaces.ProjectFilter(workspace_id=ws.id), sort_by="SORT_BY_NAME")
        counts = workspaces.project_counts(s, [p.id for p in projects])
        owners = _usernames(s, [p.owner_id for p in projects])
        rows = [{"p": p, "n": counts[p.id], "owner": owners.get(p.owner_id, "cluster"), "may_change": _may_change(ui, p)}
                for p in projects]
        may_change = _may_change(ui, ws)
        s.expunge_all()
    return {"ws": ws, "may_change": may_change, "projects": rows}


@router.get("/workspaces/{workspace_id}")
def workspace_page(request: Request, workspace_id: str) -> Response:
    ui = _session(request)
    ctx = _workspace_ctx(_master(request), ui, _id(workspace_id, "workspace"))
    return _render(request, "workspace.html", ctx, ui=ui)


@router.get("/projects/{project_id}")
def project_page(request: Request, project_id: str) -> Response:
    """A project is its experiments: the experiments list filtered to it (with the breadcrumb)."""
    _session(request)
    pid = _id(project_id, "project")
    with _read(_master(request)) as s:
        ws_id = workspaces.get_project(s, pid).workspace_id
    return RedirectResponse("/?" + urlencode({"workspace": ws_id, "project": pid}), status_code=303)


async def _change(request: Request, do: Callable[[Session, Master, sess.UISession, Any], str],
                  refused: Callable[[], str]) -> Response:
    """A workspace or project form: CSRF, then `do` in a write transaction (it returns where to go);
    a refusal is shown on the page `refused()` names, with the service's status and message."""
    ui = await run_in_threadpool(_session, request)
    await sess.check_csrf(request, ui)
    form = await request.form()
    master = _master(request)

    def run() -> str:
        with _write(master) as s:
            return do(s, master, ui, form)

    try:
        target = await run_in_threadpool(run)
    except DomainError as e:
        if http_status(e) == 404:
            raise
        back = refused()
        if back.startswith("/workspaces/"):
            ctx = await run_in_threadpool(_workspace_ctx, master, ui, int(back.rsplit("/", 1)[1]))
            return _render(request, "workspace.html", {**ctx, "refusal": e.message}, http_status(e), ui)
        ctx = await run_in_threadpool(_workspaces_ctx, master, ui, False)
        return _render(request, "workspaces.html", {**ctx, "refusal": e.message}, http_status(e), ui)
    return RedirectResponse(target, status_code=303)


@router.post("/workspaces")
async def workspace_create(request: Request) -> Response:
    def do(s: Session, master: Master, ui: sess.UISession, form: Any) -> str:
        ws = workspaces.create_workspace(s, master, ui.principal,
                                         workspaces.WorkspaceSettings(name=str(form.get("name") or "")))
        return f"/workspaces/{ws.id}"

    return await _change(request, do, lambda: "/workspaces")


@router.post("/workspaces/{workspace_id}/archive")
async def workspace_archive(request: Request, workspace_id: str) -> Response:
    ws_id = _id(workspace_id, "workspace")

    def do(s: Session, master: Master, ui: sess.UISession, form: Any) -> str:
        archived = form.get("archived") != "0"
        workspaces.set_workspace_archived(s, ui.principal, workspaces.get_workspace(s, ws_id), archived)
        return f"/workspaces/{ws_id}"

    return await _change(request, do, lambda: f"/workspaces/{ws_id}")


@router.post("/workspaces/{workspace_id}/projects")
async def project_create(request: Request, workspace_id: str) -> Response:
    ws_id = _id(workspace_id, "workspace")

    def do(s: Session, master: Master, ui: sess.UISession, form: Any) -> str:
        workspaces.create_project(s, master, ui.principal, workspaces.get_workspace(s, ws_id),
                                  str(form.get("name") or ""), str(form.get("description") or ""))
        return f"/workspaces/{ws_id}"

    return await _change(request, do, lambda: f"/workspaces/{ws_id}")


@router.post("/projects/{project_id}/archive")
async def project_archive(request: Request, project_id: str) -> Response:
    pid = _id(project_id, "project")
    where: dict[str, int] = {}

    def do(s: Session, master: Master, ui: sess.UISession, form: Any) -> str:
        p = workspaces.get_project(s, pid)
        where["ws"] = p.workspace_id
        workspaces.set_project_archived(s, ui.principal, p, form.get("archived") != "0")
        return f"/workspaces/{p.workspace_id}"

    return await _change(request, do, lambda: f"/workspaces/{where.get('ws', 1)}")
