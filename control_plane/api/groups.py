"""User groups (Determined 0.38.1's /api/v1/groups, as `det user-group` calls them):
services/groups.py does the work."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.users import user_json
from control_plane.api.wire import Count32, Id, ProtoWire
from control_plane.auth import Principal
from control_plane.db.models import UserGroup
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import groups

router = APIRouter()


def group_details(db: Session, g: UserGroup) -> dict[str, Any]:
    """Determined's v1GroupDetails."""
    return {"groupId": g.id, "name": g.name, "users": [user_json(u) for u in groups.members(db, g.id)]}


class CreateGroup(ProtoWire):
    name: str = Field(default="", max_length=255)
    add_users: list[Id] = []


@router.post("/api/v1/groups")
def create_group(body: CreateGroup, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    g = groups.create_group(db, master, p, body.name, body.add_users)
    return {"group": group_details(db, g)}


class SearchGroups(ProtoWire):
    name: str | None = Field(default=None, max_length=255)
    user_id: Id | None = None
    offset: Count32 = 0
    limit: Count32 = 0


@router.post("/api/v1/groups/search")
def search_groups(body: SearchGroups, _p: Principal = Depends(deps.user),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    serializers.reject_nul(name=body.name)
    found = groups.search_groups(db, name=body.name, user_id=body.user_id)
    shown = serializers.page(found, body.offset, body.limit)
    return {"groups": [{"group": {"groupId": g.id, "name": g.name}, "numMembers": n} for g, n in shown],
            "pagination": serializers.pagination_json(body.offset, body.limit, len(found), len(shown))}


@router.get("/api/v1/groups/{groupId}")
def get_group(groupId: Id, _p: Principal = Depends(deps.user),
              db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return {"group": group_details(db, groups.get_group(db, groupId))}


class UpdateGroup(ProtoWire):
    group_id: Id | None = None
    name: str | None = Field(default=None, max_length=255)
    add_users: list[Id] = []
    remove_users: list[Id] = []


@router.put("/api/v1/groups/{groupId}")
def update_group(groupId: Id, body: UpdateGroup, p: Principal = Depends(deps.user),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    if body.group_id is not None and body.group_id != groupId:
        raise bad_request(f"must match the path's group id {groupId}", "groupId")
    g = groups.get_group(db, groupId)
    groups.update_group(db, p, g, name=body.name, add_users=body.add_users, remove_users=body.remove_users)
    return {"group": group_details(db, g)}


@router.delete("/api/v1/groups/{groupId}")
def delete_group(groupId: Id, p: Principal = Depends(deps.user),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    groups.delete_group(db, p, groups.get_group(db, groupId))
    return {}
