"""det workspace list|create|describe|edit|archive|unarchive|delete|list-projects and
det project list|create|describe|edit|archive|unarchive|delete  (/api/v1/workspaces, /api/v1/projects;
Determined's arguments: workspaces and projects by name)"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.commands import group
from cli.errors import CliError
from cli.formatting import fmt_json, fmt_time
from cli.output import confirm, print_json, table
from cli.session import Session, authed

WORKSPACE_HEADERS = ["ID", "Name", "# Projects", "# Experiments", "Owner", "Default Compute Pool", "Archived"]
PROJECT_HEADERS = ["ID", "Key", "Name", "Description", "# Experiments", "# Active Experiments", "Archived"]


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "workspace", "workspaces: homes of projects, with default pool and storage", aliases=("w",))
    p = g.add_parser("list", help="list workspaces")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_workspaces)
    p = g.add_parser("list-projects", help="the projects of a workspace")
    p.add_argument("workspace_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_projects)
    for verb, func, helptext in (("create", create_workspace, "create a workspace"),
                                 ("edit", edit_workspace, "change a workspace's name or defaults")):
        p = g.add_parser(verb, help=helptext)
        p.add_argument("workspace_name" if verb == "edit" else "name")
        if verb == "edit":
            p.add_argument("--name", help="new name")
        p.add_argument("--default-compute-pool", help="pool for experiments whose config names none ('' clears)")
        p.add_argument("--checkpoint-storage-config", help="checkpoint storage as JSON ('{}' clears)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
    p = g.add_parser("describe", help="a workspace")
    p.add_argument("workspace_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe_workspace)
    for verb in ("archive", "unarchive"):
        p = g.add_parser(verb, help=f"{verb} a workspace")
        p.add_argument("workspace_name")
        p.set_defaults(func=archive_workspace, archive=verb == "archive")
    p = g.add_parser("delete", help="delete an empty workspace")
    p.add_argument("workspace_name")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=delete_workspace)

    g = group(sub, "project", "projects: experiments grouped in a workspace", aliases=("p",))
    p = g.add_parser("list", help="the projects of a workspace")
    p.add_argument("workspace_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_projects)
    p = g.add_parser("create", help="create a project in a workspace")
    p.add_argument("workspace_name")
    p.add_argument("name")
    p.add_argument("--description", default="")
    p.add_argument("--key", help="up to 5 letters or digits (default: from the name)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=create_project)
    p = g.add_parser("describe", help="a project and its experiments")
    p.add_argument("workspace_name")
    p.add_argument("project_name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe_project)
    p = g.add_parser("edit", help="change a project's name, description or key")
    p.add_argument("workspace_name")
    p.add_argument("project_name")
    p.add_argument("--new-name")
    p.add_argument("--description")
    p.add_argument("--key")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=edit_project)
    for verb in ("archive", "unarchive"):
        p = g.add_parser(verb, help=f"{verb} a project")
        p.add_argument("workspace_name")
        p.add_argument("project_name")
        p.set_defaults(func=archive_project, archive=verb == "archive")
    p = g.add_parser("delete", help="delete a project without experiments")
    p.add_argument("workspace_name")
    p.add_argument("project_name")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=delete_project)


def workspace_by_name(s: Session, name: str) -> dict[str, Any]:
    found = s.get("/api/v1/workspaces", params={"nameCaseSensitive": name})["workspaces"]
    if not found:
        raise CliError(f"workspace {name!r} not found")
    return dict(found[0])


def project_by_name(s: Session, workspace_name: str, project_name: str) -> dict[str, Any]:
    ws = workspace_by_name(s, workspace_name)
    found = s.get(f"/api/v1/workspaces/{ws['id']}/projects", params={"name": project_name})["projects"]
    if not found:
        raise CliError(f"project {project_name!r} not found in workspace {workspace_name!r}")
    return dict(found[0])


def _workspace_rows(spaces: list[dict[str, Any]]) -> list[list[Any]]:
    return [[w["id"], w["name"], w.get("numProjects"), w.get("numExperiments"), w.get("username") or "",
             w.get("defaultComputePool") or "", w.get("archived")] for w in spaces]


def _show_workspaces(spaces: list[dict[str, Any]], as_json: bool, storage: bool = False) -> None:
    if as_json:
        print_json(spaces if len(spaces) != 1 or not storage else spaces[0])
        return
    headers = WORKSPACE_HEADERS + (["Checkpoint Storage"] if storage else [])
    rows = [r + ([fmt_json(w.get("checkpointStorageConfig"))] if storage else [])
            for r, w in zip(_workspace_rows(spaces), spaces, strict=True)]
    table(headers, rows)


def _storage_arg(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise CliError(f"--checkpoint-storage-config is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise CliError("--checkpoint-storage-config must be a JSON object")
    return parsed


def list_workspaces(args: Any) -> int:
    _show_workspaces(authed(args).get("/api/v1/workspaces")["workspaces"], args.json)
    return 0


def create_workspace(args: Any) -> int:
    body: dict[str, Any] = {"name": args.name}
    if args.default_compute_pool is not None:
        body["defaultComputePool"] = args.default_compute_pool
    storage = _storage_arg(args.checkpoint_storage_config)
    if storage is not None:
        body["checkpointStorageConfig"] = storage
    _show_workspaces([authed(args).post("/api/v1/workspaces", body)["workspace"]], args.json, storage=True)
    return 0


def edit_workspace(args: Any) -> int:
    s = authed(args)
    ws = workspace_by_name(s, args.workspace_name)
    body: dict[str, Any] = {}
    if args.name is not None:
        body["name"] = args.name
    if args.default_compute_pool is not None:
        body["defaultComputePool"] = args.default_compute_pool
    storage = _storage_arg(args.checkpoint_storage_config)
    if storage is not None:
        body["checkpointStorageConfig"] = storage
    _show_workspaces([s.patch(f"/api/v1/workspaces/{ws['id']}", body)["workspace"]], args.json, storage=True)
    return 0


def describe_workspace(args: Any) -> int:
    _show_workspaces([workspace_by_name(authed(args), args.workspace_name)], args.json, storage=True)
    return 0


def archive_workspace(args: Any) -> int:
    s = authed(args)
    ws = workspace_by_name(s, args.workspace_name)
    verb = "archive" if args.archive else "unarchive"
    s.post(f"/api/v1/workspaces/{ws['id']}/{verb}")
    print(f"Workspace {args.workspace_name} {verb}d")
    return 0


def delete_workspace(args: Any) -> int:
    s = authed(args)
    ws = workspace_by_name(s, args.workspace_name)
    if not confirm(f"Delete workspace {args.workspace_name}?", args.yes):
        return 1
    s.delete(f"/api/v1/workspaces/{ws['id']}")
    print(f"Deleted workspace {args.workspace_name}")
    return 0


def _show_projects(projects: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(projects)
        return
    table(PROJECT_HEADERS, [[p["id"], p.get("key"), p["name"], p.get("description") or "", p.get("numExperiments"),
                             p.get("numActiveExperiments"), p.get("archived")] for p in projects])


def list_projects(args: Any) -> int:
    s = authed(args)
    ws = workspace_by_name(s, args.workspace_name)
    _show_projects(s.get(f"/api/v1/workspaces/{ws['id']}/projects")["projects"], args.json)
    return 0


def create_project(args: Any) -> int:
    s = authed(args)
    ws = workspace_by_name(s, args.workspace_name)
    body = {"name": args.name, "workspaceId": ws["id"], "description": args.description}
    if args.key:
        body["key"] = args.key
    _show_projects([s.post(f"/api/v1/workspaces/{ws['id']}/projects", body)["project"]], args.json)
    return 0


def describe_project(args: Any) -> int:
    s = authed(args)
    project = project_by_name(s, args.workspace_name, args.project_name)
    exps = s.get("/api/v1/experiments", params={"projectId": project["id"], "limit": -1})["experiments"]
    if args.json:
        print_json({"project": project, "experiments": exps})
        return 0
    _show_projects([project], False)
    table(["ID", "Owner", "Name", "State", "Started", "Resource Pool"],
          [[e["id"], e.get("username"), e.get("name"), e.get("state"), fmt_time(e.get("startTime")),
            e.get("resourcePool")] for e in exps], title="Experiments")
    return 0


def edit_project(args: Any) -> int:
    s = authed(args)
    project = project_by_name(s, args.workspace_name, args.project_name)
    body = {k: v for k, v in (("name", args.new_name), ("description", args.description), ("key", args.key))
            if v is not None}
    _show_projects([s.patch(f"/api/v1/projects/{project['id']}", body)["project"]], args.json)
    return 0


def archive_project(args: Any) -> int:
    s = authed(args)
    project = project_by_name(s, args.workspace_name, args.project_name)
    verb = "archive" if args.archive else "unarchive"
    s.post(f"/api/v1/projects/{project['id']}/{verb}")
    print(f"Project {args.project_name} {verb}d")
    return 0


def delete_project(args: Any) -> int:
    s = authed(args)
    project = project_by_name(s, args.workspace_name, args.project_name)
    if not confirm(f"Delete project {args.project_name}?", args.yes):
        return 1
    s.delete(f"/api/v1/projects/{project['id']}")
    print(f"Deleted project {args.project_name}")
    return 0
