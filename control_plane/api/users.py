"""Auth, users, and master info: /info, /api/v1/master, /api/v1/auth/*, /api/v1/me, /api/v1/users."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from pydantic import Field
from sqlalchemy.orm import Session

import control_plane
from control_plane import auth
from control_plane.api import deps
from control_plane.api.wire import INT32_MAX, Id, Int32, StrictWire, pagination, ts
from control_plane.auth import Principal
from control_plane.db.models import User
from control_plane.errors import bad_request, not_found
from control_plane.master import Master
from control_plane.services import leadership, users

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


# The version of Determined's API this master answers as. Determined's `det` compares /info's
# `version` with its own and warns on any difference ("Master version ... is less than CLI
# version ..."; a PEP 440 local version such as 0.38.1+shipyard.0.1.0 sorts above 0.38.1 and draws
# the opposite warning): the API version is what that comparison is about. Shipyard's own version
# is `shipyardVersion`.
DETERMINED_API_VERSION = "0.38.1"


def master_info(master: Master) -> dict[str, Any]:
    return {
        "version": DETERMINED_API_VERSION,
        "shipyardVersion": control_plane.__version__,
        "masterId": master.master_id,
        "clusterId": master.cluster_id,
        "clusterName": master.config.cluster_name,
        "telemetryEnabled": False,
        "strictJobQueueControl": False,
        "hasCustomLogo": False,
        "rbacEnabled": True,  # roles and groups (api/rbac.py, api/groups.py)
        "userManagementEnabled": True,
        "featureSwitches": [],
        "ssoProviders": [],
        "product": "PRODUCT_UNSPECIFIED",
    }


@router.get("/info")
@router.get("/api/v1/master")
async def get_master_info(master: Master = Depends(deps.get_master)) -> dict[str, Any]:
    # async and from memory: answers on the event loop even when every worker thread is busy.
    return master_info(master)


@router.get("/api/v1/master/leader")
def get_leader(
    _p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Which master runs the control loops (the leadership lease), and whether it is this one."""
    lead = leadership.current_leader(db)
    return {
        "masterId": master.master_id,
        "leading": lead is not None and lead.holder == master.master_id and lead.expires_at > master.clock(),
        "leader": None if lead is None else {
            "masterId": lead.holder, "token": lead.token, "address": lead.address,
            "acquiredAt": ts(lead.acquired_at), "expiresAt": ts(lead.expires_at),
        },
    }


class LoginRequest(StrictWire):
    username: str = Field(min_length=1, max_length=128)
    password: str = Field(max_length=1024)
    is_hashed: bool = False


@router.post("/api/v1/auth/login")
def login(
    body: LoginRequest,
    request: Request,
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    # The client's address: the peer's, or what a trusted proxy forwarded (config.trusted_proxies,
    # api/app.py), never X-Forwarded-For from anyone else: an attacker would pick a fresh "address"
    # for every guess.
    address = request.client.host if request.client else None
    token, u = users.login(db, master, body.username, body.password, is_hashed=body.is_hashed, address=address)
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
    # Determined's v1User carries these; accepted and ignored (agentUserGroup refused when set: _no_agent_user).
    id: Int32 | None = None
    agent_user_group: dict[str, Any] | None = None
    remote: bool | None = None


def _no_agent_user(group: dict[str, Any] | None, field: str) -> None:
    """`det user link-with-agent-user` (agentUserGroup): Shipyard runs every user's tasks as an
    account of their own on the agent (never a shared or chosen one, issue 27), so a link would be
    stored and not obeyed: refused, saying why, rather than accepted and ignored."""
    if group and any(v not in (None, "", 0) for v in group.values()):
        raise bad_request("linking a user to an agent user is not supported: Shipyard runs each user's tasks as "
                          "that user's own uid on the agents (task_uid_base + user id)", field)


class PostUserRequest(StrictWire):
    user: UserIn
    password: str | None = Field(default=None, max_length=1024)
    is_hashed: bool = False


@router.post("/api/v1/users")
def create_user(
    body: PostUserRequest,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    _no_agent_user(body.user.agent_user_group, "user.agentUserGroup")
    new = users.NewUser(username=body.user.username, password=body.password, is_hashed=body.is_hashed,
                        admin=body.user.admin, active=body.user.active, display_name=body.user.display_name)
    return {"user": user_json(users.create_user(db, master, new))}


@router.get("/api/v1/users")
def list_users(
    _p: Principal = Depends(deps.user),
    db: Session = Depends(deps.get_db, scope="function"),
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 0,
    name: str | None = None,
    active: bool | None = None,
    admin: bool | None = None,
) -> dict[str, Any]:
    found, total = users.list_users(db, users.UserFilter(name=name, active=active, admin=admin), offset, limit)
    return {"users": [user_json(u) for u in found],
            "pagination": pagination(offset, limit, total, len(found)).model_dump(by_alias=True)}


@router.get("/api/v1/users/{userId}")
def get_user(userId: Id, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return {"user": user_json(users.get_user(db, userId))}


@router.get("/api/v1/users/{username}/by-username")
def get_user_by_username(username: str, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return {"user": user_json(users.get_user_by_name(db, username))}


@router.post("/api/v1/users/{userId}/password")
def set_password(
    userId: Id,
    password: Annotated[str, Body(max_length=1024)],
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    isHashed: bool = False,
) -> dict[str, Any]:
    """Determined sends the (client-hashed) password as the bare JSON string body."""
    return {"user": user_json(users.set_password(db, master, p, userId, password, is_hashed=isHashed))}


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
    userId: Id,
    body: PatchUser,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    _no_agent_user(body.agent_user_group, "agentUserGroup")
    change = users.UserChange(username=body.username, display_name=body.display_name, admin=body.admin,
                              active=body.active, password=body.password, is_hashed=body.is_hashed)
    return {"user": user_json(users.change_user(db, master, p, userId, change))}
