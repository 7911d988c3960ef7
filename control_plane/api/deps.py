"""Request dependencies: the master, a database session per request, and the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from control_plane.api.wire import INT32_MAX
from control_plane.auth import Principal, TokenKind, resolve_token
from control_plane.errors import forbidden, unauthenticated
from control_plane.frontdoor import fastjson
from control_plane.frontdoor.admission import Ticket
from control_plane.frontdoor.admission import ticket as admission_ticket
from control_plane.master import Master
from control_plane.services import authz

M = TypeVar("M", bound=BaseModel)


async def get_master(request: Request) -> Master:
    # async: answered on the event loop, so it never waits for a worker thread (health checks
    # depend on it and must answer while every thread is busy).
    return request.app.state.master


async def ticket(request: Request) -> Ticket:
    """The request's admission slot (frontdoor/admission.py): long-polls give it back while they wait."""
    return admission_ticket(request.scope)


def get_db(request: Request, master: Master = Depends(get_master)) -> Iterator[Session]:
    """A session whose transaction commits when the handler returns normally and rolls back on
    any error, so a failed request leaves nothing half-written. GETs read without taking
    SQLite's write lock. Use it with `Depends(get_db, scope="function")`: the commit must happen
    before the response is sent, or a client could act on a change not yet committed (or lost)."""
    factory = master.read_sessions if request.method in ("GET", "HEAD") else master.sessions
    with factory() as session, session.begin():
        yield session


# Determined's task sessions (`determined.core`, `api.TaskSession`) send their token in this gRPC
# gateway header instead of Authorization, as `Bearer <token>`.
TASK_TOKEN_HEADER = "grpc-metadata-x-allocation-token"


def header_token(request: HTTPConnection) -> str | None:
    """The token of an `Authorization: Bearer` header (or Determined's task-token header)."""
    for name in ("authorization", TASK_TOKEN_HEADER):
        header = request.headers.get(name, "")
        if header.lower().startswith("bearer "):
            return header[7:].strip() or None
    return None


def bearer_token(request: HTTPConnection) -> str | None:
    # Determined's web UI uses a cookie; accept it too.
    return header_token(request) or request.cookies.get("auth") or None


def principal(request: Request, master: Master = Depends(get_master)) -> Principal:
    with master.read_sessions() as s:
        return principal_in(s, request, master)


def principal_in(s: Session, request: Request, master: Master) -> Principal:
    """The caller, resolved in an open read session (a hot path checks its rights in the same one)."""
    token = bearer_token(request)
    if not token:
        raise unauthenticated()
    p = resolve_token(s, token, now=master.clock())
    if p is None:
        raise unauthenticated("invalid or expired token")
    return p


def caller_in(request: Request, master: Master) -> Callable[[Session], Principal]:
    """`user_or_allocation` as a function of a session: a hot path (frontdoor/fastjson.py) resolves its
    caller inside the service's own transaction, in the one worker thread it uses."""

    def caller(s: Session) -> Principal:
        return require_user_or_allocation(principal_in(s, request, master))

    return caller


async def trial_report(request: Request, model: type[M]) -> tuple[int, M, Master] | None:
    """What a trial's report on a fast path needs: the trial id of the path, the body as `model`,
    the master; None (FastAPI's usual path answers) for anything it cannot take as is."""
    trial_id = fastjson.path_int(request, "trialId", 1, INT32_MAX)
    if trial_id is None or not bearer_token(request):
        return None
    body = await fastjson.parse_body(request, model)
    if body is None:
        return None
    return trial_id, body, request.app.state.master


# The checks below are pure (no I/O): async, so FastAPI answers them on the event loop instead of
# sending each through a worker thread of its own.
async def user(p: Principal = Depends(principal)) -> Principal:
    if not p.is_user:
        raise forbidden(f"a {p.kind.value} token cannot do this")
    return p


async def admin(p: Principal = Depends(user), master: Master = Depends(get_master)) -> Principal:
    """An admin: the user's admin flag, or the ClusterAdmin role held cluster-wide (directly or
    through a group; services/authz.py), asked of the database only when the flag is not set."""
    if p.admin:
        return p
    if p.user_id is not None and await run_in_threadpool(_cluster_admin_by_role, master, p.user_id):
        return p
    raise forbidden("admin only (the admin flag or the ClusterAdmin role cluster-wide)")


def _cluster_admin_by_role(master: Master, user_id: int) -> bool:
    with master.read_sessions() as s:
        return authz.holds_cluster_admin(s, user_id)


def require_agent(p: Principal) -> Principal:
    if p.kind not in (TokenKind.AGENT, TokenKind.BOOTSTRAP, TokenKind.AGENT_CREDENTIAL):
        raise forbidden("agent credential required")
    return p


async def agent(p: Principal = Depends(principal)) -> Principal:
    return require_agent(p)


def require_user_or_allocation(p: Principal) -> Principal:
    if p.kind not in (TokenKind.USER, TokenKind.ALLOCATION):
        raise forbidden(f"a {p.kind.value} token cannot do this")
    return p


async def user_or_allocation(p: Principal = Depends(principal)) -> Principal:
    return require_user_or_allocation(p)


def require_trial_access(p: Principal, trial_id: int) -> None:
    """An allocation token may only touch its own trial."""
    if p.kind is TokenKind.ALLOCATION and p.trial_id != trial_id:
        raise forbidden("this token belongs to another trial")
