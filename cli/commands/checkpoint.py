"""det checkpoint list|describe|delete|rm"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.errors import CliError
from cli.formatting import fmt_json, fmt_metric, fmt_size, fmt_time, short_state
from cli.output import confirm, kv, print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "checkpoint", "inspect and delete checkpoints", aliases=("c",))
    p = g.add_parser("list", help="the checkpoints of an experiment")
    p.add_argument("experiment_id", type=int)
    p.add_argument("--best", type=int, default=None, metavar="N",
                   help="only the N best by the searcher metric, best first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_checkpoints)

    p = g.add_parser("describe", help="one checkpoint")
    p.add_argument("uuid")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=describe)

    p = g.add_parser("delete", help="delete checkpoints (files are removed by the master's GC)")
    p.add_argument("uuids", nargs="+", metavar="UUID")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=delete)

    p = g.add_parser("rm", help="remove the files matching globs from checkpoints (no glob: re-read their files)")
    p.add_argument("uuids", nargs="+", metavar="UUID")
    p.add_argument("--glob", action="append", default=[], help="a path glob relative to the checkpoint ('**/*': all)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=remove_files)


def rows(ckpts: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for c in ckpts:
        training = c.get("training") or {}
        steps = c.get("stepsCompleted", (c.get("metadata") or {}).get("steps_completed"))
        out.append([training.get("trialId"), steps, short_state(c.get("state")),
                    fmt_metric(training.get("searcherMetric")), c["uuid"], len(c.get("resources") or {}),
                    fmt_size(c.get("sizeBytes") or _size(c))])
    return out


# Narrow enough that a UUID is never folded in a 100-column table (it gets copied and pasted).
HEADERS = ["Trial", "Steps", "State", "Metric", "UUID", "Files", "Size"]


def _size(c: dict[str, Any]) -> int:
    try:
        return sum(int(v) for v in (c.get("resources") or {}).values())
    except (TypeError, ValueError):
        return 0


def list_checkpoints(args: Any) -> int:
    params: dict[str, Any] = {}
    if args.best is not None:
        if args.best < 1:
            raise CliError("--best must be at least 1")
        params = {"sortByAttr": "SORT_BY_SEARCHER_METRIC", "limit": args.best}
    ckpts = authed(args).get(f"/api/v1/experiments/{args.experiment_id}/checkpoints", params=params)["checkpoints"]
    if args.best is not None:
        # Checkpoints without a validation sort last on the master; they are not "best".
        ckpts = [c for c in ckpts if (c.get("training") or {}).get("searcherMetric") is not None]
    if args.json:
        print_json(ckpts)
    else:
        table(HEADERS, rows(ckpts))
    return 0


def describe(args: Any) -> int:
    c = authed(args).get(f"/api/v1/checkpoints/{args.uuid}")["checkpoint"]
    if args.json:
        print_json(c)
        return 0
    training = c.get("training") or {}
    validation = (training.get("validationMetrics") or {}).get("avgMetrics") or {}
    kv([
        ("UUID", c["uuid"]),
        ("State", short_state(c.get("state"))),
        ("Experiment ID", training.get("experimentId")),
        ("Trial ID", training.get("trialId")),
        ("Steps", c.get("stepsCompleted")),
        ("Reported", fmt_time(c.get("reportTime"))),
        ("Size", fmt_size(c.get("sizeBytes") or _size(c))),
        ("Searcher metric", fmt_metric(training.get("searcherMetric"))),
        ("H-Params", fmt_json(training.get("hparams"))),
        ("Validation metrics", fmt_json(validation)),
        ("Metadata", fmt_json(c.get("metadata"))),
        ("Task ID", c.get("taskId")),
        ("Allocation ID", c.get("allocationId")),
    ])
    resources = c.get("resources") or {}
    if resources:
        print()
        table(["File", "Size"], [[k, fmt_size(v)] for k, v in sorted(resources.items())], title="Files")
    return 0


def delete(args: Any) -> int:
    s = authed(args)
    uuids = list(dict.fromkeys(args.uuids))
    if not confirm(f"Delete {len(uuids)} checkpoint(s)? Their files will be removed.", args.yes):
        print("Aborted")
        return 1
    s.delete("/api/v1/checkpoints", {"checkpointUuids": uuids})
    print(f"Deletion of {len(uuids)} checkpoint(s) requested: {', '.join(uuids)}")
    return 0


def remove_files(args: Any) -> int:
    uuids = list(dict.fromkeys(args.uuids))
    if args.glob and not confirm(f"Remove the files matching {', '.join(args.glob)} from {len(uuids)} checkpoint(s)?",
                                 args.yes):
        print("Aborted")
        return 1
    authed(args).post("/api/v1/checkpoints/rm", {"checkpointUuids": uuids, "checkpointGlobs": args.glob})
    print(f"{'Removed matching files from' if args.glob else 'Re-read the files of'} {len(uuids)} checkpoint(s)")
    return 0
