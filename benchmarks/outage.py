"""A 10-minute master outage with trials running on two agents (issue 27, "Outages of any length").

A local cluster (`det deploy local up`: master + two agents with one slot each, trials as
processes, the product's own retry timers: nothing is shrunk) runs a two-trial experiment of the
integration tests' model (tests/integration/model/train.py: one training report per step, a
validation report and a checkpoint every `--validate-every` steps). Once both trials are past
their first checkpoint, the master is SIGKILLed, stays down for `--outage-s` (600 s by default)
and is restarted on the same database. During the outage each trial keeps training and reporting
(its reports go to its disk spool) until its next checkpoint, whose record waits for the master.

The table shows, per trial: metric steps expected, received (distinct) and duplicated (rows
beyond one per step, as the API lists them), validations and checkpoints expected/recorded,
restarts, allocations (1 = never rerun), its end state and whether its harness spooled metrics;
then the outage as measured (SIGKILL to restart) and how long the agents took to reconnect. Pass:
every trial COMPLETED on one allocation, restarts 0, nothing missing or duplicated.

The peer is the behaviour this replaced (not re-run here): the harness gave up on
POST /api/v1/checkpoints after 30 attempts / 300 s and exited 1, so a master down for more than
~3.5 minutes killed every trial that reached a checkpoint (issue 27, item 4).

    .venv/bin/python benchmarks/outage.py                       # SQLite, 600 s outage, ~13 min
    .venv/bin/python benchmarks/outage.py --db postgres --outage-s 120
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import VENV_BIN, BenchPostgres, print_table  # noqa: E402
from tests.integration.conftest import Cluster, pid_alive, trial_config  # noqa: E402


def _connected(c: Cluster) -> set[str]:
    return {a["id"] for a in c.get("/api/v1/agents")["agents"] if a["connected"]}


def _trial_row(c: Cluster, t: dict[str, Any], length: int, validate_every: int) -> tuple[list[Any], bool]:
    tid = t["id"]
    steps = [m["stepsCompleted"] for m in c.metrics(tid, "training")]
    validations = [m["stepsCompleted"] for m in c.metrics(tid, "validation")]
    expected_val = sorted(set(range(validate_every, length + 1, validate_every)) | {length})
    ckpts = c.get(f"/api/v1/trials/{tid}/checkpoints")["checkpoints"]
    ckpt_steps = sorted(int(ck["metadata"]["steps_completed"]) for ck in ckpts)
    tasks = c.get("/api/v1/tasks", includeEnded=True)["allocationIdToSummary"].values()
    allocs = sorted((a for a in tasks if a["trialId"] == tid), key=lambda a: a["registeredTime"])
    ends = ",".join(f"{a.get('endCause') or '-'}:{a.get('exitCode')}" for a in allocs)
    spooled = "event=metrics_spool_opened" in c.logs(tid)
    distinct = set(steps)
    missing = len(set(range(1, length + 1)) - distinct)
    duplicated = len(steps) - len(distinct)
    ok = (t["state"] == "STATE_COMPLETED" and t["restarts"] == 0 and len(allocs) == 1 and missing == 0
          and duplicated == 0 and validations == expected_val and ckpt_steps == expected_val)
    row = [tid, length, len(distinct), duplicated, missing, f"{len(validations)}/{len(expected_val)}",
           f"{len(ckpt_steps)}/{len(expected_val)}", t["restarts"], len(allocs), ends,
           t["state"].removeprefix("STATE_"), "yes" if spooled else "no"]
    return row, ok


def run(db: str, outage_s: float, step_s: float, validate_every: int, after_steps: int) -> bool:
    state = Path(tempfile.mkdtemp(prefix="bench-outage-"))
    os.environ["SHIPYARD_CLI_DIR"] = str(state / "cli")
    os.environ["PATH"] = f"{VENV_BIN}:{os.environ.get('PATH', '')}"  # the agents run python3 from PATH
    pg: BenchPostgres | None = None
    if db == "postgres":
        pg = BenchPostgres(fsync=True)
        pg.start()
        db_url = pg.create_database()
    else:
        db_url = f"sqlite:///{state / 'shipyard.db'}"
    # Long enough to train through the outage up to its next checkpoint and `after_steps` beyond it.
    length = 2 * validate_every + after_steps
    c = Cluster(state / "cluster", db_url, agents=2, master_yaml={"agent_reconnect_cap_s": 2})
    try:
        c.up()
        searcher = {"name": "random", "metric": "validation_loss", "max_length": {"batches": length},
                    "max_trials": 2, "max_concurrent_trials": 2}
        exp_id = c.submit(trial_config("outage-bench", searcher=searcher, hparams={
            "lr": {"type": "double", "minval": 0.05, "maxval": 0.3}, "step_sleep": step_s,
            "validate_every": validate_every}))
        c.wait(lambda: (lambda ts: len(ts) == 2 and all(
            t["state"] == "STATE_RUNNING" and (t.get("totalBatchesProcessed") or 0) > validate_every for t in ts))(
            c.trials(exp_id)), validate_every * step_s * 3 + 120, "both trials past their first checkpoint")
        agents = _connected(c)
        print(f"# {db}: both trials past step {validate_every}; SIGKILL the master for {outage_s:.0f} s", flush=True)
        t_kill = time.monotonic()
        c.kill_master()
        time.sleep(outage_s)
        agents_alive = all(pid_alive(a["pid"]) for a in c.data["agents"])
        t_restart = time.monotonic()
        c.restart_master()  # returns once the restarted master answers
        down_s = time.monotonic() - t_kill
        starting_s = time.monotonic() - t_restart
        t_back = time.monotonic()
        c.wait(lambda: _connected(c) == agents, 120, "both agents reconnected")
        reconnect_s = time.monotonic() - t_back
        c.wait_experiment(exp_id, states=("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR"),
                          timeout=length * step_s * 2 + 300)
        rows, oks = [], []
        for t in c.trials(exp_id):
            row, ok = _trial_row(c, t, length, validate_every)
            rows.append(row)
            oks.append(ok)
        print()
        print_table(["trial", "steps", "received", "duplicated", "missing", "validations", "checkpoints",
                     "restarts", "allocations", "ended (cause:exit)", "state", "spooled"], rows)
        print()
        print_table(["database", "killed for", "master down (SIGKILL→answering)", "of which restarting",
                     "agents alive through it", "agents back after", "verdict"],
                    [[db, f"{outage_s:.0f} s", f"{down_s:.0f} s", f"{starting_s:.0f} s", "yes" if agents_alive else "NO",
                      f"{reconnect_s:.1f} s", "PASS" if all(oks) and agents_alive else "FAIL"]])
        return all(oks) and agents_alive
    finally:
        if os.environ.get("BENCH_KEEP"):
            print(f"# kept {state}")
        c.down()
        if pg is not None:
            pg.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--outage-s", type=float, default=600.0)
    p.add_argument("--step-s", type=float, default=0.1, help="seconds per training step (default 0.1)")
    p.add_argument("--validate-every", type=int, default=500, help="steps between checkpoints (default 500)")
    p.add_argument("--after-steps", type=int, default=300,
                   help="steps the trials train after their checkpoint in the outage (default 300)")
    args = p.parse_args()
    return 0 if run(args.db, args.outage_s, args.step_s, args.validate_every, args.after_steps) else 1


if __name__ == "__main__":
    sys.exit(main())
