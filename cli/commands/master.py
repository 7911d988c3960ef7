"""det master info|config|logs"""

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
    p = g.add_parser("logs", help="the master's own log, from all its processes (admins)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines, as tail -f")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines (then new ones with -f)")
    p.set_defaults(func=logs)


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


def logs(args: Any) -> int:
    from cli.errors import CliError
    from cli.logs import stream_results

    if args.tail is not None and args.tail < 0:
        raise CliError("--tail must be >= 0")
    params: dict[str, Any] = {"follow": "true" if args.follow else "false"}
    if args.tail == 0 and not args.follow:
        return 0
    if args.tail is not None:  # --tail 0 -f: from the newest line on, without printing it
        params["offset"] = -max(args.tail, 1)
    skip = 1 if args.tail == 0 else 0
    for result in stream_results(authed(args), "/api/v1/master/logs", params):
        if skip:
            skip -= 1
            continue
        entry = result.get("logEntry") or {}
        level = str(entry.get("level", "")).removeprefix("LOG_LEVEL_")
        print(f"{entry.get('timestamp')} [{level}] {entry.get('message')}", flush=True)
    return 0
