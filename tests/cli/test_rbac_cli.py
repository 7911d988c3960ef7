"""Shipyard's own det: `det user-group` and `det rbac` against a real master (both databases):
a group given Viewer in a workspace, its member refused a project there in one error line naming
the role, then Editor lets them; describe-role, list-users-roles, my-permissions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Det, one_error_line

pytestmark = pytest.mark.integration


def test_groups_and_roles(admin_det: Det, tmp_path: Path) -> None:
    tag = tmp_path.name[-8:].replace("_", "")  # the package's master is shared: unique names
    user, team, ws = f"u{tag}", f"g{tag}", f"w{tag}"
    assert admin_det("user", "create", user, "--password", "rbac-pass-1").code == 0
    assert admin_det("workspace", "create", ws).code == 0
    r = admin_det("user-group", "create", team, "--add-user", user)
    assert r.code == 0 and "1 members" in r.out, r.err
    assert user in admin_det("user-group", "describe", team).out
    assert team in admin_det("user-group", "list", "--groups-user-belongs-to", user).out
    assert "Viewer" in admin_det("rbac", "list-roles").out
    r = admin_det("rbac", "assign-role", "Viewer", "-w", ws, "-g", team)
    assert r.code == 0 and f"Assigned Viewer to group {team} in workspace {ws}" in r.out, r.err
    assert ws in admin_det("rbac", "list-users-roles", user).out
    assert "no role named 'Boss'" in one_error_line(admin_det("rbac", "assign-role", "Boss", "-u", user))

    assert admin_det("user", "login", user, "--password", "rbac-pass-1").code == 0
    assert ws in admin_det("rbac", "my-permissions").out
    assert "has Viewer on workspace" in one_error_line(admin_det("project", "create", ws, "p"))
    assert admin_det("-u", "admin", "rbac", "assign-role", "Editor", "-w", ws, "-u", user).code == 0
    assert admin_det("project", "create", ws, "p").code == 0
    holders = json.loads(admin_det("-u", "admin", "rbac", "describe-role", "Editor", "--json").out)
    assert [a["roleAssignment"]["scopeWorkspaceId"] for a in holders["userRoleAssignments"]] != []
    assert admin_det("-u", "admin", "user-group", "remove-user", team, user).code == 0
    assert admin_det("-u", "admin", "user-group", "delete", team, "--yes").code == 0
