"""The web UI's routes: server-rendered pages (Jinja2), the fragments app.js polls to keep them live
(with htmx's request headers, HX-Request and HX-Current-URL, which the front door also reads),
the JSON the charts and the log view poll, and the actions (pause, activate, kill, archive, labels).

HTTP only, like `control_plane.api`: each route checks the session, reads through
`services.dashboard` (or the services the API uses), and renders. Actions call the same services
and the same authorization as the API, so a refusal is the API's status with its message, on a
page (`errors.html`), never a stack trace."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from control_plane import auth
from control_plane.core import states as st
from control_plane.db.models import Experiment
from control_plane.errors import DomainError, bad_request, http_status, not_found
from control_plane.master import Master
from control_plane.services import (
    access,
    cluster_messages,
    dashboard,
    experiments,
    interruptions,
    lifecycle,
    logs,
    models,
    pool_settings,
    trials,
    users,
    workspaces,
)
from control_plane.ui import actions as ui_actions
from control_plane.ui import session as sess
from shipyard_common.wire_model import text_problem

log = logging.getLogger("shipyard.ui")
HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=str(HERE / "templates"))

# The API's statuses for the same domain errors (api/errors.py; tests/ui/test_ui_unit.py keeps them equal).


INT32_MAX = 2**31 - 1

# -- template helpers ----------------------------------------------------------------------------
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _metric(v: Any) -> str:
    if v is None:
        return ""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(x):
        return str(x)
    return f"{x:.6g}"


def _time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else ""


def _length(value: Any) -> str:
    """A searcher length ({"batches": 160}) as words ("160 batches")."""
    if isinstance(value, dict):
        return ", ".join(f"{v} {k}" for k, v in value.items())
    return "" if value is None else str(value)


def _state(value: str | None) -> str:
    return (value or "").removeprefix("STATE_").replace("_", " ").lower()


def _setting(value: Any) -> str:
    """A pool setting as the API gives it (services/pool_settings.seconds): durations in seconds."""
    value = pool_settings.seconds(value)
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


templates.env.filters.update(duration=_duration, bytes=_bytes, metric=_metric, time=_time, state=_state,
                             searcher_length=_length, setting=_setting)


# No other site may frame these pages (a framed kill button is a click away from a click-jacking).
PAGE_HEADERS = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
                "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


def _render(request: Request, name: str, ctx: dict[str, Any], status: int = 200,
            ui: sess.UISession | None = None) -> HTMLResponse:
    banner = _cluster_message(request) if ui is not None and not name.startswith("_") else None
    return templates.TemplateResponse(request, name, {"ui": ui, "states": STATE_CHOICES, "cluster_message": banner,
                                                      **ctx}, status_code=status, headers=PAGE_HEADERS)


def _cluster_message(request: Request) -> str | None:
    """The cluster-wide message shown now (`det master cluster-message set`), for a whole page's
    banner (partials, which htmx swaps into a page, have none)."""
    master = _master(request)
    with master.read_sessions() as s:
        m = cluster_messages.shown(s, master.clock())
        return m.message if m is not None else None


STATE_CHOICES = [s.value for s in st.ExperimentState]


# -- errors as pages -----------------------------------------------------------------------------
def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/ui/data/")


def _return_to(request: Request) -> str | None:
    """The page to come back to after (re-)login: this one for a page GET; for htmx's requests and the
    pages' data fetches, the page that sent them (htmx's HX-Current-URL, else the Referer), when it is
    on this site. None for a form POST (its page is re-opened from `/`)."""
    if request.method == "GET" and not _is_htmx(request) and not _wants_json(request):
        return request.url.path + (f"?{request.url.query}" if request.url.query else "")
    sent = request.headers.get("hx-current-url") or request.headers.get("referer")
    if not sent:
        return None
    url = urlsplit(sent)
    if url.netloc and url.netloc != request.url.netloc:
        return None
    page = url.path + (f"?{url.query}" if url.query else "")
    return page if _safe_next(page) == page and not page.startswith("/login") else None


def _login_target(request: Request, **params: str) -> str:
    nxt = _return_to(request)
    query = {**params, **({"next": nxt} if nxt else {})}
    return "/login" + (f"?{urlencode(query)}" if query else "")


def _login_redirect(request: Request) -> Response:
    target = _login_target(request)
    if _is_htmx(request) or _wants_json(request):
        return Response(status_code=401, headers={"HX-Redirect": target, "X-Login": target})
    return RedirectResponse(target, status_code=303)


def _expired(request: Request) -> Response:
    if _is_htmx(request) or _wants_json(request):
        target = _login_target(request, expired="1")
        resp: Response = Response(status_code=401, headers={"HX-Redirect": target, "X-Login": target})
    else:
        resp = _login_page(request, "Your session has expired or was revoked; log in again.", 401,
                           _safe_next(_return_to(request)))
    sess.clear_session(resp)
    return resp


def _error(request: Request, status: int, message: str, ui: sess.UISession | None = None) -> Response:
    if _wants_json(request):
        return JSONResponse({"code": status, "message": message}, status_code=status)
    return _render(request, "error.html", {"status": status, "message": message}, status, ui)


def not_found_page(request: Request) -> Response:
    """A browser's request for a path nothing serves: a readable 404 page with a link home (the
    navigation too when its session is valid)."""
    try:
        ui: sess.UISession | None = sess.current(request, _master(request))
    except (sess.LoginRequired, sess.SessionExpired):
        ui = None
    path = request.url.path
    shown = path if len(path) <= 200 else path[:200] + "…"
    return _render(request, "error.html", {"status": 404, "message": f"There is no page at {shown}."}, 404, ui)


class UIRoute(APIRoute):
    """Turns what a UI handler raises into a page: a login redirect, the login page again with a
    message, or an error page with the API's status; unexpected errors are logged, not shown."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        inner = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await inner(request)
            except sess.LoginRequired:
                return _login_redirect(request)
            except sess.SessionExpired:
                return _expired(request)
            except sess.CsrfRefused:
                return _error(request, 403, "This form has expired or did not come from this site (CSRF check "
                                            "failed). Reload the page and try again.")
            except DomainError as e:
                return _error(request, http_status(e), e.message, getattr(request.state, "ui_session", None))
            except Exception:
                log.exception("event=ui_error path=%s", request.url.path)
                return _error(request, 500, "Something went wrong on the master; its log has the details.")

        return handler


router = APIRouter(route_class=UIRoute, include_in_schema=False)


def _master(request: Request) -> Master:
    return request.app.state.master


def _session(request: Request) -> sess.UISession:
    ui = sess.current(request, _master(request))
    request.state.ui_session = ui
    return ui


@contextmanager
def _read(master: Master) -> Iterator[Session]:
    with master.read_sessions() as s, s.begin():
        yield s


@contextmanager
def _write(master: Master) -> Iterator[Session]:
    """A write transaction. Never on the event loop (the `async` handlers run it through
    `run_in_threadpool`): waiting there for SQLite's write lock stalls every request of the
    worker, the one holding the lock too when its commit waits on the loop (a deadlock until the
    busy timeout: a 60 s stall and a 500)."""
    with master.sessions() as s, s.begin():
        yield s


def _id(value: str, what: str) -> int:
    """A path id: a positive integer in the ids' range, else a 400 naming it."""
    if not value.isdigit() or int(value) > INT32_MAX or int(value) < 1:
        raise bad_request(f"{value[:40]!r} is not a valid {what} id", f"{what}Id")
    return int(value)


# -- login / logout ------------------------------------------------------------------------------
def _login_page(request: Request, message: str | None, status: int = 200, nxt: str = "/") -> Response:
    token = sess.new_login_csrf()
    resp = _render(request, "login.html", {"message": message, "login_csrf": token, "next": nxt}, status)
    sess.set_login_csrf(resp, request, token)
    return resp


def _safe_next(value: str | None) -> str:
    """Only a path on this site: it starts with one `/` and has no scheme, no host, no backslash
    and no control character (browsers drop tabs and newlines, so `/\t/evil.example` would be
    `//evil.example`); `/` otherwise, never an open redirect."""
    if (not value or len(value) > 2000 or not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)):
        return "/"
    url = urlsplit(value)
    if url.scheme or url.netloc:
        return "/"
    return value


@router.get("/login")
def login_page(request: Request, expired: str | None = None, next: str | None = None, out: str | None = None) -> Response:
    message = None
    if expired:
        message = "Your session has expired or was revoked; log in again."
    elif out:
        message = "You are logged out."
    return _login_page(request, message, nxt=_safe_next(next))


@router.post("/login")
async def login(request: Request) -> Response:
    form = await request.form()
    username = str(form.get("username") or "").strip()
    password = str(form.get("password") or "")
    nxt = _safe_next(str(form.get("next") or "/"))
    if not sess.login_csrf_ok(request, str(form.get(sess.CSRF_FIELD) or "")):
        return _login_page(request, "The login form expired; try again.", 403, nxt)
    if not username or not password:
        return _login_page(request, "Enter a username and a password.", 400, nxt)
    if text_problem(username) or text_problem(password):  # what no database column can take
        return _login_page(request, "The username or password contains a character that is not allowed.", 400, nxt)
    master = _master(request)
    address = request.client.host if request.client else None
    def log_in() -> str:
        with _write(master) as s:
            return users.login(s, master, username, password, is_hashed=False, address=address)[0]

    try:
        token = await run_in_threadpool(log_in)
    except DomainError as e:
        return _login_page(request, e.message, http_status(e), nxt)
    resp = RedirectResponse(nxt, status_code=303)
    sess.set_session(resp, request, token, int(master.config.token_ttl_hours * 3600))
    resp.delete_cookie(sess.LOGIN_CSRF_COOKIE, path="/login")
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    ui = await run_in_threadpool(_session, request)
    await sess.check_csrf(request, ui)
    master = _master(request)

    def revoke() -> None:
        with _write(master) as s:
            auth.revoke_token(s, ui.principal.token_id, now=master.clock())

    await run_in_threadpool(revoke)
    resp = RedirectResponse("/login?out=1", status_code=303)
    sess.clear_session(resp)
    return resp


# -- experiments ---------------------------------------------------------------------------------
def _query(request: Request) -> dashboard.ExperimentQuery:
    q = request.query_params
    state = q.get("state") or None
    if state is not None:
        state = st.state_name(state.upper())
        if state not in STATE_CHOICES:
            raise bad_request(f"unknown state {q.get('state')!r}", "state")
    sort = q.get("sort") or "id"
    if sort not in dashboard.SORTS:
        raise bad_request(f"unknown sort {sort!r}; expected one of {list(dashboard.SORTS)}", "sort")
    try:
        offset = int(q.get("offset") or 0)
        limit = int(q.get("limit") or 50)
    except ValueError:
        raise bad_request("must be integers", "offset") from None
    if offset < 0 or offset > INT32_MAX:
        raise bad_request("must be between 0 and 2147483647", "offset")
    if limit not in dashboard.PAGE_SIZES:
        raise bad_request(f"must be one of {list(dashboard.PAGE_SIZES)}", "limit")
    for name in ("label", "owner", "name"):
        if "\x00" in (q.get(name) or ""):
            raise bad_request("must not contain NUL characters", name)
    home = {name: _id(q[name], name) if q.get(name) else None for name in ("workspace", "project")}
    return dashboard.ExperimentQuery(
        state=state, label=q.get("label") or None, owner=q.get("owner") or None, name=q.get("name") or None,
        archived=q.get("archived") == "1", workspace_id=home["workspace"], project_id=home["project"],
        sort=sort, desc=q.get("order", "desc") != "asc", offset=offset, limit=limit)


def _experiments_ctx(request: Request, master: Master) -> dict[str, Any]:
    q = _query(request)
    with _read(master) as s:
        rows, total = dashboard.experiment_page(s, q, master.clock())
        owners = dashboard.usernames(s)
        spaces = workspaces.list_workspaces(s, workspaces.WorkspaceFilter(archived=False), by_name=True)
        projects = workspaces.list_projects(s, workspaces.ProjectFilter(workspace_id=q.workspace_id or 0, archived=False),
                                            sort_by="SORT_BY_NAME")
        space_names = {w.id: w.name for w in spaces}
        project_choices = [(p.id, p.name if q.workspace_id else f"{space_names.get(p.workspace_id, '?')} / {p.name}")
                           for p in projects]
    params = {k: v for k, v in request.query_params.items() if k != "offset" and v}

    def page_url(offset: int) -> str:
        return "/?" + urlencode({**params, "offset": offset})

    def sort_url(col: str) -> str:
        order = "asc" if q.sort == col and q.desc else "desc"
        return "/?" + urlencode({**{k: v for k, v in params.items() if k not in ("sort", "order")},
                                 "sort": col, "order": order})

    return {"q": q, "rows": rows, "total": total, "owners": owners, "qs": urlencode(dict(request.query_params)),
            "workspaces": [(w.id, w.name) for w in spaces], "projects": project_choices,
            "prev_url": page_url(max(0, q.offset - q.limit)) if q.offset > 0 else None,
            "next_url": page_url(q.offset + q.limit) if q.offset + q.limit < total else None,
            "sort_url": sort_url}


@router.get("/")
def experiments_page(request: Request) -> Response:
    ui = _session(request)
    return _render(request, "experiments.html", _experiments_ctx(request, _master(request)), ui=ui)


@router.get("/experiments")
def experiments_alias(request: Request) -> Response:
    return RedirectResponse("/" + (f"?{request.url.query}" if request.url.query else ""), status_code=303)


@router.get("/ui/fragments/experiments")
def experiments_fragment(request: Request) -> Response:
    ui = _session(request)
    return _render(request, "_experiments_table.html", _experiments_ctx(request, _master(request)), ui=ui)


def _may_change(ui: sess.UISession, exp: Experiment) -> bool:
    """Whether the user may change the experiment (the API's own check: its owner or an admin)."""
    try:
        access.require_owner(ui.principal, exp)
    except DomainError:
        return False
    return True


# A live part's answer says when its object is over: the page's polling then stops (app.js).
FINAL_HEADER = "X-Shipyard-Final"


def _final(response: Response, final: bool) -> Response:
    response.headers[FINAL_HEADER] = "1" if final else "0"
    return response


def _experiment_ctx(master: Master, experiment_id: int, ui: sess.UISession) -> dict[str, Any]:
    with _read(master) as s:
        exp = access.get_experiment(s, experiment_id)
        view = dashboard.experiment_view(s, exp)
        home = workspaces.homes(s, [exp.project_id]).get(exp.project_id)
        s.expunge_all()
    e = view.exp
    return {"v": view, "exp": e, "final": e.state in st.EXP_TERMINAL, "home": home,
            "actions": ui_actions.allowed(e.state, bool(e.archived), _may_change(ui, e)),
            "may_change": _may_change(ui, e), "action_labels": ui_actions.LABELS}


def _flash(ctx: dict[str, Any], done: str | None, noop: str | None) -> str | None:
    """The message of the action just done (`?done=kill`) or skipped (`?noop=kill`): words chosen
    here, never text from the address (a link must not put its own words on the page)."""
    action = done or noop
    if not action or action not in ui_actions.ACTIONS:
        return None
    return ui_actions.outcome(action, bool(done), ctx["exp"].id, _state(ctx["exp"].state))


@router.get("/experiments/{experiment_id}")
def experiment_page(request: Request, experiment_id: str, done: str | None = None, noop: str | None = None) -> Response:
    ui = _session(request)
    ctx = _experiment_ctx(_master(request), _id(experiment_id, "experiment"), ui)
    return _render(request, "experiment.html", {**ctx, "flash": _flash(ctx, done, noop)}, ui=ui)


EXPERIMENT_PARTS = {"summary": "_experiment_summary.html", "tables": "_experiment_tables.html"}


@router.get("/ui/fragments/experiments/{experiment_id}")
def experiment_fragment(request: Request, experiment_id: str, part: str = "summary") -> Response:
    ui = _session(request)
    if part not in EXPERIMENT_PARTS:
        raise bad_request(f"unknown part {part[:40]!r}; expected one of {sorted(EXPERIMENT_PARTS)}", "part")
    ctx = _experiment_ctx(_master(request), _id(experiment_id, "experiment"), ui)
    return _final(_render(request, EXPERIMENT_PARTS[part], ctx, ui=ui), ctx["final"])


@router.get("/ui/data/experiments/{experiment_id}/metrics")
def experiment_metric_names(request: Request, experiment_id: str) -> Response:
    _session(request)
    master = _master(request)
    with _read(master) as s:
        exp = access.get_experiment(s, _id(experiment_id, "experiment"))
        trial_ids = [t.id for t in trials.trials_of(s, exp.id)]
        names = dashboard.metric_names(s, trial_ids)
        metric = dashboard.searcher_goal(exp.config).metric
    return JSONResponse({"groups": names, "searcherMetric": metric})


def _series_json(srs: dashboard.Series) -> dict[str, Any]:
    return {"trialId": srs.trial_id, "x": [p[0] for p in srs.points], "y": [p[1] for p in srs.points],
            "total": srs.total}


def _group_metric(request: Request) -> tuple[str, str]:
    group = request.query_params.get("group") or "validation"
    metric = request.query_params.get("metric") or ""
    if not metric or len(metric) > 255 or "\x00" in metric:
        raise bad_request("a metric name is required (at most 255 characters)", "metric")
    if len(group) > 64 or "\x00" in group:
        raise bad_request("at most 64 characters", "group")
    return group, metric


@router.get("/ui/data/experiments/{experiment_id}/curves")
def experiment_curves(request: Request, experiment_id: str) -> Response:
    """One metric of every trial, each downsampled to at most `dashboard.MAX_POINTS` points."""
    _session(request)
    group, metric = _group_metric(request)
    master = _master(request)
    with _read(master) as s:
        exp = access.get_experiment(s, _id(experiment_id, "experiment"))
        rows = trials.trials_of(s, exp.id)
        out = [_series_json(dashboard.series(s, t.id, group, metric)) for t in rows]
        hp = [{"trialId": t.id, "hparams": t.hparams or {}, "best": t.best_validation, "state": t.state}
              for t in rows]
        best = experiments.best_trials(s, [exp]).get(exp.id)
        log_hparams = [name for name, spec in ((exp.config or {}).get("hyperparameters") or {}).items()
                       if isinstance(spec, dict) and spec.get("type") == "log"]
    return JSONResponse({"group": group, "metric": metric, "series": out, "trials": hp,
                         "bestTrialId": best.trial_id if best else None, "logHparams": log_hparams})


# -- actions -------------------------------------------------------------------------------------
ACTIONS = ui_actions.ACTIONS


def _act(master: Master, ui: sess.UISession, exp_id: int, action: str) -> bool:
    """Do the action as the API would (same services, same checks); whether it changed anything."""
    with _write(master) as s:
        exp = access.get_experiment(s, exp_id)
        access.require_owner(ui.principal, exp)
        before = (exp.state, exp.archived)
        if action == "archive":
            experiments.archive(exp)
        elif action == "unarchive":
            experiments.unarchive(exp)
        else:
            lifecycle.set_experiment_state(s, master, exp, action)
        return (exp.state, exp.archived) != before


@router.post("/experiments/{experiment_id}/actions/{action}")
async def experiment_action(request: Request, experiment_id: str, action: str) -> Response:
    """The action, then its page saying what happened; a refusal (the API's status and message)
    is shown on the experiment's page, above its actions."""
    ui = await run_in_threadpool(_session, request)
    await sess.check_csrf(request, ui)
    exp_id = _id(experiment_id, "experiment")
    if action not in ACTIONS:
        raise bad_request(f"unknown action {action!r}; expected one of {list(ACTIONS)}", "action")
    master = _master(request)
    try:
        changed = await run_in_threadpool(_act, master, ui, exp_id, action)
    except DomainError as e:
        if http_status(e) == 404:
            raise
        ctx = await run_in_threadpool(_experiment_ctx, master, exp_id, ui)
        return _render(request, "experiment.html", {**ctx, "refusal": f"{action}: {e.message}"}, http_status(e), ui)
    log.info("event=experiment_%s experiment_id=%s by=%s via=ui changed=%s", action, exp_id, ui.principal.username,
             changed)
    return RedirectResponse(f"/experiments/{exp_id}?" + urlencode({"done" if changed else "noop": action}),
                            status_code=303)


@router.post("/experiments/{experiment_id}/labels")
async def experiment_labels(request: Request, experiment_id: str) -> Response:
    ui = await run_in_threadpool(_session, request)
    await sess.check_csrf(request, ui)
    exp_id = _id(experiment_id, "experiment")
    form = await request.form()
    add = str(form.get("add") or "")
    remove = str(form.get("remove") or "")
    master = _master(request)

    def change() -> None:
        with _write(master) as s:
            exp: Experiment = access.get_experiment(s, exp_id)
            access.require_owner(ui.principal, exp)
            if remove:
                experiments.remove_label(exp, remove)
            else:
                experiments.add_label(exp, add.strip() if add.strip() else add)

    await run_in_threadpool(change)
    return RedirectResponse(f"/experiments/{exp_id}", status_code=303)


# -- trials --------------------------------------------------------------------------------------
def _trial_ctx(master: Master, trial_id: int) -> dict[str, Any]:
    with _read(master) as s:
        trial = access.get_trial(s, trial_id)
        view = dashboard.trial_view(s, trial)
        s.expunge_all()
    return {"v": view, "trial": view.trial, "exp": view.exp, "final": view.trial.state in st.TRIAL_TERMINAL}


@router.get("/trials/{trial_id}")
def trial_page(request: Request, trial_id: str) -> Response:
    ui = _session(request)
    return _render(request, "trial.html", _trial_ctx(_master(request), _id(trial_id, "trial")), ui=ui)


TRIAL_PARTS = {"summary": "_trial_live.html", "checkpoints": "_trial_checkpoints.html"}


@router.get("/ui/fragments/trials/{trial_id}")
def trial_fragment(request: Request, trial_id: str, part: str = "summary") -> Response:
    ui = _session(request)
    if part not in TRIAL_PARTS:
        raise bad_request(f"unknown part {part[:40]!r}; expected one of {sorted(TRIAL_PARTS)}", "part")
    ctx = _trial_ctx(_master(request), _id(trial_id, "trial"))
    return _final(_render(request, TRIAL_PARTS[part], ctx, ui=ui), ctx["final"])


@router.get("/ui/data/trials/{trial_id}/metrics")
def trial_metrics(request: Request, trial_id: str) -> Response:
    """Every metric of the trial's training and validation groups, each downsampled."""
    _session(request)
    master = _master(request)
    tid = _id(trial_id, "trial")
    with _read(master) as s:
        access.get_trial(s, tid)
        names = dashboard.metric_names(s, [tid])
        groups = {g: [{"metric": n, **_series_json(dashboard.series(s, tid, g, n))} for n in metrics]
                  for g, metrics in names.items()}
    return JSONResponse({"groups": groups})


LOG_BATCH = 1000


def log_answer(request: Request, ui: sess.UISession, find: Callable[[Session], tuple[str, bool]]) -> Response:
    """Log lines after `after` (a cursor), matching `search` (plain text, any case) if given, of the
    task `find` names (with whether it is over), read in the same transaction: a trial's or a task's."""
    master = _master(request)
    after_raw = request.query_params.get("after") or ""
    if after_raw and not after_raw.isdigit():
        raise bad_request("must be a cursor from an earlier answer", "after")
    flt = logs.LogFilter(search_text=request.query_params.get("search") or None)
    lease = logs.search_slot(master.quotas, ui.principal, flt)
    try:
        with _read(master) as s:
            task_id, over = find(s)
            page = logs.log_page(s, task_id, flt, int(after_raw) if after_raw else None, desc=False, batch=LOG_BATCH)
            lines = [{"id": r.id, "t": _time(r.timestamp), "level": r.level, "rank": r.rank,
                      "log": r.log.removesuffix("\n")} for r in page.rows]
    finally:
        lease.release()
    return JSONResponse({"lines": lines, "cursor": page.cursor, "more": page.fetched == LOG_BATCH, "over": over})


@router.get("/ui/data/trials/{trial_id}/logs")
def trial_logs(request: Request, trial_id: str) -> Response:
    ui = _session(request)
    tid = _id(trial_id, "trial")

    def find(s: Session) -> tuple[str, bool]:
        trial = access.get_trial(s, tid)
        return trial.task_id, trial.state in st.TRIAL_TERMINAL

    return log_answer(request, ui, find)


# -- cluster -------------------------------------------------------------------------------------
def _cluster_ctx(master: Master) -> dict[str, Any]:
    with _read(master) as s:
        now = master.clock()
        pools = dashboard.cluster_view(s, master, now)
        notices = {p.name: interruptions.notices(s, p.name) for p in pools}
        s.expunge_all()
    return {"pools": pools, "now": now, "notices": notices}  # each pool's history is the database's (p.history)


@router.get("/cluster")
def cluster_page(request: Request) -> Response:
    ui = _session(request)
    return _render(request, "cluster.html", _cluster_ctx(_master(request)), ui=ui)


@router.get("/ui/fragments/cluster")
def cluster_fragment(request: Request) -> Response:
    ui = _session(request)
    return _render(request, "_cluster_live.html", _cluster_ctx(_master(request)), ui=ui)


@router.get("/ui/data/pools/{name}/history")
def pool_history(request: Request, name: str) -> Response:
    _session(request)
    master = _master(request)
    if master.config.pool(name) is None:
        raise not_found(f"resource pool {name[:64]!r}")
    with _read(master) as s:
        h = dashboard.slot_history(s, name, master.clock())
    return JSONResponse({k: {"x": [p[0] for p in v], "y": [p[1] for p in v]} for k, v in h.items()})


# -- models --------------------------------------------------------------------------------------
@router.get("/models")
def models_page(request: Request) -> Response:
    ui = _session(request)
    master = _master(request)
    with _read(master) as s:
        rows = dashboard.models_view(s)
        s.expunge_all()
    return _render(request, "models.html", {"models": rows}, ui=ui)


def _model_ctx(master: Master, name: str, ui: sess.UISession) -> dict[str, Any]:
    with _read(master) as s:
        row = dashboard.model_view(s, name)
        may_edit = models.may_edit(s, ui.principal, row.model)
        s.expunge_all()
    return {"row": row, "model": row.model, "may_edit": may_edit,
            "metadata_json": json.dumps(row.model.metadata_ or {}, indent=2, sort_keys=True)}


@router.get("/models/{model_name}")
def model_page(request: Request, model_name: str) -> Response:
    ui = _session(request)
    return _render(request, "model.html", {**_model_ctx(_master(request), model_name, ui),
                                           "flash": "Saved." if request.query_params.get("saved") else None}, ui=ui)


def _metadata(raw: Any) -> dict[str, Any] | None:
    """The form's metadata: absent leaves it; else a JSON object (no NUL: no database stores it)."""
    if raw is None:
        return None
    text = str(raw).strip() or "{}"
    try:
        value = json.loads(text)
    except ValueError as e:
        raise bad_request(f"is not JSON: {e}", "metadata") from None
    if not isinstance(value, dict):
        raise bad_request("must be a JSON object", "metadata")
    if "\x00" in json.dumps(value, ensure_ascii=False):
        raise bad_request("must not contain NUL characters", "metadata")
    return value


@router.post("/models/{model_name}/edit")
async def model_edit(request: Request, model_name: str) -> Response:
    """Description, labels (comma-separated), metadata (a JSON object) and notes, as the model's
    owner or an admin, through the service `PATCH /api/v1/models/{name}` calls; a refusal (the
    service's status and message, or a 400 naming the field) is shown on the model's page."""
    ui = await run_in_threadpool(_session, request)
    await sess.check_csrf(request, ui)
    form = await request.form()
    description = str(form.get("description") or "")
    labels = [x.strip() for x in str(form.get("labels") or "").split(",") if x.strip()]
    notes = str(form["notes"]) if "notes" in form else None
    master = _master(request)

    def change() -> None:
        metadata = _metadata(form.get("metadata"))
        with _write(master) as s:
            models.edit_model(s, master, ui.principal, models.get_model(s, model_name), description, labels,
                              metadata=metadata, notes=notes)

    try:
        await run_in_threadpool(change)
    except DomainError as e:
        if http_status(e) == 404:
            raise
        ctx = await run_in_threadpool(_model_ctx, master, model_name, ui)
        return _render(request, "model.html", {**ctx, "refusal": f"edit: {e.message}"}, http_status(e), ui)
    return RedirectResponse(f"/models/{quote(model_name, safe='')}?saved=1", status_code=303)
