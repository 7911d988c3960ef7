"""det master info|config|logs|cluster-message get|set|clear"""

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
    cm = g.add_parser("cluster-message", help="the message shown to every user of the cluster")
    cms = cm.add_subparsers(dest="cluster_message_cmd", metavar="get|set|clear", required=True)
    p = cms.add_parser("get", help="the current message (one that has not ended; it may start later)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=get_cluster_message)
    p = cms.add_parser("set", help="replace the message (admins)")
    p.add_argument("-m", "--message", required=True)
    p.add_argument("-s", "--start", help="RFC 3339 time to start showing it (default: now)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("-e", "--end", help="RFC 3339 time to stop showing it (default: never)")
    when.add_argument("-d", "--duration", help="how long to show it, as a Go duration (30m, 24h, 1h30m)")
    p.set_defaults(func=set_cluster_message)
    p = cms.add_parser("clear", help="end the message now (admins)")
    p.set_defaults(func=clear_cluster_message)


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


def get_cluster_message(args: Any) -> int:
    m = authed(args).get("/api/v1/master/cluster_message").get("clusterMessage")
    if args.json:
        print_json(m)
    elif m is None:
        print("No cluster message")
    else:
        kv([("message", m["message"]), ("start", m.get("startTime")), ("end", m.get("endTime") or "never"),
            ("set", m.get("createdTime"))])
    return 0


def set_cluster_message(args: Any) -> int:
    body = {"message": args.message, "startTime": args.start, "endTime": args.end, "duration": args.duration}
    authed(args).request("PUT", "/api/v1/master/cluster_message",
                         json_body={k: v for k, v in body.items() if v is not None})
    print("Cluster message set")
    return 0


def clear_cluster_message(args: Any) -> int:
    authed(args).delete("/api/v1/master/cluster_message")
    print("Cluster message cleared")
    return 0
