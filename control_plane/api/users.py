"""Auth, users, and master info: /info, /api/v1/master, /api/v1/auth/*, /api/v1/me, /api/v1/users."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query
from pydantic import Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import control_plane
from control_plane import auth
from control_plane.api import deps
from control_plane.api.wire import StrictWire, pagination, ts
from control_plane.auth import Principal, TokenKind
from control_plane.db.models import Token, User
from control_plane.errors import PermissionDenied, bad_request, conflict, forbidden, not_found
from control_plane.master import Master

log = logging.getLogger("shipyard.api.users")
router = APIRouter()


def user_json(u: User) -> dict[str, Any]:
    return {
        "id": u.id,
        "username": u.username,
        "admin": u.admin,
        "active": u.active,
        "displayName": u.display_name or "",
        "modifiedAt": ts(u.modified_at),
        "lastAuthAt": ts(u.last_auth_at),
        "remote": False,
    }


def master_info(master: Master) -> dict[str, Any]:
    return {
        "version": control_plane.__version__,
        "masterId": master.master_id,
        "clusterId": master.cluster_id,
        "clusterName": master.config.cluster_name,
        "telemetryEnabled": False,
        "strictJobQueueControl": False,
        "hasCustomLogo": False,
        "rbacEnabled": False,
        "userManagementEnabled": True,
        "featureSwitches": [],
        "ssoProviders": [],
        "product": "PRODUCT_UNSPECIFIED",
    }


@router.get("/info")
@router.get("/api/v1/master")
def get_master_info(master: Master = Depends(deps.get_master)) -> dict[str, Any]:
    return master_info(master)


class LoginRequest(StrictWire):
    username: str = Field(min_length=1, max_length=128)
    password: str = Field(max_length=1024)
    is_hashed: bool = False


@router.post("/api/v1/auth/login")
def login(
    body: LoginRequest, master: Master = Depends(deps.get_master), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    u = db.scalar(select(User).where(User.username == body.username))
    # The same answer for an unknown user and a wrong password: no user enumeration.
    if u is None or not auth.verify_password(u.password_hash, body.password, is_hashed=body.is_hashed):
        log.info("event=login_failed username=%s", body.username)
        raise PermissionDenied("invalid credentials")
    if not u.active:
        raise PermissionDenied("user is deactivated")
    now = master.clock()
    u.last_auth_at = now
    token = auth.issue_token(
        db, TokenKind.USER, now=now, ttl=timedelta(hours=master.config.token_ttl_hours), user_id=u.id
    )
    log.info("event=login username=%s", u.username)
    return {"token": token, "user": user_json(u)}


@router.post("/api/v1/auth/logout")
def logout(
    p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    auth.revoke_token(db, p.token_id, now=master.clock())
    return {}


@router.get("/api/v1/me")
def me(p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    u = db.get(User, p.user_id)
    if u is None:
        raise not_found("user")
    return {"user": user_json(u)}


class UserIn(StrictWire):
    username: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
    admin: bool = False
    active: bool = True
    display_name: str | None = Field(default=None, max_length=255)
    # Determined's v1User carries these; accepted and ignored.
    id: int | None = None
    agent_user_group: dict[str, Any] | None = None
    remote: bool | None = None


class PostUserRequest(StrictWire):
    user: UserIn
    password: str | None = Field(default=None, max_length=1024)
    is_hashed: bool = False


def _check_new_password(password: str | None, is_hashed: bool, field: str) -> str:
    if password is None or password == "":
        raise bad_request("a password is required: accounts without a password are not allowed", field)
    if is_hashed:
        # A client-side hash of the empty string is still an empty password.
        if password == auth.client_hash(""):
            raise bad_request("a password is required: accounts without a password are not allowed", field)
        return auth.hash_password(password, is_hashed=True)
    if problem := auth.password_problem(password):
        raise bad_request(problem, field)
    return auth.hash_password(password)


@router.post("/api/v1/users")
def create_user(
    body: PostUserRequest,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    pw_hash = _check_new_password(body.password, body.is_hashed, "password")
    if db.scalar(select(User).where(User.username == body.user.username)) is not None:
        raise conflict(f"user {body.user.username!r} already exists")
    now = master.clock()
    u = User(
        username=body.user.username,
        password_hash=pw_hash,
        admin=body.user.admin,
        active=body.user.active,
        display_name=body.user.display_name,
        created_at=now,
        modified_at=now,
    )
    db.add(u)
    db.flush()
    log.info("event=user_created username=%s admin=%s", u.username, u.admin)
    return {"user": user_json(u)}


@router.get("/api/v1/users")
def list_users(
    _p: Principal = Depends(deps.user),
    db: Session = Depends(deps.get_db, scope="function"),
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 0,
    name: str | None = None,
    active: bool | None = None,
    admin: bool | None = None,
) -> dict[str, Any]:
    q = select(User)
    if name:
        q = q.where(User.username.contains(name))
    if active is not None:
        q = q.where(User.active == active)
    if admin is not None:
        q = q.where(User.admin == admin)
    total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
    q = q.order_by(User.id).offset(offset)
    if limit:
        q = q.limit(limit)
    users = list(db.scalars(q))
    return {"users": [user_json(u) for u in users], "pagination": pagination(offset, limit, total, len(users)).model_dump(by_alias=True)}


def _get_user(db: Session, user_id: int) -> User:
    u = db.get(User, user_id)
    if u is None:
        raise not_found(f"user {user_id}")
    return u


@router.get("/api/v1/users/{userId}")
def get_user(userId: int, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return {"user": user_json(_get_user(db, userId))}


@router.get("/api/v1/users/{username}/by-username")
def get_user_by_username(username: str, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    u = db.scalar(select(User).where(User.username == username))
    if u is None:
        raise not_found(f"user {username!r}")
    return {"user": user_json(u)}


@router.post("/api/v1/users/{userId}/password")
def set_password(
    userId: int,
    password: Annotated[str, Body(max_length=1024)],
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    isHashed: bool = False,
) -> dict[str, Any]:
    """Determined sends the (client-hashed) password as the bare JSON string body."""
    if p.user_id != userId and not p.admin:
        raise forbidden("only an admin can change another user's password")
    u = _get_user(db, userId)
    # Determined's own client always sends the client-side hash here; a 128-hex string is
    # taken as one, anything else as a plain password.
    looks_hashed = isHashed or (len(password) == 128 and all(c in "0123456789abcdef" for c in password))
    u.password_hash = _check_new_password(password, looks_hashed, "password")
    u.modified_at = master.clock()
    # Changing a password ends every other session of that user.
    for t in db.scalars(select(Token).where(Token.user_id == u.id, Token.revoked_at.is_(None))):
        if t.id != p.token_id:
            t.revoked_at = master.clock()
    log.info("event=password_changed username=%s by=%s", u.username, p.username)
    return {"user": user_json(u)}


class PatchUser(StrictWire):
    username: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
    display_name: str | None = Field(default=None, max_length=255)
    admin: bool | None = None
    active: bool | None = None
    password: str | None = Field(default=None, max_length=1024)
    is_hashed: bool = False
    agent_user_group: dict[str, Any] | None = None
    remote: bool | None = None


@router.patch("/api/v1/users/{userId}")
def patch_user(
    userId: int,
    body: PatchUser,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    u = _get_user(db, userId)
    own = p.user_id == userId
    if not p.admin and (not own or body.admin is not None or body.active is not None or body.username is not None):
        raise forbidden("only an admin can change that")
    if body.active is False and own:
        raise bad_request("you cannot deactivate yourself", "active")
    if body.username is not None and body.username != u.username:
        if db.scalar(select(User).where(User.username == body.username)) is not None:
            raise conflict(f"user {body.username!r} already exists")
        u.username = body.username
    if body.display_name is not None:
        u.display_name = body.display_name
    if body.admin is not None:
        u.admin = body.admin
    if body.active is not None:
        u.active = body.active
        if not body.active:
            for t in db.scalars(select(Token).where(Token.user_id == u.id, Token.revoked_at.is_(None))):
                t.revoked_at = master.clock()
    if body.password is not None:
        u.password_hash = _check_new_password(body.password, body.is_hashed, "password")
    u.modified_at = master.clock()
    log.info("event=user_patched username=%s by=%s", u.username, p.username)
    return {"user": user_json(u)}
