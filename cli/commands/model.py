"""det model create|list|describe|register-version|delete  (Determined's model registry: /api/v1/models)"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from cli.commands import group
from cli.formatting import fmt_json, fmt_time
from cli.output import confirm, kv, print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "model", "the model registry", aliases=("m",))
    p = g.add_parser("create", help="create a model")
    p.add_argument("name")
    p.add_argument("--description", "-d", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=create)

    p = g.add_parser("list", help="list models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_models)

    p = g.add_parser("describe", help="a model and its versions")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe)

    p = g.add_parser("register-version", help="register a checkpoint as the model's next version")
    p.add_argument("name")
    p.add_argument("checkpoint_uuid")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=register_version)

    p = g.add_parser("delete", help="delete a model and its versions (their checkpoints stay)")
    p.add_argument("name")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=delete)


def _path(name: str) -> str:
    return f"/api/v1/models/{quote(name, safe='')}"


def _model_pairs(m: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("ID", m.get("id")),
        ("Name", m.get("name")),
        ("Description", m.get("description") or ""),
        ("Owner", m.get("username") or ""),
        ("Versions", m.get("numVersions")),
        ("Labels", ", ".join(m.get("labels") or [])),
        ("Created", fmt_time(m.get("creationTime"))),
        ("Updated", fmt_time(m.get("lastUpdatedTime"))),
        ("Archived", m.get("archived")),
        ("Metadata", fmt_json(m.get("metadata"))),
    ]


def _version_rows(versions: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for v in versions:
        ckpt = v.get("checkpoint") or {}
        training = ckpt.get("training") or {}
        rows.append([v.get("version"), training.get("trialId"), (ckpt.get("metadata") or {}).get("steps_completed"),
                     ckpt.get("uuid"), fmt_json((training.get("validationMetrics") or {}).get("avgMetrics")),
                     fmt_time(v.get("creationTime"))])
    return rows


VERSION_HEADERS = ["Version", "Trial ID", "Steps", "Checkpoint UUID", "Validation Metrics", "Created"]


def create(args: Any) -> int:
    body: dict[str, Any] = {"name": args.name}
    if args.description is not None:
        body["description"] = args.description
    m = authed(args).post("/api/v1/models", body)["model"]
    if args.json:
        print_json(m)
    else:
        print(f"Created model {m.get('name')} (id {m.get('id')})")
        kv(_model_pairs(m))
    return 0


def list_models(args: Any) -> int:
    models = authed(args).get("/api/v1/models", params={"limit": 0})["models"]
    if args.json:
        print_json(models)
        return 0
    table(["ID", "Name", "Versions", "Owner", "Created", "Updated", "Description"],
          [[m.get("id"), m.get("name"), m.get("numVersions"), m.get("username") or "",
            fmt_time(m.get("creationTime")), fmt_time(m.get("lastUpdatedTime")), m.get("description") or ""]
           for m in models])
    return 0


def describe(args: Any) -> int:
    s = authed(args)
    resp = s.get(f"{_path(args.name)}/versions", params={"limit": 0})
    model = resp.get("model") or s.get(_path(args.name))["model"]
    versions = resp.get("modelVersions") or []
    if args.json:
        print_json({"model": model, "modelVersions": versions})
        return 0
    kv(_model_pairs(model))
    print()
    table(VERSION_HEADERS, _version_rows(versions), title="Versions")
    return 0


def register_version(args: Any) -> int:
    v = authed(args).post(f"{_path(args.name)}/versions",
                          {"modelName": args.name, "checkpointUuid": args.checkpoint_uuid})["modelVersion"]
    if args.json:
        print_json(v)
        return 0
    print(f"Registered checkpoint {args.checkpoint_uuid} as version {v.get('version')} of model {args.name}")
    table(VERSION_HEADERS, _version_rows([v]))
    return 0


def delete(args: Any) -> int:
    if not confirm(f"Delete model {args.name} and its versions? Their checkpoints stay.", args.yes):
        print("Aborted")
        return 1
    authed(args).delete(_path(args.name))
    print(f"Deleted model {args.name}")
    return 0
