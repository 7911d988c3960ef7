"""The web UI against MLflow's, on the same data in the same run: time to first render, in headless
Chromium (Debian's, through playwright), of

  - the experiments page with 10,000 experiments (MLflow: the runs table of one experiment holding
    10,000 runs, its list of training runs), until the table's first row is drawn;
  - a trial page whose training loss has 1,000,000 points (MLflow: the run's model-metrics page,
    one metric with 1,000,000 steps), until the chart's line is drawn.

Both servers run as processes on SQLite with the same number of serving processes (--workers, default
1: Shipyard's api_workers, MLflow's `mlflow server --workers`; Shipyard at 1 is one process serving
the API and running its control loops), both are filled with the same numbers by direct inserts
into their own schemas (the data set is too large to post through either API in a benchmark's
time), and every measurement opens a fresh browser context (cold cache, no service worker). Each
page is measured REPEAT times per system, in turns, and the median is reported. Target: Shipyard
at least 3x faster on both pages.

Run: .venv/bin/python benchmarks/ui.py [--experiments 10000] [--points 1000000] [--repeat 3] [--workers 1]
(needs mlflow: pip install -e '.[bench]', and /usr/bin/chromium)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import ADMIN_PASSWORD, MasterProcess, MlflowServer, loadavg, print_table, temp_dir

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHUNK = 50_000
TIMEOUT_MS = 300_000

CONFIG = """
name: bench-0
entrypoint: python3 train.py
hyperparameters:
  lr: {type: double, minval: 0.001, maxval: 0.1}
searcher: {name: single, metric: loss, smaller_is_better: true, max_length: {batches: 1000000}}
"""


def loss_at(step: int) -> float:
    return 1.0 / (1.0 + step / 1000.0) + 0.01 * random.random()


# ---- Shipyard ---------------------------------------------------------------------------------
def fill_shipyard(db_path: Path, state_dir: Path, experiments: int, points: int) -> int:
    """Experiments (each with one completed trial and a best metric) and one trial with `points`
    training reports. Returns that trial's id."""
    from control_plane.auth import Principal, TokenKind
    from control_plane.config import load_config
    from control_plane.db.engine import transaction
    from control_plane.master import Master
    from control_plane.services import experiments as exp_service

    cfg = load_config(env={}, db_url=f"sqlite:///{db_path}", state_dir=str(state_dir / "state"),
                      admin_password=ADMIN_PASSWORD)
    master = Master(cfg)
    master.prepare()
    admin = Principal(kind=TokenKind.USER, token_id=0, user_id=1, username="admin", admin=True)
    train_py = {"path": "train.py", "type": 48, "content": "cHJpbnQoJ2hpJykK", "mode": 0o644, "mtime": "0",
                "uid": 0, "gid": 0}
    with transaction(master.sessions) as s:
        exp, _ = exp_service.create(s, master, admin, exp_service.NewExperiment(CONFIG, [train_py]))
        exp_id = exp.id
    master.stop()

    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    # The template, finished: no loop has anything left to do with it or its copies.
    conn.execute("UPDATE experiments SET state='STATE_COMPLETED', progress=1.0 WHERE id=?", (exp_id,))
    conn.execute("UPDATE trials SET state='STATE_COMPLETED', best_validation=0.5 WHERE experiment_id=?", (exp_id,))
    conn.execute("UPDATE allocations SET state='terminated', end_cause='exited' WHERE experiment_id=?", (exp_id,))
    exp_row = dict(conn.execute("SELECT * FROM experiments WHERE id=?", (exp_id,)).fetchone())
    trial_row = dict(conn.execute("SELECT * FROM trials WHERE experiment_id=?", (exp_id,)).fetchone())
    trial_id = int(trial_row["id"])
    start = datetime(2026, 1, 1, tzinfo=UTC)
    exps, trials = [], []
    for i in range(1, experiments):
        e = dict(exp_row, id=exp_id + i, name=f"bench-{i}", job_id=str(uuid.uuid4()),
                 start_time=(start + timedelta(minutes=i)).strftime("%Y-%m-%d %H:%M:%S.%f"))
        exps.append(e)
        trials.append(dict(trial_row, id=trial_id + i, experiment_id=exp_id + i, task_id=str(uuid.uuid4()),
                           best_validation=random.random()))
    for table, rows in (("experiments", exps), ("trials", trials)):
        if rows:
            cols = list(rows[0])
            conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                             [tuple(r[c] for c in cols) for r in rows])
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    for lo in range(0, points, CHUNK):
        conn.executemany(
            "INSERT INTO metrics (trial_id, group_name, steps_completed, trial_run_id, metrics, report_time) "
            "VALUES (?, 'training', ?, 0, ?, ?)",
            [(trial_id, step, json.dumps({"avg_metrics": {"loss": loss_at(step)}}), now)
             for step in range(lo + 1, min(points, lo + CHUNK) + 1)])
    conn.execute("UPDATE trials SET steps_completed=? WHERE id=?", (points, trial_id))
    conn.commit()
    conn.close()
    return trial_id


# ---- MLflow -----------------------------------------------------------------------------------
def fill_mlflow(server: MlflowServer, db_path: Path, runs: int, points: int) -> tuple[str, str]:
    """One experiment with `runs` finished runs (a param, a metric), the first run with `points`
    steps of its loss. Returns (experiment id, that run's id)."""
    from mlflow import MlflowClient

    client = MlflowClient(server.url)
    exp_id = client.create_experiment("bench")
    # The classic (model training) view of the experiment, not the GenAI one.
    client.set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")
    template = client.create_run(exp_id, run_name="run-00000")
    client.log_param(template.info.run_id, "lr", "0.01")
    client.log_metric(template.info.run_id, "loss", loss_at(0), step=0)
    client.set_terminated(template.info.run_id)
    conn = sqlite3.connect(db_path, timeout=30)
    conn.row_factory = sqlite3.Row
    run_row = dict(conn.execute("SELECT * FROM runs WHERE run_uuid=?", (template.info.run_id,)).fetchone())
    base_ms = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    rows, tags, params, latest = [], [], [], []
    for i in range(1, runs):
        rid = uuid.uuid4().hex
        name = f"run-{i:05d}"
        rows.append(dict(run_row, run_uuid=rid, name=name, start_time=base_ms + i * 60_000,
                         end_time=base_ms + i * 60_000 + 1000,
                         artifact_uri=run_row["artifact_uri"].replace(template.info.run_id, rid)))
        tags.append(("mlflow.runName", name, rid))
        params.append(("lr", f"{random.uniform(0.001, 0.1):.5f}", rid))
        latest.append(("loss", random.random(), base_ms, 0, 0, rid))
    cols = list(run_row)
    conn.executemany(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                     [tuple(r[c] for c in cols) for r in rows])
    conn.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", tags)
    conn.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)", params)
    conn.executemany("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                     "VALUES (?, ?, ?, ?, ?, ?)", latest)
    rid = template.info.run_id
    for lo in range(0, points, CHUNK):
        conn.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, 0)",
                         [("loss", loss_at(step), base_ms + step, rid, step)
                          for step in range(lo + 1, min(points, lo + CHUNK) + 1)])
    conn.execute("UPDATE latest_metrics SET step=?, value=? WHERE run_uuid=? AND key='loss'", (points, loss_at(points), rid))
    conn.commit()
    conn.close()
    return exp_id, rid


# ---- measuring --------------------------------------------------------------------------------
class Reporter:
    """Appends one report to each system's long series before each measurement of its trial page, as
    a training trial does: the master's cache of drawn series (keyed by the series' count and last
    step) is missed, so every measurement reads the series, like a first visit."""

    def __init__(self, shipyard_db: Path, trial_id: int, mlflow_db: Path, run_id: str, points: int) -> None:
        self.shipyard_db, self.trial_id, self.mlflow_db, self.run_id = shipyard_db, trial_id, mlflow_db, run_id
        self.step = points

    def shipyard(self) -> None:
        self.step += 1
        with sqlite3.connect(self.shipyard_db, timeout=30) as conn:
            conn.execute("INSERT INTO metrics (trial_id, group_name, steps_completed, trial_run_id, metrics, report_time) "
                         "VALUES (?, 'training', ?, 0, ?, ?)",
                         (self.trial_id, self.step, json.dumps({"avg_metrics": {"loss": loss_at(self.step)}}),
                          datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")))

    def mlflow(self) -> None:
        self.step += 1
        with sqlite3.connect(self.mlflow_db, timeout=30) as conn:
            conn.execute("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES ('loss', ?, ?, ?, ?, 0)",
                         (loss_at(self.step), int(time.time() * 1000), self.run_id, self.step))


def time_page(browser: Any, url: str, wait: Any, cookies: list[dict[str, Any]] | None = None,
              before: Any = None) -> float:
    """Seconds from navigation until `wait(page)` returns, in a fresh context."""
    if before is not None:
        before()
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        if cookies:
            ctx.add_cookies(cookies)
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto(url, wait_until="commit", timeout=TIMEOUT_MS)
        wait(page)
        return time.perf_counter() - t0
    finally:
        ctx.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=10_000)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1,
                    help="serving processes on each side: Shipyard's api_workers and MLflow's --workers")
    args = ap.parse_args()
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    try:
        import mlflow  # noqa: F401
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        print(f"skipped: needs mlflow and playwright ({e}): .venv/bin/pip install -e '.[bench,dev]'")
        return 0
    if not Path(CHROMIUM).exists():
        print(f"skipped: needs Chromium at {CHROMIUM} (apt-get install chromium, or bash tests/system_deps.sh)")
        return 0

    work = temp_dir("shipyard-ui-bench-")
    random.seed(7)
    ran = (f"Shipyard api_workers={args.workers}, MLflow server --workers {args.workers}; both SQLite")
    print(f"== UI first render: {args.experiments} experiments, {args.points} metric points; "
          f"{args.repeat} runs per page; {ran}; work dir {work}")
    t = time.monotonic()
    trial_id = fill_shipyard(work / "shipyard.db", work / "master", args.experiments, args.points)
    print(f"   Shipyard filled in {time.monotonic() - t:.0f}s")
    os.environ["SHIPYARD_API_WORKERS"] = str(args.workers)  # MasterProcess passes its environment on
    master = MasterProcess(f"sqlite:///{work / 'shipyard.db'}", work / "master")
    mlf = MlflowServer(f"sqlite:///{work / 'mlflow.db'}", work / "mlflow", workers=args.workers)
    try:
        master.start()
        mlf.start()
        t = time.monotonic()
        mlf_exp, mlf_run = fill_mlflow(mlf, work / "mlflow.db", args.experiments, args.points)
        print(f"   MLflow filled in {time.monotonic() - t:.0f}s; load average {loadavg()}")
        cookie = [{"name": "shipyard_session", "value": master.token(), "url": master.url}]
        reporter = Reporter(work / "shipyard.db", trial_id, work / "mlflow.db", mlf_run, args.points)
        newest = f"bench-{args.experiments - 1}"
        newest_run = f"run-{args.experiments - 1:05d}"
        pages = {
            "experiments page": (
                lambda b: time_page(b, master.url + "/", lambda p: p.wait_for_selector(
                    f"#experiments-table tbody tr >> text={newest}", timeout=TIMEOUT_MS), cookie),
                lambda b: time_page(b, f"{mlf.url}/#/experiments/{mlf_exp}/runs", lambda p: p.wait_for_selector(
                    f".ag-row >> text={newest_run}", timeout=TIMEOUT_MS))),
            f"trial page, {args.points} points": (
                lambda b: time_page(b, f"{master.url}/trials/{trial_id}", lambda p: p.wait_for_function(
                    "() => Number(document.querySelector('#chart-training')?.dataset.points || 0) > 0",
                    timeout=TIMEOUT_MS), cookie, reporter.shipyard),
                lambda b: time_page(b, f"{mlf.url}/#/experiments/{mlf_exp}/runs/{mlf_run}/model-metrics",
                                    lambda p: p.wait_for_function(
                                        "() => [...document.querySelectorAll('.js-plotly-plot path.js-line')]"
                                        ".some(e => (e.getAttribute('d') || '').length > 100)",
                                        timeout=TIMEOUT_MS), before=reporter.mlflow)),
        }
        results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pages}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for name, (ours, theirs) in pages.items():
                    ours(browser)  # a warm-up of each server (imports, first queries), not counted
                    theirs(browser)
                    for _ in range(args.repeat):
                        results[name][0].append(ours(browser))
                        results[name][1].append(theirs(browser))
            finally:
                browser.close()
    finally:
        master.stop()
        mlf.stop()

    rows = []
    ok = True
    for name, (ours, theirs) in results.items():
        a, b = statistics.median(ours), statistics.median(theirs)
        ratio = b / a if a else float("inf")
        ok &= ratio >= 3
        rows.append([name, f"{a * 1000:.0f}", f"{b * 1000:.0f}", f"{ratio:.1f}x",
                     " ".join(f"{x * 1000:.0f}" for x in ours), " ".join(f"{x * 1000:.0f}" for x in theirs)])
    print(f"\n{ran}")
    w = f"{args.workers} worker{'s' if args.workers > 1 else ''}"
    print_table(["page (median of runs)", f"Shipyard ms ({w})", f"MLflow ms ({w})", "MLflow/Shipyard", "Shipyard runs",
                 "MLflow runs"], rows)
    print(f"\ntarget (both >= 3x faster than MLflow): {'met' if ok else 'NOT met'}; load average {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
