"""det master info|config"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.output import kv, print_json
from cli.session import Session, authed, master_url


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "master", "the master")
    p = g.add_parser("info", help="show the master's version and cluster id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=info)
    p = g.add_parser("config", help="the master's effective configuration, secrets hidden (admins)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=config)


def info(args: Any) -> int:
    data = Session(master_url(args.master)).get("/api/v1/master", auth=False)
    if args.json:
        print_json(data)
    else:
        kv([("master", master_url(args.master)), ("version", data.get("shipyardVersion") or data.get("version")),
            ("determined api", data.get("version")),
            ("cluster", f"{data.get('clusterName')} ({data.get('clusterId')})"), ("master id", data.get("masterId"))])
    return 0


def config(args: Any) -> int:
    data = authed(args).get("/api/v1/master/config")["config"]
    if args.json:
        print_json(data)
    else:
        import yaml

        print(yaml.safe_dump(data, default_flow_style=False, sort_keys=False), end="")
    return 0
