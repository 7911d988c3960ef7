"""det trial list|describe|logs"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from cli.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    from cli.main import group

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


# -- streaming -------------------------------------------------------------------------------------
def stream_results(s: Any, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `result` objects of one of the master's NDJSON streams, as they arrive."""
    import httpx

    try:
        with s.request("GET", path, params=params, stream=True) as r:
            if r.status_code >= 400:
                r.read()
                s.check(r)
            for line in r.iter_lines():
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    raise CliError(f"the master sent a malformed stream line: {line[:200]!r}") from None
                if "error" in msg and "result" not in msg:
                    err = msg["error"] or {}
                    raise CliError(f"the master ended the stream: {err.get('message') or err}")
                yield msg.get("result") or {}
    except httpx.ConnectError:
        raise CliError(f"cannot reach the master at {s.master} (is it running? set -m or DET_MASTER)") from None
    except httpx.HTTPError as e:
        raise CliError(f"the stream from {s.master} broke: {type(e).__name__}: {e}") from None


def _line(entry: dict[str, Any]) -> str:
    return str(entry.get("message") or entry.get("log") or "").rstrip("\n")


def print_logs(s: Any, trial_id: int, *, follow: bool, tail: int | None = None) -> None:
    """With `tail`, the last N lines first (newest-first query, printed oldest first); following then
    skips every line up to the newest one already printed."""
    path = f"/api/v1/trials/{trial_id}/logs"
    last_id = -1
    if tail is not None:
        if tail < 0:
            raise CliError("--tail must be >= 0")
        lines = list(stream_results(s, path, {"orderBy": "ORDER_BY_DESC", "limit": tail})) if tail else []
        for entry in reversed(lines):
            print(_line(entry), flush=True)
        if lines:
            last_id = int(lines[0]["id"])
        elif not follow:
            return
        if not follow:
            return
        if not lines:
            # Nothing printed yet, but the tail request must not turn into the whole history.
            last_id = _newest_id(s, path)
    for entry in stream_results(s, path, {"follow": "true"} if follow else {}):
        if last_id >= 0 and int(entry.get("id") or 0) <= last_id:
            continue
        print(_line(entry), flush=True)


def _newest_id(s: Any, path: str) -> int:
    newest = list(stream_results(s, path, {"orderBy": "ORDER_BY_DESC", "limit": 1}))
    return int(newest[0]["id"]) if newest else -1


# -- commands --------------------------------------------------------------------------------------
def list_trials(args: Any) -> int:
    from cli.commands.experiment import trials_table
    from cli.output import print_json
    from cli.session import authed

    trials = authed(args).get(f"/api/v1/experiments/{args.experiment_id}/trials")["trials"]
    if args.json:
        print_json(trials)
    else:
        trials_table(trials)
    return 0


def describe(args: Any) -> int:
    from cli.commands.experiment import fmt_json, fmt_metric, fmt_size, fmt_time
    from cli.output import kv, print_json, short_state, table
    from cli.session import authed

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
    from cli.session import authed

    print_logs(authed(args), args.trial_id, follow=args.follow, tail=args.tail)
    return 0
