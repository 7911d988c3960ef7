"""det deploy local up|status|down (det deploy aws|gcp is not built yet; see docs/ARCHITECTURE.md)"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    from cli.main import group

    g = group(sub, "deploy", "stand up a cluster")
    lp = g.add_parser("local", help="master and agents as local processes")
    lsub = lp.add_subparsers(dest="action", metavar="ACTION")
    lp.set_defaults(group_parser=lp, func=None)
    p = lsub.add_parser("up", help="start a master and agents")
    p.add_argument("--agents", type=int, default=1)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--db", help="database URL (default: SQLite in the state directory)")
    p.add_argument("--slots", type=int, default=1, help="CPU slots per agent when there is no GPU")
    p.add_argument("--master-config", type=Path, help="a master.yaml to start the master with")
    p.add_argument("--state-dir", type=Path)
    p.set_defaults(func=up)
    for name, fn in (("status", status), ("down", down)):
        p = lsub.add_parser(name)
        p.add_argument("--state-dir", type=Path)
        if name == "status":
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=fn)


def _dir(args: Any) -> Path:
    from cli.deploy_local import default_state_dir

    return args.state_dir or default_state_dir()


def up(args: Any) -> int:
    from cli import deploy_local
    from cli.errors import CliError

    if args.agents < 0:
        raise CliError("--agents must be >= 0")
    data = deploy_local.up(_dir(args), agents=args.agents, port=args.port, db=args.db, slots=args.slots,
                           pool_config=args.master_config)
    print(f"Master:  {data['master_url']}  (log {data['master_log']})")
    for a in data["agents"]:
        print(f"Agent:   {a['id']}  pid {a['pid']}  (log {a['log']})")
    pw_file = Path(data["state_dir"]) / "admin-password"
    if data.get("new_admin_password"):
        print(f"Admin password (also in {pw_file}, mode 0600): {pw_file.read_text().strip()}")
    print(f"You are logged in as admin. Try: det -m {data['master_url']} experiment list")
    return 0


def status(args: Any) -> int:
    from cli import deploy_local
    from cli.output import print_json

    data = deploy_local.status(_dir(args))
    if args.json:
        print_json(data)
        return 0
    if not data:
        print("No local cluster")
        return 1
    print(f"Master {data['master_url']}: {'running' if data['master_alive'] else 'NOT running'} (pid {data['master_pid']})")
    for a in data["agents"]:
        print(f"Agent {a['id']}: {'running' if a['alive'] else 'NOT running'} (pid {a['pid']})")
    return 0 if data["master_alive"] else 1


def down(args: Any) -> int:
    from cli import deploy_local

    return deploy_local.down(_dir(args))
