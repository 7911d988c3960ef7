"""Run with the interpreter of a venv holding determined==0.38.1 (not the test environment's): prints
the real `det` CLI's command tree as JSON, built as `determined.cli.cli.main` builds it.

{"master": {"aliases": ["m"], "subs": {"info": {"aliases": [], "subs": {}}, ...}}, ...}

`det deploy ...` has its own argparse tree (main() adds it only when the first word is `deploy`): its
subcommands are walked from `determined.deploy.cli`. Every group's `help` subcommand is left out;
an alias is the same parser under another name, so it is listed under its main name (the first one
argparse was given)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from determined.cli import _declarative_argparse as declarative
from determined.cli import cli
from determined.deploy import cli as deploy_cli


def walk(parser: argparse.ArgumentParser) -> dict[str, Any]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    tree: dict[str, Any] = {}
    by_parser: dict[int, str] = {}
    for name, child in (subs[0].choices.items() if subs else ()):
        if name == "help":
            continue
        if id(child) in by_parser:
            tree[by_parser[id(child)]]["aliases"].append(name)
            continue
        by_parser[id(child)] = name
        tree[name] = {"aliases": [], "subs": walk(child)}
    return tree


def main() -> None:
    parser = cli.make_parser()
    declarative.add_args(parser, cli.all_args_description)
    tree = walk(parser)
    deploy = cli.make_parser()
    declarative.add_args(deploy, [deploy_cli.args_description])
    tree.update(walk(deploy))  # replaces the placeholder `deploy` of the main tree
    print(json.dumps(tree))


if __name__ == "__main__":
    main()
