"""det template list|describe|create|set|remove  (config templates: /api/v1/templates; an experiment
created with `det e create --template NAME` gets the template under its config)"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cli.commands import group
from cli.commands.workspace import workspace_by_name
from cli.errors import CliError
from cli.output import print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "template", "experiment config templates", aliases=("tpl",))
    p = g.add_parser("list", help="list templates")
    p.add_argument("-d", "--details", action="store_true", help="show their configs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_templates)
    p = g.add_parser("describe", help="a template's config (YAML)")
    p.add_argument("template_name")
    p.set_defaults(func=describe)
    p = g.add_parser("create", help="create a template from a YAML file")
    p.add_argument("template_name")
    p.add_argument("template_file")
    p.add_argument("-w", "--workspace-name", help="the workspace holding it (default: Uncategorized)")
    p.set_defaults(func=create)
    p = g.add_parser("set", help="replace a template's config from a YAML file")
    p.add_argument("template_name")
    p.add_argument("template_file")
    p.set_defaults(func=set_config)
    p = g.add_parser("remove", aliases=["rm"], help="remove a template")
    p.add_argument("template_name")
    p.set_defaults(func=remove)


def _path(name: str) -> str:
    return f"/api/v1/templates/{quote(name, safe='')}"


def _yaml(text: str) -> str:
    import yaml

    return str(yaml.safe_dump(text, default_flow_style=False, sort_keys=True))


def _read(path: str) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise CliError(f"cannot read template file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise CliError(f"template file {path} is not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise CliError(f"template file {path} must hold a mapping of experiment config fields")
    return doc


def list_templates(args: Any) -> int:
    s = authed(args)
    templates = s.get("/api/v1/templates")["templates"]
    if args.json:
        print_json(templates)
        return 0
    names = {w["id"]: w["name"] for w in s.get("/api/v1/workspaces")["workspaces"]}
    rows = [[t["name"], names.get(t["workspaceId"], "")] + ([_yaml(t["config"])] if args.details else [])
            for t in templates]
    table(["Name", "Workspace"] + (["Config"] if args.details else []), rows)
    return 0


def describe(args: Any) -> int:
    print(_yaml(authed(args).get(_path(args.template_name))["template"]["config"]), end="")
    return 0


def create(args: Any) -> int:
    s = authed(args)
    workspace_id = workspace_by_name(s, args.workspace_name)["id"] if args.workspace_name else 0
    s.post(_path(args.template_name), {"name": args.template_name, "config": _read(args.template_file),
                                       "workspaceId": workspace_id})
    print(f"Created template {args.template_name}")
    return 0


def set_config(args: Any) -> int:
    authed(args).patch(_path(args.template_name), _read(args.template_file))
    print(f"Set template {args.template_name}")
    return 0


def remove(args: Any) -> int:
    authed(args).delete(_path(args.template_name))
    print(f"Removed template {args.template_name}")
    return 0
