"""det job list, det job update"""

from __future__ import annotations

import argparse
from typing import Any

from cli.commands import group
from cli.errors import CliError
from cli.formatting import fmt_time, short_state
from cli.output import print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "job", "the job queue: what runs and waits in each resource pool", aliases=("j",))
    p = g.add_parser("list", aliases=["ls"], help="list the queue, in the order jobs are scheduled")
    p.add_argument("-p", "--resource-pool", help="only this pool's queue (default: every pool)")
    p.add_argument("--limit", type=int, default=0, help="at most this many jobs (default: all)")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--reverse", action="store_true", help="the end of the queue first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_jobs)
    p = g.add_parser("update", aliases=["u"], help="change a job's priority, weight, pool or place in its queue")
    p.add_argument("job_id")
    p.add_argument("-p", "--priority", type=int, help="1-99, lower runs first")
    p.add_argument("-w", "--weight", type=float, help="its share under the fair_share scheduler (> 0)")
    p.add_argument("--resource-pool", help="move the job (its waiting trials) to this pool")
    move = p.add_mutually_exclusive_group()
    move.add_argument("--ahead-of", metavar="JOB_ID", help="place it just ahead of this job (same pool)")
    move.add_argument("--behind-of", metavar="JOB_ID", help="place it just behind this job (same pool)")
    p.set_defaults(func=update_job)


def list_jobs(args: Any) -> int:
    if args.limit < 0 or args.offset < 0:
        raise CliError("--limit and --offset must not be negative")
    params: dict[str, Any] = {"offset": args.offset, "limit": args.limit,
                              "orderBy": "ORDER_BY_DESC" if args.reverse else "ORDER_BY_ASC"}
    if args.resource_pool:
        params["resourcePool"] = args.resource_pool
    resp = authed(args).get("/api/v1/job-queues-v2", params=params)
    jobs = [j.get("full") or j.get("limited") or {} for j in resp.get("jobs") or []]
    if args.json:
        print_json(jobs)
        return 0
    rows = []
    for j in jobs:
        summary = j.get("summary") or {}
        rows.append([summary.get("jobsAhead"), j.get("jobId"), str(j.get("type") or "").removeprefix("TYPE_").lower(),
                     f"{j.get('name')} ({j.get('entityId')})", j.get("username"), j.get("priority"),
                     j.get("weight"), j.get("resourcePool"), short_state(summary.get("state")),
                     f"{j.get('allocatedSlots')}/{j.get('requestedSlots')}", fmt_time(j.get("submissionTime")),
                     j.get("waitingReason") or ""])
    table(["#", "Job ID", "Type", "Name", "User", "Priority", "Weight", "Resource Pool", "State",
           "Slots (acquired/needed)", "Submitted", "Waiting Because"], rows)
    return 0


def update_job(args: Any) -> int:
    update: dict[str, Any] = {"jobId": args.job_id}
    for key, value in (("priority", args.priority), ("weight", args.weight), ("resourcePool", args.resource_pool),
                       ("aheadOf", args.ahead_of), ("behindOf", args.behind_of)):
        if value is not None:
            update[key] = value
    if len(update) == 1:
        raise CliError("nothing to change: give --priority, --weight, --resource-pool, --ahead-of or --behind-of")
    authed(args).post("/api/v1/job-queues", {"updates": [update]})
    changed = ", ".join(f"{k}={v}" for k, v in update.items() if k != "jobId")
    print(f"Updated job {args.job_id}: {changed}")
    return 0
