"""`det`: the Shipyard CLI. Building the parser imports nothing heavy, so `det --help` and
`det --version` are instant: the command modules import the CLI's own modules at their top, and a
heavy library (httpx, rich, the cloud SDKs, Pulumi) only where it is used."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cli.errors import CliError
from control_plane import __version__

COMMAND_MODULES = ("user", "master", "experiment", "trial", "checkpoint", "agent", "resource_pool",
                   "model", "deploy", "job", "task", "shell", "workspace", "template", "rbac", "user_group")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="det", description="Shipyard: elastic training control plane")
    p.add_argument("-m", "--master", help="master URL (default: $DET_MASTER or http://localhost:8080)")
    p.add_argument("-u", "--user", help="act as this user (default: the last one logged in)")
    p.add_argument("--version", action="version", version=f"det (shipyard) {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"cli.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"cli.commands.{name}":
                raise
            continue
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        # `det experiment` with no verb: show that group's help.
        (getattr(args, "group_parser", None) or parser).print_help()
        return 2
    try:
        result = func(args)
    except CliError as e:
        print(f"det: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("det: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # never a traceback for the user; SHIPYARD_DEBUG=1 shows it
        if os.environ.get("SHIPYARD_DEBUG"):
            raise
        print(f"det: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
