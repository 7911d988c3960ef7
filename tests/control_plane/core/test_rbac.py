"""core/rbac.py's decision table: roles x scope x ownership, pure (no database)."""

from __future__ import annotations

import pytest

from control_plane.core import rbac
from control_plane.core.rbac import Grant, Perm, Target

ME, OTHER, W, V = 7, 8, 3, 4  # users; workspaces W and V


def _grants(role: str | None, *, admin: bool = False, owns_workspace: bool = False, ws: int = W) -> list[Grant]:
    implied = rbac.implied_grants(admin=admin, workspace_id=ws, workspace_owner_id=ME if owns_workspace else OTHER,
                                  user_id=ME)
    return implied + ([Grant(rbac.ROLES_BY_NAME[role].id, W)] if role else [])


@pytest.mark.parametrize(("grants", "perm", "target", "allowed"), [
    (_grants("Viewer"), Perm.UPDATE_EXPERIMENT, Target(W, OTHER), False),
    (_grants("Viewer"), Perm.CREATE_EXPERIMENT, Target(W), False),
    (_grants("Viewer"), Perm.UPDATE_EXPERIMENT, Target(W, ME), True),  # ownership stands on its own
    (_grants("Editor"), Perm.UPDATE_EXPERIMENT, Target(W, OTHER), True),
    (_grants("Editor"), Perm.UPDATE_EXPERIMENT, Target(V, OTHER), False),  # another workspace
    (_grants("Editor"), Perm.UPDATE_WORKSPACE, Target(W, OTHER), False),
    (_grants("WorkspaceAdmin"), Perm.ASSIGN_ROLES, Target(W), True),
    (_grants("WorkspaceAdmin"), Perm.UPDATE_ROLES, Target(None), False),
    (_grants(None, owns_workspace=True), Perm.UPDATE_WORKSPACE, Target(W, ME), True),
    (_grants(None, owns_workspace=True), Perm.UPDATE_EXPERIMENT, Target(W, OTHER), True),  # its WorkspaceAdmin
    (_grants(None, admin=True), Perm.MODIFY_RP_WORKSPACE_BINDINGS, Target(None), True),
    ([Grant(rbac.WORKSPACE_ADMIN.id, None)], Perm.UPDATE_EXPERIMENT, Target(V, OTHER), True),  # cluster-wide
    ([Grant(rbac.WORKSPACE_ADMIN.id, W)], Perm.UPDATE_GROUP, Target(None), False),  # cluster-only permission
    # Uncategorized: everyone creates there and changes only their own.
    (_grants(None, ws=1), Perm.CREATE_EXPERIMENT, Target(1), True),
    (_grants(None, ws=1), Perm.UPDATE_EXPERIMENT, Target(1, OTHER), False),
    (_grants(None, ws=1), Perm.UPDATE_PROJECT, Target(1, None), False),  # the cluster's own project
])
def test_decide(grants: list[Grant], perm: Perm, target: Target, allowed: bool) -> None:
    assert rbac.decide(perm, ME, grants, target, "it").allowed is allowed


def test_a_refusal_names_the_role_held_and_needed() -> None:
    reason = rbac.decide(Perm.UPDATE_EXPERIMENT, ME, _grants("Viewer"), Target(W, OTHER), "experiment 5").reason
    assert reason == (f"experiment 5 belongs to another user, and this user has Viewer on workspace {W}; "
                      "changing it needs Editor")
    reason = rbac.decide(Perm.UPDATE_GROUP, ME, _grants("WorkspaceAdmin"), Target(None), "groups").reason
    assert reason == "this user has no role on the cluster; update group needs ClusterAdmin"
