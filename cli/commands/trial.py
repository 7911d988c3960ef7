"""det trial list|describe|logs"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.formatting import fmt_json, fmt_metric, fmt_size, fmt_time, short_state
from cli.logs import print_logs
from cli.output import kv, print_json, table, trials_table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "trial", "inspect trials", aliases=("t",))
    p = g.add_parser("list", help="the trials of an experiment")
    p.add_argument("experiment_id", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_trials)

    p = g.add_parser("describe", help="a trial: state, latest validation metrics, checkpoints")
    p.add_argument("trial_id", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--metrics", action="store_true", help="also every reported metric, step by step")
    p.set_defaults(func=describe)

    p = g.add_parser("logs", help="a trial's logs")
    p.add_argument("trial_id", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the trial ends")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines (then follow)")
    p.set_defaults(func=logs)


# -- commands --------------------------------------------------------------------------------------
def list_trials(args: Any) -> int:
    trials = authed(args).get(f"/api/v1/experiments/{args.experiment_id}/trials")["trials"]
    if args.json:
        print_json(trials)
    else:
        trials_table(trials)
    return 0


def describe(args: Any) -> int:
    s = authed(args)
    trial = s.get(f"/api/v1/trials/{args.trial_id}")["trial"]
    ckpts = s.get(f"/api/v1/trials/{args.trial_id}/checkpoints")["checkpoints"]
    metrics = s.get(f"/api/v1/trials/{args.trial_id}/metrics")["metrics"] if args.metrics else None
    if args.json:
        out: dict[str, Any] = {"trial": trial, "checkpoints": ckpts}
        if metrics is not None:
            out["metrics"] = metrics
        print_json(out)
        return 0
    latest = trial.get("latestValidation") or {}
    kv([
        ("Trial ID", trial["id"]),
        ("Experiment ID", trial.get("experimentId")),
        ("State", short_state(trial.get("state"))),
        ("H-Params", fmt_json(trial.get("hparams"))),
        ("Rung", trial.get("rung")),
        ("Steps", trial.get("totalBatchesProcessed")),
        ("Best validation", fmt_metric(trial.get("searcherMetricValue"))),
        ("Restarts", trial.get("restarts")),
        ("Progress", f"{100 * float(trial.get('progress') or 0):.0f}%"),
        ("Started", fmt_time(trial.get("startTime"))),
        ("Ended", fmt_time(trial.get("endTime"))),
        ("Task ID", trial.get("taskId")),
        ("Latest checkpoint", trial.get("latestCheckpointUuid") or ""),
        ("Exit reason", trial.get("exitReason") or ""),
        *([("Cannot be placed", trial["pendingReason"])] if trial.get("pendingReason") else []),
    ])
    if latest:
        values = (latest.get("metrics") or {}).get("avgMetrics") or {}
        print()
        table(["Metric", "Value"], [[k, fmt_metric(v)] for k, v in sorted(values.items())],
              title=f"Latest validation (step {latest.get('totalBatches')})")
    print()
    table(["UUID", "Steps", "State", "Metric", "Files", "Size"],
          [[c["uuid"], c.get("stepsCompleted"), short_state(c.get("state")),
            fmt_metric((c.get("training") or {}).get("searcherMetric")), len(c.get("resources") or {}),
            fmt_size(c.get("sizeBytes"))] for c in ckpts],
          title="Checkpoints")
    if metrics is not None:
        print()
        table(["Steps", "Group", "Metrics", "Reported"],
              [[m.get("stepsCompleted"), m.get("group"), fmt_json(m.get("metrics")), fmt_time(m.get("reportTime"))]
               for m in metrics], title="Metrics")
    return 0


def logs(args: Any) -> int:
    print_logs(authed(args), args.trial_id, follow=args.follow, tail=args.tail)
    return 0
