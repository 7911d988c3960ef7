"""Roles and their assignments (Determined 0.38.1's /api/v1/roles/... and
/api/v1/permissions/summary, as `det rbac` calls them): core/rbac.py's roles, services/groups.py's
assignments."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import Count32, Id, ProtoWire
from control_plane.auth import Principal
from control_plane.core import rbac
from control_plane.db.models import RoleAssignment
from control_plane.master import Master
from control_plane.services import groups

router = APIRouter()


def _assignment_json(role_id: int, workspace_id: int | None) -> dict[str, Any]:
    """Determined's v1RoleAssignment."""
    return {"role": {"roleId": role_id, "name": rbac.ROLES_BY_ID[role_id].name},
            "scopeWorkspaceId": workspace_id, "scopeCluster": workspace_id is None}


def _with_assignments(role_ids: Sequence[int], rows: Sequence[RoleAssignment]) -> list[dict[str, Any]]:
    """Determined's v1RoleWithAssignments, one per role of `role_ids` (in that order)."""
    out = []
    for rid in role_ids:
        mine = [a for a in rows if a.role_id == rid]
        out.append({
            "role": rbac.role_json(rbac.ROLES_BY_ID[rid]),
            "userRoleAssignments": [{"userId": a.user_id, "roleAssignment": _assignment_json(rid, a.workspace_id)}
                                    for a in mine if a.user_id is not None],
            "groupRoleAssignments": [{"groupId": a.group_id, "roleAssignment": _assignment_json(rid, a.workspace_id)}
                                     for a in mine if a.group_id is not None],
        })
    return out


def _summary(pairs: Sequence[tuple[int, int | None]]) -> dict[str, Any]:
    """Determined's (roles, v1RoleAssignmentSummary) pair of lists, one summary per role."""
    scopes: dict[int, set[int | None]] = defaultdict(set)
    for rid, ws in pairs:
        if rid in rbac.ROLES_BY_ID:
            scopes[rid].add(ws)
    ids = sorted(scopes)
    return {"roles": [rbac.role_json(rbac.ROLES_BY_ID[r]) for r in ids],
            "assignments": [{"roleId": r, "scopeCluster": None in scopes[r],
                             "scopeWorkspaceIds": sorted(w for w in scopes[r] if w is not None)} for r in ids]}


class Page(ProtoWire):
    offset: Count32 = 0
    limit: Count32 = 0


@router.post("/api/v1/roles/search")
def list_roles(body: Page, _p: Principal = Depends(deps.user)) -> dict[str, Any]:
    shown = serializers.page(rbac.ROLES, body.offset, body.limit)
    return {"roles": [rbac.role_json(r) for r in shown],
            "pagination": serializers.pagination_json(body.offset, body.limit, len(rbac.ROLES), len(shown))}


class Assignable(Page):
    workspace_id: Id | None = None


@router.post("/api/v1/roles/search/by-assignability")
def assignable_roles(body: Assignable, _p: Principal = Depends(deps.user)) -> dict[str, Any]:
    """With a workspace: the roles assignable in one workspace (not ClusterAdmin)."""
    found = [r for r in rbac.ROLES if body.workspace_id is None or r.workspace_scoped]
    shown = serializers.page(found, body.offset, body.limit)
    return {"roles": [rbac.role_json(r) for r in shown],
            "pagination": serializers.pagination_json(body.offset, body.limit, len(found), len(shown))}


class ByIds(ProtoWire):
    role_ids: list[Id] = []


@router.post("/api/v1/roles/search/by-ids")
def roles_by_ids(body: ByIds, _p: Principal = Depends(deps.user),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    ids = [r for r in dict.fromkeys(body.role_ids) if r in rbac.ROLES_BY_ID]
    return {"roles": _with_assignments(ids, groups.assignments(db, role_ids=ids))}


@router.get("/api/v1/roles/search/by-user/{userId}")
def roles_of_user(userId: Id, _p: Principal = Depends(deps.user),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    rows = groups.assignments(db, user_id=userId)
    return {"roles": _with_assignments(sorted({a.role_id for a in rows}), rows)}


@router.get("/api/v1/roles/search/by-group/{groupId}")
def roles_of_group(groupId: Id, _p: Principal = Depends(deps.user),
                   db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    groups.get_group(db, groupId)
    return _summary([(a.role_id, a.workspace_id) for a in groups.assignments(db, group_id=groupId)])


@router.get("/api/v1/permissions/summary")
def my_permissions(p: Principal = Depends(deps.user),
                   db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """The caller's roles, the implied ones (core/rbac.py) included."""
    return _summary([(g.role_id, g.workspace_id) for g in groups.grants_with_implied(db, p)])


class RoleRef(ProtoWire):
    role_id: int


class RoleAssignmentBody(ProtoWire):
    role: RoleRef
    scope_workspace_id: Id | None = None
    scope_cluster: bool | None = None


class UserAssignment(ProtoWire):
    user_id: Id
    role_assignment: RoleAssignmentBody


class GroupAssignment(ProtoWire):
    group_id: Id
    role_assignment: RoleAssignmentBody


class Assignments(ProtoWire):
    user_role_assignments: list[UserAssignment] = []
    group_role_assignments: list[GroupAssignment] = []


def _wanted(body: Assignments) -> list[tuple[str, groups.Assignment]]:
    out = [(f"userRoleAssignments[{i}]", groups.Assignment(
        a.role_assignment.role.role_id, a.role_assignment.scope_workspace_id, user_id=a.user_id))
        for i, a in enumerate(body.user_role_assignments)]
    return out + [(f"groupRoleAssignments[{i}]", groups.Assignment(
        a.role_assignment.role.role_id, a.role_assignment.scope_workspace_id, group_id=a.group_id))
        for i, a in enumerate(body.group_role_assignments)]


@router.post("/api/v1/roles/add-assignments")
def add_assignments(body: Assignments, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                    db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    groups.assign(db, master, p, _wanted(body))
    return {}


@router.post("/api/v1/roles/remove-assignments")
def remove_assignments(body: Assignments, p: Principal = Depends(deps.user),
                       db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    groups.unassign(db, p, _wanted(body))
    return {}
