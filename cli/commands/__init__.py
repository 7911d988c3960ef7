"""One module per command group; each has `register(sub)`, which cli.main calls while it builds the parser."""

from __future__ import annotations

import argparse


def group(sub: argparse._SubParsersAction, name: str, help: str, aliases: tuple[str, ...] = ()) -> argparse._SubParsersAction:
    """A command group (`det experiment ...`) and its verbs' subparsers."""
    gp = sub.add_parser(name, help=help, aliases=list(aliases))
    gp.set_defaults(group_parser=gp, func=None)
    return gp.add_subparsers(dest="verb", metavar="VERB")
