"""det rbac list-roles|describe-role|assign-role|unassign-role|my-permissions|list-users-roles|
list-groups-roles  (/api/v1/roles, /api/v1/permissions/summary; Determined's arguments: roles,
users, groups and workspaces by name)"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.commands.user_group import group_id, user_ids
from cli.commands.workspace import workspace_by_name
from cli.errors import CliError
from cli.output import print_json, table
from cli.session import Session, authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "rbac", "roles (Viewer, Editor, WorkspaceAdmin, ClusterAdmin) of users and groups")
    p = g.add_parser("list-roles", help="the roles and their permissions")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_roles)
    p = g.add_parser("describe-role", help="a role: its permissions and who holds it where")
    p.add_argument("role_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe_role)
    for verb, func in (("assign-role", assign), ("unassign-role", assign)):
        p = g.add_parser(verb, help=f"{verb.split('-')[0]} a role to a user or a group, in a workspace or cluster-wide")
        p.add_argument("role_name")
        p.add_argument("-w", "--workspace-name", help="the workspace (default: cluster-wide)")
        p.add_argument("-u", "--username-to-assign")
        p.add_argument("-g", "--group-name-to-assign")
        p.set_defaults(func=func, remove=verb == "unassign-role")
    p = g.add_parser("my-permissions", help="your roles, where you hold them")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=my_permissions)
    p = g.add_parser("list-users-roles", help="the roles assigned to a user (directly or through groups)")
    p.add_argument("username")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=users_roles)
    p = g.add_parser("list-groups-roles", help="the roles assigned to a group")
    p.add_argument("group_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=groups_roles)


def _roles(s: Session) -> list[dict[str, Any]]:
    return list(s.post("/api/v1/roles/search", {"limit": 0})["roles"])


def role_id(s: Session, name: str) -> int:
    for r in _roles(s):
        if r["name"] == name:
            return int(r["roleId"])
    raise CliError(f"no role named {name!r}; roles are {', '.join(r['name'] for r in _roles(s))}")


def list_roles(args: Any) -> int:
    roles = _roles(authed(args))
    if args.json:
        print_json(roles)
        return 0
    table(["ID", "Name", "Workspace-scoped", "# Permissions"],
          [[r["roleId"], r["name"], r["scopeTypeMask"]["workspace"], len(r["permissions"])] for r in roles])
    return 0


def _where(names: dict[int, str], ws: int | None) -> str:
    return "cluster-wide" if ws is None else names.get(ws, str(ws))


def _workspace_names(s: Session) -> dict[int, str]:
    return {w["id"]: w["name"] for w in s.get("/api/v1/workspaces")["workspaces"]}


def describe_role(args: Any) -> int:
    s = authed(args)
    r = s.post("/api/v1/roles/search/by-ids", {"roleIds": [role_id(s, args.role_name)]})["roles"][0]
    if args.json:
        print_json(r)
        return 0
    names = _workspace_names(s)
    users = {u["id"]: u["username"] for u in s.get("/api/v1/users")["users"]}
    print(f"role {r['role']['name']} (ID {r['role']['roleId']}): "
          + ", ".join(p["name"] for p in r["role"]["permissions"]))
    rows = [["user", users.get(a["userId"], a["userId"]), _where(names, a["roleAssignment"]["scopeWorkspaceId"])]
            for a in r["userRoleAssignments"]]
    rows += [["group", a["groupId"], _where(names, a["roleAssignment"]["scopeWorkspaceId"])]
             for a in r["groupRoleAssignments"]]
    table(["Held by", "User / group ID", "Where"], rows)
    return 0


def assign(args: Any) -> int:
    if (args.username_to_assign is None) == (args.group_name_to_assign is None):
        raise CliError("give exactly one of --username-to-assign or --group-name-to-assign")
    s = authed(args)
    ra = {"role": {"roleId": role_id(s, args.role_name)},
          "scopeWorkspaceId": workspace_by_name(s, args.workspace_name)["id"] if args.workspace_name else None}
    if args.username_to_assign:
        body = {"userRoleAssignments": [{"userId": user_ids(s, [args.username_to_assign])[0], "roleAssignment": ra}]}
    else:
        body = {"groupRoleAssignments": [{"groupId": group_id(s, args.group_name_to_assign), "roleAssignment": ra}]}
    s.post(f"/api/v1/roles/{'remove' if args.remove else 'add'}-assignments", body)
    who = args.username_to_assign or f"group {args.group_name_to_assign}"
    where = f"in workspace {args.workspace_name}" if args.workspace_name else "cluster-wide"
    print(f"{'Removed' if args.remove else 'Assigned'} {args.role_name} {'from' if args.remove else 'to'} {who} {where}")
    return 0


def _summary_rows(s: Session, summary: dict[str, Any]) -> list[list[Any]]:
    names = _workspace_names(s)
    role_names = {r["roleId"]: r["name"] for r in summary["roles"]}
    rows = []
    for a in summary["assignments"]:
        where = (["cluster-wide"] if a["scopeCluster"] else []) + [names.get(w, str(w)) for w in a["scopeWorkspaceIds"]]
        rows.append([role_names.get(a["roleId"], a["roleId"]), ", ".join(where)])
    return rows


def my_permissions(args: Any) -> int:
    s = authed(args)
    summary = s.get("/api/v1/permissions/summary")
    if args.json:
        print_json(summary)
        return 0
    table(["Role", "Where"], _summary_rows(s, summary))
    return 0


def users_roles(args: Any) -> int:
    s = authed(args)
    roles = s.get(f"/api/v1/roles/search/by-user/{user_ids(s, [args.username])[0]}")["roles"]
    if args.json:
        print_json(roles)
        return 0
    names = _workspace_names(s)
    rows = [[r["role"]["name"], "directly", _where(names, a["roleAssignment"]["scopeWorkspaceId"])]
            for r in roles for a in r["userRoleAssignments"]]
    rows += [[r["role"]["name"], f"group {a['groupId']}", _where(names, a["roleAssignment"]["scopeWorkspaceId"])]
             for r in roles for a in r["groupRoleAssignments"]]
    table(["Role", "Held", "Where"], rows)
    return 0


def groups_roles(args: Any) -> int:
    s = authed(args)
    summary = s.get(f"/api/v1/roles/search/by-group/{group_id(s, args.group_name)}")
    if args.json:
        print_json(summary)
        return 0
    table(["Role", "Where"], _summary_rows(s, summary))
    return 0
