"""The one authorization service: who holds which roles (core/rbac.py) where, and whether a caller
may do a thing. Every write check of workspaces, projects, templates, experiments and trials
comes here through services/access.py.

Reads stay open to every user (Determined without RBAC; a Viewer role gives nothing a user
without a role lacks): teams on one Shipyard cluster share it to see each other's work, and
making records private would hide experiments that every user has read until now. The roles
decide who creates and changes.

The implied roles (core/rbac.py's `implied_grants`) are decided first, with no query; only a
caller they do not allow costs the query of their assignments (theirs and their groups'): roles
only add permissions, so that order cannot change an answer.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from control_plane.auth import Principal, TokenKind
from control_plane.core import rbac
from control_plane.core.rbac import Grant, Perm, Target
from control_plane.db.models import Project, RoleAssignment, UserGroupMember, Workspace
from control_plane.errors import forbidden


def grants_of(s: Session, user_id: int) -> list[Grant]:
    """The roles assigned to the user, directly or through a group (not the implied ones)."""
    groups = select(UserGroupMember.group_id).where(UserGroupMember.user_id == user_id)
    rows = s.execute(select(RoleAssignment.role_id, RoleAssignment.workspace_id).where(
        or_(RoleAssignment.user_id == user_id, RoleAssignment.group_id.in_(groups)))).all()
    return [Grant(r.role_id, r.workspace_id) for r in rows]


def holds_cluster_admin(s: Session, user_id: int) -> bool:
    """Whether the user holds ClusterAdmin cluster-wide by assignment (the admin flag aside): the
    admin-only routes (users, agents, pools, master config and logs) admit them too."""
    return any(g.role_id == rbac.CLUSTER_ADMIN.id and g.workspace_id is None for g in grants_of(s, user_id))


def is_cluster_admin(s: Session, p: Principal) -> bool:
    """A user token of an admin: the admin flag, or ClusterAdmin held cluster-wide (asked of the
    database only when the flag is not set). What the cluster's own records need (other users,
    any task's logs, a checkpoint without an experiment)."""
    if p.kind is not TokenKind.USER:
        return False
    return p.admin or (p.user_id is not None and holds_cluster_admin(s, p.user_id))


def workspace_of_project(s: Session, project_id: int) -> int:
    ws = s.scalar(select(Project.workspace_id).where(Project.id == project_id))
    return ws if ws is not None else rbac.DEFAULT_WORKSPACE_ID


def require(s: Session, p: Principal, perm: Perm, *, workspace_id: int | None, what: str,
            owner_id: int | None = None) -> None:
    """403 unless the user token `p` may do `perm` to `what` (in `workspace_id`; None: the
    cluster), owned by `owner_id` (None: being created, or the cluster's own)."""
    if p.kind is not TokenKind.USER:
        raise forbidden(f"a {p.kind.value} token cannot do this")
    target = Target(workspace_id, owner_id)
    ws_owner = None
    if workspace_id is not None and workspace_id != rbac.DEFAULT_WORKSPACE_ID:
        ws_owner = s.scalar(select(Workspace.owner_id).where(Workspace.id == workspace_id))
    implied = rbac.implied_grants(admin=p.admin, workspace_id=workspace_id, workspace_owner_id=ws_owner,
                                  user_id=p.user_id)
    if rbac.decide(perm, p.user_id, implied, target, what).allowed:
        return
    assert p.user_id is not None
    decision = rbac.decide(perm, p.user_id, implied + grants_of(s, p.user_id), target, what)
    if not decision.allowed:
        raise forbidden(decision.reason)


def allowed_without_query(p: Principal, perm: Perm, owner_id: int | None) -> bool:
    """Whether the implied roles alone allow `perm` on a record of `owner_id` in any workspace
    (an admin, or the owner): the hot paths' check before they read the record's workspace."""
    if p.kind is not TokenKind.USER:
        return False
    implied = rbac.implied_grants(admin=p.admin, workspace_id=None, workspace_owner_id=None, user_id=p.user_id)
    return rbac.decide(perm, p.user_id, implied, Target(None, owner_id), "").allowed
