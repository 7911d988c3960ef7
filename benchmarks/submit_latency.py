"""Submit-to-start and kill-to-gone latency on an idle local cluster.

Target (issue): p50 under 1 s from `POST /api/v1/experiments` to the trial process running.

A local cluster (`det deploy local up`: master + 1 agent with 1 slot) in a temporary state
directory, with the master on SQLite (what `det deploy local` uses) and then on PostgreSQL (a
throwaway server from tests/pg.py). Each run submits a one-trial experiment whose entrypoint is a tiny script in the model
definition: its first statements write `time.time()` and its pid to a file named by an
environment variable of the experiment config, then it sleeps. Then the run kills the experiment
and polls the pid until the process is gone. Both ends are read on the same host clock:

- start latency: entrypoint's `time.time()` minus the time just before the submit request;
- kill latency: the process gone (no longer running, zombie counts as gone) minus the time just
  before `POST /api/v1/experiments/{id}/kill`;
- slot free: the master shows the agent's slot empty again after the kill (the next run waits
  for it, so every submit lands on an idle agent).

The agent runs `python3` from PATH, so the run puts this virtualenv's bin first in PATH.
The cost of `report_training_metrics` in the training loop is measured by benchmarks/report_cost.py;
a short run of its main scenario is included here (`--report-calls 0` skips it).

Reference, not measured here: Determined starts each trial in a container, which takes seconds
(image pull aside) before the entrypoint runs.

    .venv/bin/python benchmarks/submit_latency.py              # 20 runs on SQLite and on PostgreSQL, ~2 min
    .venv/bin/python benchmarks/submit_latency.py --runs 50 --db sqlite
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks._common import VENV_BIN, BenchPostgres, loadavg, pct, print_table  # noqa: E402

TARGET_START_P50_S = 1.0

# The entrypoint: the timestamp comes first, before any import that is not needed for it.
ENTRYPOINT = """\
import os, time
t = time.time()
path = os.environ["BENCH_MARK_FILE"]
with open(path + ".tmp", "w") as f:
    f.write('{"t": %r, "pid": %d}' % (t, os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(60)
"""

CONFIG = """\
name: submit-latency-{n}
entrypoint: python3 bench_entry.py
environment:
  environment_variables:
    - BENCH_MARK_FILE={mark}
searcher:
  name: single
  metric: loss
  max_length: {{batches: 100}}
resources:
  slots_per_trial: 1
max_restarts: 0
"""


def model_definition(folder: Path) -> list[dict[str, Any]]:
    from examples.demo import files_of

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench_entry.py").write_text(ENTRYPOINT)
    return files_of(folder)


def process_gone(pid: int) -> bool:
    from cli.deploy_local import alive

    return not alive(pid)


class Cluster:
    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def agent_idle(self) -> bool:
        agents = self.http.get("/api/v1/agents").json()["agents"]
        return bool(agents) and all(a["connected"] and all(s["container"] is None for s in a["slots"].values())
                                    for a in agents)

    def experiment_state(self, exp_id: int) -> str:
        return str(self.http.get(f"/api/v1/experiments/{exp_id}").json()["experiment"]["state"])


def wait_for(cond: Any, timeout: float, what: str, interval: float = 0.002) -> float:
    """Poll until cond() is true; the time.time() at which it was first seen true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.time()
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def one_run(c: Cluster, n: int, files: list[dict[str, Any]], marks: Path) -> dict[str, float]:
    mark = marks / f"run-{n}.json"
    cfg = CONFIG.format(n=n, mark=mark)
    t_submit = time.time()
    r = c.http.post("/api/v1/experiments", json={"config": cfg, "modelDefinition": files})
    t_created = time.time()
    r.raise_for_status()
    exp_id = int(r.json()["experiment"]["id"])
    wait_for(mark.exists, 60, f"experiment {exp_id}'s entrypoint to start")
    started = json.loads(mark.read_text())
    pid = int(started["pid"])

    t_kill = time.time()
    c.http.post(f"/api/v1/experiments/{exp_id}/kill").raise_for_status()
    t_gone = wait_for(lambda: process_gone(pid), 60, f"pid {pid} to exit")
    t_free = wait_for(c.agent_idle, 60, "the agent's slot to be free", interval=0.02)
    wait_for(lambda: c.experiment_state(exp_id) in ("STATE_CANCELED", "STATE_COMPLETED", "STATE_ERROR"), 60,
             f"experiment {exp_id} to end", interval=0.05)
    return {
        "created": t_created - t_submit,
        "start": float(started["t"]) - t_submit,
        "kill": t_gone - t_kill,
        "free": t_free - t_kill,
    }


def report_cost(calls: int) -> dict[str, Any] | None:
    """benchmarks/report_cost.py's main scenario (3 metrics, master up), shorter."""
    if calls <= 0:
        return None
    import benchmarks.report_cost as rc

    proc, url = rc.start_sink()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return rc.run_scenario("3 metrics, master up", calls, url, {"loss": 0.25, "accuracy": 0.91, "lr": 1e-3},
                                   None, Path(tmp))
    finally:
        proc.terminate()
        proc.wait(10)


def run_cluster(db: str, runs: int, warmup: int, keep: bool) -> list[dict[str, float]]:
    from cli import deploy_local
    from tests.pg import free_port

    state = Path(tempfile.mkdtemp(prefix=f"submit-latency-{db}-"))
    marks = state / "marks"
    marks.mkdir()
    os.environ["SHIPYARD_CLI_DIR"] = str(state / "cli")  # up()'s login token stays in the temp dir
    pg: BenchPostgres | None = None
    rows: list[dict[str, float]] = []
    try:
        db_url = None
        if db == "postgres":
            pg = BenchPostgres(fsync=True)
            pg.start()
            db_url = pg.create_database()
        t0 = time.monotonic()
        info = deploy_local.up(state / "cluster", agents=1, port=free_port(), db=db_url, slots=1, pool_config=None)
        print(f"  {db}: cluster up in {time.monotonic() - t0:.1f} s at {info['master_url']}", flush=True)
        password = (state / "cluster" / "admin-password").read_text().strip()
        r = httpx.post(info["master_url"] + "/api/v1/auth/login", json={"username": "admin", "password": password})
        r.raise_for_status()
        c = Cluster(info["master_url"], r.json()["token"])
        wait_for(c.agent_idle, 30, "the agent to register", interval=0.1)
        files = model_definition(state / "model")
        for n in range(warmup + runs):
            res = one_run(c, n, files, marks)
            label = "warm-up" if n < warmup else f"run {n - warmup + 1:>2}"
            print(f"  {db} {label}: start {res['start'] * 1000:6.0f} ms  kill {res['kill'] * 1000:6.0f} ms  "
                  f"slot free {res['free'] * 1000:6.0f} ms", flush=True)
            if n >= warmup:
                rows.append(res)
    finally:
        deploy_local.down(state / "cluster", quiet=True)
        if pg is not None:
            pg.stop()
        if keep:
            print(f"  kept the state directory {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="measured runs per database (default 20)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs first (default 1)")
    ap.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both",
                    help="the master's database (default both: SQLite as `det deploy local` uses, then PostgreSQL)")
    ap.add_argument("--report-calls", type=int, default=20000,
                    help="report_training_metrics calls for the cost line (default 20000; 0 skips)")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' state directories (logs)")
    args = ap.parse_args()
    logging.getLogger("harness").setLevel(logging.CRITICAL)
    # The agent inherits this environment: `python3` in entrypoints must be this venv's python.
    os.environ["PATH"] = f"{VENV_BIN}:{os.environ.get('PATH', '')}"
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]

    print(f"submit latency: {args.runs} runs (+{args.warmup} warm-up) per database, local cluster with 1 agent x "
          f"1 slot; {os.cpu_count()} CPUs shared; load average at start {loadavg()}", flush=True)
    results = {db: run_cluster(db, args.runs, args.warmup, args.keep) for db in dbs}
    cost = report_cost(args.report_calls)

    print(f"\nload average at end {loadavg()}\n")
    headers = ["db", "measure", "n", "p50 ms", "p90 ms", "max ms", "mean ms", "target"]
    table = []
    for db, rows in results.items():
        for key, name, target in [
            ("created", "POST /experiments answered", ""),
            ("start", "submit -> entrypoint running", f"p50 < {TARGET_START_P50_S * 1000:.0f} ms"),
            ("kill", "kill -> process gone", ""),
            ("free", "kill -> slot free (master view)", ""),
        ]:
            values = sorted(r[key] * 1000 for r in rows)
            verdict = ""
            if target:
                verdict = f"{target}: {'met' if pct(values, 0.5) < TARGET_START_P50_S * 1000 else 'NOT met'}"
            table.append([db, name, len(values), f"{pct(values, 0.5):.0f}", f"{pct(values, 0.9):.0f}",
                          f"{values[-1]:.0f}" if values else "-",
                          f"{statistics.fmean(values):.0f}" if values else "-", verdict])
    print_table(headers, table, right={2, 3, 4, 5, 6})
    if cost is not None:
        print(f"\nreport_training_metrics on the training loop's thread (benchmarks/report_cost.py, "
              f"{args.report_calls:,} calls, 3 metrics, master up): mean {cost['mean']:.0f} ns, p50 {cost['p50']} ns, "
              f"p99 {cost['p99']} ns, max {cost['max']} ns; delivered {cost['delivered']}")
    print("\nreference (not measured): Determined starts each trial in a container, seconds before the "
          "entrypoint runs (image pull not counted). p50/p90 are nearest-rank samples.")
    return 0

if __name__ == "__main__":
    sys.exit(main())
