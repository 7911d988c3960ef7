"""User groups (`det user-group`) and role assignments (`det rbac assign-role|unassign-role`): the
records services/authz.py decides from. Groups are managed by ClusterAdmins (Determined's
UPDATE_GROUP); a cluster-wide role is assigned by a ClusterAdmin, a role in one workspace also
by that workspace's WorkspaceAdmin. Anyone reads groups and assignments."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core import rbac
from control_plane.core.rbac import Perm
from control_plane.db.models import RoleAssignment, User, UserGroup, UserGroupMember, Workspace
from control_plane.errors import bad_request, conflict, not_found
from control_plane.master import Master
from control_plane.services import authz, workspaces
from control_plane.services.text import clean_text

log = logging.getLogger("shipyard.groups")


def _name(value: str | None) -> str:
    if not value or not value.strip():
        raise bad_request("must not be empty", "name")
    if len(value) > workspaces.NAME_MAX:
        raise bad_request(f"must be at most {workspaces.NAME_MAX} characters", "name")
    return clean_text(value.strip())


def _require_group_admin(s: Session, by: Principal, what: str) -> None:
    authz.require(s, by, Perm.UPDATE_GROUP, workspace_id=None, what=what)


def _users_exist(s: Session, user_ids: Sequence[int], field: str) -> None:
    found = set(s.scalars(select(User.id).where(User.id.in_(set(user_ids))))) if user_ids else set()
    missing = sorted(set(user_ids) - found)
    if missing:
        raise bad_request(f"no users with ids {missing}", field)


def get_group(s: Session, group_id: int) -> UserGroup:
    g = s.get(UserGroup, group_id)
    if g is None:
        raise not_found(f"group {group_id}")
    return g


def members(s: Session, group_id: int) -> list[User]:
    return list(s.scalars(select(User).join(UserGroupMember, UserGroupMember.user_id == User.id)
                          .where(UserGroupMember.group_id == group_id).order_by(User.id)))


def create_group(s: Session, master: Master, by: Principal, name: str | None, add_users: Sequence[int]) -> UserGroup:
    _require_group_admin(s, by, "groups")
    name = _name(name)
    if s.scalar(select(UserGroup.id).where(UserGroup.name == name)) is not None:
        raise conflict(f"a group named {name!r} already exists")
    _users_exist(s, add_users, "addUsers")
    g = UserGroup(name=name, created_at=master.clock())
    s.add(g)
    workspaces.flush_unique(s, f"a group named {name!r}")
    s.add_all(UserGroupMember(group_id=g.id, user_id=u) for u in sorted(set(add_users)))
    s.flush()
    log.info("event=group_created group_id=%s name=%s by=%s", g.id, g.name, by.username)
    return g


def update_group(s: Session, by: Principal, g: UserGroup, *, name: str | None, add_users: Sequence[int],
                 remove_users: Sequence[int]) -> None:
    _require_group_admin(s, by, f"group {g.id}")
    if name:
        new = _name(name)
        if new != g.name and s.scalar(select(UserGroup.id).where(UserGroup.name == new)) is not None:
            raise conflict(f"a group named {new!r} already exists")
        g.name = new
    _users_exist(s, add_users, "addUsers")
    _users_exist(s, remove_users, "removeUsers")
    present = set(s.scalars(select(UserGroupMember.user_id).where(UserGroupMember.group_id == g.id)))
    s.add_all(UserGroupMember(group_id=g.id, user_id=u) for u in sorted(set(add_users) - present))
    if remove_users:
        s.execute(delete(UserGroupMember).where(UserGroupMember.group_id == g.id,
                                                UserGroupMember.user_id.in_(set(remove_users))))
    workspaces.flush_unique(s, f"a group named {g.name!r}")
    log.info("event=group_updated group_id=%s added=%s removed=%s by=%s", g.id, list(add_users),
             list(remove_users), by.username)


def delete_group(s: Session, by: Principal, g: UserGroup) -> None:
    _require_group_admin(s, by, f"group {g.id}")
    s.execute(delete(RoleAssignment).where(RoleAssignment.group_id == g.id))
    s.execute(delete(UserGroupMember).where(UserGroupMember.group_id == g.id))
    s.delete(g)
    s.flush()
    log.info("event=group_deleted group_id=%s name=%s by=%s", g.id, g.name, by.username)


def search_groups(s: Session, *, name: str | None, user_id: int | None) -> list[tuple[UserGroup, int]]:
    """Groups (by exact name, or holding a user) with their member counts, by id."""
    count = (select(func.count()).select_from(UserGroupMember).where(UserGroupMember.group_id == UserGroup.id)
             .scalar_subquery())
    q = select(UserGroup, count).order_by(UserGroup.id)
    if name:
        q = q.where(UserGroup.name == name)
    if user_id is not None:
        q = q.where(UserGroup.id.in_(select(UserGroupMember.group_id).where(UserGroupMember.user_id == user_id)))
    return [(g, n) for g, n in s.execute(q).all()]


# -- role assignments --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Assignment:
    """One role to give or take: to a user or a group, in a workspace or (None) cluster-wide."""

    role_id: int
    workspace_id: int | None
    user_id: int | None = None
    group_id: int | None = None


def _check(s: Session, by: Principal, a: Assignment, field: str) -> None:
    role = rbac.ROLES_BY_ID.get(a.role_id)
    if role is None:
        raise bad_request(f"no role with id {a.role_id}; roles are {sorted(rbac.ROLES_BY_ID)}", f"{field}.roleId")
    if a.workspace_id is not None and not role.workspace_scoped:
        raise bad_request(f"{role.name} is assigned cluster-wide only", f"{field}.scopeWorkspaceId")
    if a.workspace_id is not None and s.get(Workspace, a.workspace_id) is None:
        raise bad_request(f"workspace {a.workspace_id} does not exist", f"{field}.scopeWorkspaceId")
    if a.user_id is not None and s.get(User, a.user_id) is None:
        raise bad_request(f"user {a.user_id} does not exist", f"{field}.userId")
    if a.group_id is not None and s.get(UserGroup, a.group_id) is None:
        raise bad_request(f"group {a.group_id} does not exist", f"{field}.groupId")
    if a.workspace_id is None:
        authz.require(s, by, Perm.UPDATE_ROLES, workspace_id=None, what="cluster-wide roles")
    else:
        authz.require(s, by, Perm.ASSIGN_ROLES, workspace_id=a.workspace_id, what=f"workspace {a.workspace_id}")


def _matching(a: Assignment):  # type: ignore[no-untyped-def]
    return (RoleAssignment.role_id == a.role_id,
            RoleAssignment.workspace_id.is_(None) if a.workspace_id is None
            else RoleAssignment.workspace_id == a.workspace_id,
            RoleAssignment.user_id.is_(None) if a.user_id is None else RoleAssignment.user_id == a.user_id,
            RoleAssignment.group_id.is_(None) if a.group_id is None else RoleAssignment.group_id == a.group_id)


def assign(s: Session, master: Master, by: Principal, wanted: Sequence[tuple[str, Assignment]]) -> None:
    """Give every role of `wanted` ((field, assignment) pairs) or none; one already held is kept."""
    for field, a in wanted:
        _check(s, by, a, field)
    for _, a in wanted:
        if s.scalar(select(RoleAssignment.id).where(*_matching(a))) is None:
            s.add(RoleAssignment(role_id=a.role_id, workspace_id=a.workspace_id, user_id=a.user_id,
                                 group_id=a.group_id, created_at=master.clock()))
            s.flush()
        log.info("event=role_assigned role_id=%s workspace_id=%s user_id=%s group_id=%s by=%s", a.role_id,
                 a.workspace_id, a.user_id, a.group_id, by.username)


def unassign(s: Session, by: Principal, wanted: Sequence[tuple[str, Assignment]]) -> None:
    for field, a in wanted:
        _check(s, by, a, field)
    for _, a in wanted:
        s.execute(delete(RoleAssignment).where(*_matching(a)))
        log.info("event=role_unassigned role_id=%s workspace_id=%s user_id=%s group_id=%s by=%s", a.role_id,
                 a.workspace_id, a.user_id, a.group_id, by.username)
    s.flush()


def assignments(s: Session, *, role_ids: Sequence[int] | None = None, user_id: int | None = None,
                group_id: int | None = None) -> list[RoleAssignment]:
    """Stored assignments, by role, by user (directly or through a group) or by group."""
    q = select(RoleAssignment).order_by(RoleAssignment.id)
    if role_ids is not None:
        q = q.where(RoleAssignment.role_id.in_(set(role_ids)))
    if user_id is not None:
        groups = select(UserGroupMember.group_id).where(UserGroupMember.user_id == user_id)
        q = q.where((RoleAssignment.user_id == user_id) | RoleAssignment.group_id.in_(groups))
    if group_id is not None:
        q = q.where(RoleAssignment.group_id == group_id)
    return list(s.scalars(q))


def grants_with_implied(s: Session, p: Principal) -> list[rbac.Grant]:
    """Every role the caller holds, the implied ones included (`det rbac my-permissions`)."""
    assert p.user_id is not None
    grants = rbac.implied_grants(admin=p.admin, workspace_id=rbac.DEFAULT_WORKSPACE_ID, workspace_owner_id=None,
                                 user_id=p.user_id)
    for ws_id in s.scalars(select(Workspace.id).where(Workspace.owner_id == p.user_id)):
        grants += rbac.implied_grants(admin=False, workspace_id=ws_id, workspace_owner_id=p.user_id,
                                      user_id=p.user_id)
    return grants + authz.grants_of(s, p.user_id)
