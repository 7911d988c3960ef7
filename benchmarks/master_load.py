"""A whole cluster's worth of agents and trials against one master: does it hold, and at what cost?

Target (issue 13): 1,000 simulated agents long-polling and 500 trials reporting metrics and logs
at realistic rates against one master on PostgreSQL for a bounded time: zero errors, p99 per
route, the master's total RSS and CPU; p99 under 200 ms for reports and under the poll timeout
plus 100 ms for long-polls.

The master is the real one (`python -m control_plane`, as shipped; RSS and CPU are summed over its
whole process tree, so API worker processes count too), on a throwaway PostgreSQL (tests/pg.py's,
fsync on as in production; `--pg-no-fsync` to turn it off) or on SQLite (`--db sqlite`).

Nothing is faked on the master's side; the benchmark plays the agents and the trial processes over
the real protocol (docs/PROTOCOL.md, agent_bootstrap/agent/daemon.py, harness/core):
- `--agents` agents, one CPU slot each, come up over `--ramp` seconds: each enrols with the pool's
  agent token (`POST /api/v1/agents/register`), then presents the credential it was given and
  long-polls `GET /api/v1/agents/{id}/commands` in a loop with the daemon's timeout (its
  `poll_timeout`, 10 s, lowered to the heartbeat interval the master announces, 5 s);
- one experiment (`random` searcher, max_trials = max_concurrent_trials = `--trials`,
  slots_per_trial 1, trials that never end) is submitted once every agent is registered; the
  scheduler places its trials on the agents, whose polls bring the start commands. An agent then
  does what its daemon does: `starting` event, fetches the model definition with the allocation's
  token, `running` event; no process is started;
- each trial then plays the harness with its allocation token: one searcher-operation read, the
  preemption long-poll (`GET /api/v1/allocations/{id}/signals/preemption`, 60 s, as
  harness/core/_preempt.py), a training report every `--report-every` s (`POST
  …/metrics/batch`, 8 metrics, as harness/core/_reporter.py ships one) followed by a progress
  report, a validation report every `--validate-every` s; and its agent ships its output, a batch
  of `--log-lines` lines every `--log-every` s (`POST /api/v1/task/logs`, as logship.py does);
- clients behave as the real ones: a 503 is retried after its Retry-After (jittered), a timeout,
  a connection error or another 5xx after an exponential backoff; every attempt is counted.
The generator's clients are benchmarks/_leanhttp.py's (plain HTTP/1.1 over asyncio streams, a tenth of
httpx's CPU per request): on a small machine the generator's CPU is taken from the master it measures.
Every logical client has its own keep-alive connection (poll, events, log shipper; the trial's
reporter and preemption watcher), as separate processes would.

The measured window starts once every trial runs, or when `--setup-timeout` has passed (the
run then says how many ran and counts it a failure), and lasts `--seconds`; a request counts if it
was answered and its time overlapped the window (a long-poll begun earlier counts with its whole
wait; long-polls still waiting at the end are dropped). Columns: attempts by kind (2xx, 503,
errors: timeouts, connection errors, other statuses) and latency percentiles of the 2xx per route.
Below the table: the set-up's failures, the master's RSS (peak, sampled every second) and CPU
(seconds and cores over the window) summed over its process tree, PostgreSQL's CPU, the load
generator's CPU, the time it waited for a CPU and its event-loop lag (a late loop delays the
requests it times: then the latencies overstate the master's), and whether the database holds
every acknowledged report and log line afterwards.

`--procs N` splits the agents (and their trials) over N generator processes. They run at nice
`--nice` (-10 by default, where permitted, in a session of their own so that autogroup scheduling
honours it): the kernel shares CPU time per thread and the master has dozens, so on a small machine
an equal-priority generator queues for a CPU and its delay ends up in the latencies.
An overloaded master may lose agents (a poll answered 409: the session was replaced; the agent
registers again and kills what the master lists) and so end their trials (the preemption long-poll
then answers true: the trial acknowledges and exits 0; or its token is refused with 401: it exits
1; its agent reports the exit, as the harness and the daemon do); all are counted as errors and
listed. Exit status 1 when a request got any other answer no real client expects (a 4xx), the
generator raised, acknowledged data is missing from the database, or the set-up did not complete;
targets not reached are reported, not an exit status. `--keep` keeps the master's log.

    .venv/bin/python benchmarks/master_load.py                              # 1000/500, 60 s, PostgreSQL
    .venv/bin/python benchmarks/master_load.py --agents 100 --trials 50 --seconds 15 --db sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from benchmarks._common import (  # noqa: E402
    BenchPostgres,
    MasterProcess,
    loadavg,
    pct,
    print_table,
    temp_dir,
    tree_cpu_seconds,
    tree_rss_bytes,
    tree_run_wait_seconds,
)
from benchmarks._leanhttp import LeanClient, ProtocolError, Response  # noqa: E402
from shipyard_common.agent_protocol import COMMANDS_PATH, EVENTS_PATH, REGISTER_PATH, TOKENS_PATH  # noqa: E402

EXPERIMENT_CONFIG = """\
name: master-load-bench
entrypoint: python3 train.py
hyperparameters:
  lr: {{type: log, base: 10, minval: -4, maxval: -1}}
searcher:
  name: random
  metric: validation_loss
  smaller_is_better: true
  max_length: {{batches: {max_length}}}
  max_trials: {trials}
  max_concurrent_trials: {trials}
resources:
  slots_per_trial: 1
"""
MAX_LENGTH = 100_000_000  # batches: the trials never finish within a run
POOL = "default"
AGENT_PREFIX = "load-agent-"
AGENT_POLL_TIMEOUT_S = 10.0  # agent_bootstrap/agent/config.py's poll_timeout default
PREEMPT_TIMEOUT_S = 60.0  # harness/core/_preempt.py
CLIENT_TIMEOUT_S = 30.0  # the agent's http_timeout; the harness uses the same order
RETRY_AFTER_CAP_S = 30.0  # clients believe at most 30 s
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 10.0
TICK_S = 0.1  # the generator's event-loop lag probe
METRIC_NAMES = ["loss", "accuracy", "lr", "grad_norm", "samples_per_second", "epoch", "val_gap", "aux_loss"]
REPORT_TARGET_MS = 200.0
LONG_POLL_SLACK_MS = 100.0

R_REGISTER = "POST /api/v1/agents/register"
R_COMMANDS = "GET  /api/v1/agents/{id}/commands"
R_EVENTS = "POST /api/v1/agents/{id}/events"
R_MODEL_DEF = "GET  /api/v1/experiments/{id}/model_def"
R_SEARCHER = "GET  /api/v1/trials/{id}/searcher/operation"
R_PREEMPT = "GET  /api/v1/allocations/{id}/signals/preemption"
R_METRICS = "POST /api/v1/trials/{id}/metrics/batch"
R_PROGRESS = "POST /api/v1/trials/{id}/progress"
R_LOGS = "POST /api/v1/task/logs"
R_ACK = "POST /api/v1/allocations/{id}/signals/ack_preemption"
ROUTES = [R_COMMANDS, R_PREEMPT, R_METRICS, R_PROGRESS, R_LOGS, R_EVENTS, R_SEARCHER, R_MODEL_DEF, R_REGISTER, R_ACK]
REPORT_ROUTES = {R_METRICS, R_PROGRESS, R_LOGS, R_EVENTS}

# A request as recorded: route, start (monotonic: one clock for all processes), seconds, outcome
# ("200", "503", "timeout", "conn error", ...).
Record = tuple[str, float, float, str]


@dataclass(frozen=True)
class GenConfig:
    url: str
    pool_token: str
    agent_ids: list[str]
    ramp_s: float
    report_every_s: float
    validate_every_s: float
    log_every_s: float
    log_lines: int
    batches_per_report: int
    poll_timeout_s: float
    preempt_timeout_s: float
    seed: int
    nice: int


@dataclass
class Shared:
    """What the coordinator and the generator processes share (multiprocessing values)."""

    registered: Any
    running: Any
    t0: Any  # start of the measured window (monotonic), 0 until set
    t1: Any  # its end
    abort: Any


@dataclass
class GenResult:
    records: list[Record] = field(default_factory=list)
    lags: list[tuple[float, float]] = field(default_factory=list)  # (time, event-loop lag s)
    unexpected: list[str] = field(default_factory=list)  # answers or failures no real client expects
    acked_reports: set[tuple[int, str, int]] = field(default_factory=set)  # (trial, group, steps)
    acked_lines: int = 0
    ended: Counter[str] = field(default_factory=Counter)  # trials the master stopped, agents it lost
    poll_timeout_s: float = 0.0  # the agents' long-poll timeout, as the master's heartbeat set it
    nice: int = 0  # the generator process's scheduling priority, as it could be set


class TokenRefused(Exception):
    """A trial's allocation token was refused: the master ended its allocation."""


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---- the load generator (one per process) -------------------------------------------------------
@dataclass(eq=False)
class SimAgent:
    agent_id: str
    credential: str = ""
    session_id: str = ""
    poll_timeout_s: float = AGENT_POLL_TIMEOUT_S
    events_http: LeanClient | None = None
    logs_http: LeanClient | None = None
    trials: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)


class Generator:
    def __init__(self, cfg: GenConfig, shared: Shared) -> None:
        self.cfg = cfg
        self.shared = shared
        self.out = GenResult()
        self.rnd = random.Random(cfg.seed)
        self.clients: list[LeanClient] = []
        self.stopping = asyncio.Event()
        self.long_polls: set[asyncio.Task[None]] = set()  # cancelled at the end, not awaited
        self.workers: set[asyncio.Task[None]] = set()  # finish their current request at the end

    def client(self) -> LeanClient:
        c = LeanClient(self.cfg.url, timeout=CLIENT_TIMEOUT_S)
        self.clients.append(c)
        return c

    def spawn(self, coro: Any, long_poll: bool = False) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        group = self.long_polls if long_poll else self.workers
        group.add(task)
        task.add_done_callback(group.discard)
        task.add_done_callback(self._crashed)
        return task

    def _crashed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.out.unexpected.append("generator error: " + "".join(traceback.format_exception(exc))[-1500:])

    async def pause(self, seconds: float) -> bool:
        """Sleep; True if the run ended meanwhile."""
        if self.stopping.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), max(0.0, seconds))
        return self.stopping.is_set()

    async def call(self, http: LeanClient, route: str, method: str, path: str, *, token: str,
                   json: Any = None, params: dict[str, Any] | None = None,
                   timeout: float = CLIENT_TIMEOUT_S, expected: tuple[int, ...] = ()) -> Response | None:
        """One logical request as a real client sends it: a 503 (or 429) is sent again after its
        Retry-After, a timeout, connection error or other 5xx after a backoff; any other answer is
        returned (a 4xx not in `expected` is also noted as unexpected). Every attempt is recorded.
        None if the run ended before an answer came."""
        failures = 0
        headers = {"Authorization": f"Bearer {token}"}
        while True:
            t0 = time.monotonic()
            r: Response | None = None
            try:
                r = await http.request(method, path, headers=headers, json=json, params=params, timeout=timeout)
                outcome = str(r.status_code)
            except TimeoutError:
                outcome = "timeout"
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ProtocolError):
                outcome = "conn error"
            self.out.records.append((route, t0, time.monotonic() - t0, outcome))
            if r is not None and r.status_code < 500 and r.status_code != 429:
                if r.status_code >= 400 and r.status_code not in expected:
                    self.out.unexpected.append(f"{route}: {r.status_code} {r.text[:300]}")
                return r
            failures += 1
            hint = r.headers.get("retry-after") if r is not None else None
            backoff = self.rnd.uniform(0, min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** min(failures, 10)))
            delay = max(backoff, min(float(hint), RETRY_AFTER_CAP_S) * (1 + 0.5 * self.rnd.random())) if hint else backoff
            if await self.pause(delay):
                return None

    # -- the agent ------------------------------------------------------------------------------
    async def register(self, http: LeanClient, agent: SimAgent) -> bool:
        running = sorted(a for a, t in agent.trials.items() if not t.done())
        body = {"agentId": agent.agent_id, "resourcePool": POOL, "version": "load-bench",
                "slots": [{"id": "0", "type": "cpu"}], "runningAllocations": running, "addresses": ["127.0.0.1"]}
        r = await self.call(http, R_REGISTER, "POST", REGISTER_PATH, token=agent.credential or self.cfg.pool_token,
                            json=body)
        if r is None or r.status_code >= 400:
            return False
        reg = r.json()
        agent.credential = reg.get("agentCredential") or agent.credential or self.cfg.pool_token
        agent.session_id = reg["sessionId"]
        hb = reg.get("heartbeatIntervalS") or reg.get("heartbeatIntervalSeconds")
        if hb:  # as the daemon: its poll timeout, lowered to the announced heartbeat interval
            agent.poll_timeout_s = max(1.0, min(self.cfg.poll_timeout_s, float(hb)))
        self.out.poll_timeout_s = max(self.out.poll_timeout_s, agent.poll_timeout_s)
        for alloc in reg.get("kill") or []:  # what the master no longer wants here (after it lost us)
            self.kill(agent, alloc, "killed: the master no longer wants it after the agent reconnected")
        return True

    def kill(self, agent: SimAgent, alloc: str, why: str) -> None:
        if alloc not in agent.killed:  # a kill is repeated until the exit is reported
            agent.killed.add(alloc)
            self.out.ended["trials killed by the master"] += 1
        task = agent.trials.get(alloc)
        if task is not None:
            task.cancel()
        self.spawn(self.event(agent, alloc, "exited", exit_code=137, message=why))

    async def agent(self, agent_id: str) -> None:
        if await self.pause(self.rnd.random() * self.cfg.ramp_s):
            return
        agent = SimAgent(agent_id)
        http = self.client()
        if not await self.register(http, agent):
            if not self.stopping.is_set():
                self.out.unexpected.append(f"agent {agent_id}: registration refused")
            return
        with self.shared.registered.get_lock():
            self.shared.registered.value += 1
        while not self.stopping.is_set():
            r = await self.call(http, R_COMMANDS, "GET", COMMANDS_PATH.format(agentId=agent_id), token=agent.credential,
                                params={"sessionId": agent.session_id, "timeoutSeconds": agent.poll_timeout_s},
                                timeout=agent.poll_timeout_s + CLIENT_TIMEOUT_S, expected=(409,))
            if r is None:
                return
            if r.status_code == 409:  # as the daemon: the master replaced the session (it lost us); register again
                self.out.ended["agents re-registered (the master had replaced their session)"] += 1
                if not await self.register(http, agent):
                    return
                continue
            if r.status_code >= 400:
                await self.pause(1.0)
                continue
            for cmd in r.json().get("commands", []):
                alloc = cmd.get("allocationId")
                if cmd.get("type") == "start" and alloc not in agent.trials:
                    agent.trials[alloc] = self.spawn(self.trial(agent, cmd))
                elif cmd.get("type") == "kill":
                    self.kill(agent, alloc, "killed at the master's request")

    async def event(self, agent: SimAgent, alloc: str, kind: str, **extra: Any) -> bool:
        if agent.events_http is None:
            agent.events_http = self.client()
        ev = {"allocationId": alloc, "type": kind, "time": rfc3339(time.time()), **extra}
        r = await self.call(agent.events_http, R_EVENTS, "POST", EVENTS_PATH.format(agentId=agent.agent_id),
                            token=agent.credential, json={"sessionId": agent.session_id, "events": [ev]},
                            expected=(409,))
        return r is not None and r.status_code < 300

    # -- one trial: the agent's task supervision, then the harness --------------------------------
    async def trial(self, agent: SimAgent, cmd: dict[str, Any]) -> None:
        spec = cmd["spec"]
        alloc = cmd["allocationId"]
        token = spec["token"]
        trial_id = int(spec["trialId"])
        if not await self.event(agent, alloc, "starting"):
            return
        http = self.client()  # the task thread's own client, then the harness's reporter
        r = await self.call(http, R_MODEL_DEF, "GET", "/" + spec["modelDefinitionPath"].lstrip("/"), token=token)
        if r is None or r.status_code >= 400:
            return
        if not await self.event(agent, alloc, "running", pid=10_000 + len(agent.trials)):
            return
        with self.shared.running.get_lock():
            self.shared.running.value += 1
        preempt: asyncio.Task[None] | None = None
        try:
            r = await self.call(http, R_SEARCHER, "GET", f"/api/v1/trials/{trial_id}/searcher/operation", token=token,
                                expected=(401,))
            if r is None:
                return
            if r.status_code >= 400:
                raise TokenRefused
            preempted = asyncio.Event()
            # A long-poll: cancelled, not awaited, when the run ends.
            preempt = self.spawn(self.preemption(alloc, token, preempted), long_poll=True)
            parts = [asyncio.create_task(self.reports(http, trial_id, int(spec.get("runId") or 1), token)),
                     asyncio.create_task(self.logs(agent, alloc, spec.get("taskId") or alloc, token)),
                     asyncio.create_task(preempted.wait())]
            try:
                done, _ = await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
                if self.stopping.is_set():  # let the reporter and the shipper finish their request
                    await asyncio.wait(parts[:2])
                    done = set(parts[:2])
            finally:
                for part in parts:
                    part.cancel()
            for part in done:
                if not part.cancelled() and part.exception() is not None:
                    raise part.exception()
            if preempted.is_set():
                # As the harness: should_preempt() acknowledges, the process saves and exits 0.
                self.out.ended["trials preempted (the master ended or stopped their allocation)"] += 1
                await self.call(http, R_ACK, "POST", f"/api/v1/allocations/{alloc}/signals/ack_preemption",
                                token=token, json={}, expected=(401,))
                await self.event(agent, alloc, "exited", exit_code=0)
        except TokenRefused:
            # The master ended the allocation (it had lost the agent): the harness's next report
            # is refused and the process exits; the agent reports it.
            self.out.ended["trials whose token was refused (allocation ended)"] += 1
            if not self.stopping.is_set():
                await self.event(agent, alloc, "exited", exit_code=1, message="trial refused by the master")
        finally:
            if preempt is not None:
                preempt.cancel()
            with self.shared.running.get_lock():
                self.shared.running.value -= 1

    async def preemption(self, alloc: str, token: str, preempted: asyncio.Event) -> None:
        http = self.client()
        path = f"/api/v1/allocations/{alloc}/signals/preemption"
        while not self.stopping.is_set():
            r = await self.call(http, R_PREEMPT, "GET", path, token=token, params={"timeoutSeconds": self.cfg.preempt_timeout_s},
                                timeout=self.cfg.preempt_timeout_s + 15, expected=(401,))
            if r is None or r.status_code == 401:
                return
            if r.status_code >= 400:
                await self.pause(1.0)
            elif r.json().get("preempt"):
                preempted.set()
                return

    async def reports(self, http: LeanClient, trial_id: int, run_id: int, token: str) -> None:
        cfg = self.cfg
        now = time.monotonic()
        next_train = now + self.rnd.random() * cfg.report_every_s
        next_val = now + cfg.validate_every_s * (0.5 + self.rnd.random())
        steps = 0
        path = f"/api/v1/trials/{trial_id}/metrics/batch"
        while True:
            due = min(next_train, next_val)
            if await self.pause(due - time.monotonic()):
                return
            group = "training" if next_train <= next_val else "validation"
            if group == "training":
                steps += cfg.batches_per_report
                next_train = max(next_train + cfg.report_every_s, time.monotonic())
            else:
                next_val = max(next_val + cfg.validate_every_s, time.monotonic())
            names = METRIC_NAMES if group == "training" else ["validation_loss", "validation_accuracy"]
            report = {"group": group, "metrics": {
                "trialId": trial_id, "trialRunId": run_id, "stepsCompleted": steps,
                "metrics": {"avgMetrics": {n: self.rnd.random() for n in names}}, "reportTime": rfc3339(time.time())}}
            r = await self.call(http, R_METRICS, "POST", path, token=token, json={"reports": [report]}, expected=(401,))
            if r is None:
                return
            if r.status_code >= 400:
                raise TokenRefused
            # (trial, group, steps) is one stored row: a restarted trial's run overwrites its own.
            self.out.acked_reports.add((trial_id, group, steps))
            if group == "training":
                r = await self.call(http, R_PROGRESS, "POST", f"/api/v1/trials/{trial_id}/progress", token=token,
                                    json={"progress": steps / MAX_LENGTH, "isRaw": False}, expected=(401,))
                if r is None:
                    return
                if r.status_code >= 400:
                    raise TokenRefused

    async def logs(self, agent: SimAgent, alloc: str, task_id: str, token: str) -> None:
        cfg = self.cfg
        if agent.logs_http is None:
            agent.logs_http = self.client()
        nxt = time.monotonic() + self.rnd.random() * cfg.log_every_s
        n = 0
        while True:
            if await self.pause(nxt - time.monotonic()):
                return
            nxt = max(nxt + cfg.log_every_s, time.monotonic())
            stamp = rfc3339(time.time())
            entries = []
            for _ in range(cfg.log_lines):
                n += 1
                entries.append({"taskId": task_id, "allocationId": alloc, "agentId": agent.agent_id,
                                "log": f"[rank=0] batch {n}: loss={self.rnd.random():.5f} lr=0.0100 samples/s=1234.5\n",
                                "timestamp": stamp, "level": "LOG_LEVEL_INFO", "stdtype": "stdout", "source": "task"})
            r = await self.call(agent.logs_http, R_LOGS, "POST", "/api/v1/task/logs", token=token, json={"logs": entries},
                                expected=(401,))
            if r is None:
                return
            if r.status_code >= 400:
                raise TokenRefused
            self.out.acked_lines += len(entries)

    # -- the run ----------------------------------------------------------------------------------
    async def ticker(self) -> None:
        """Measures the event loop's lag and ends the run when the coordinator says so."""
        expected = time.monotonic() + TICK_S
        while True:
            await asyncio.sleep(max(0.0, expected - time.monotonic()))
            now = time.monotonic()
            self.out.lags.append((now, now - expected))
            expected = now + TICK_S
            t1 = self.shared.t1.value
            if self.shared.abort.value or (t1 and now >= t1):
                self.stopping.set()
                return

    async def run(self) -> GenResult:
        ticker = asyncio.create_task(self.ticker())
        for agent_id in self.cfg.agent_ids:
            self.spawn(self.agent(agent_id), long_poll=True)
        await ticker
        for t in list(self.long_polls):
            t.cancel()
        # The others end after their current request (at most a client timeout plus backoff).
        if self.workers:
            await asyncio.wait(list(self.workers), timeout=CLIENT_TIMEOUT_S + 5)
        for t in list(self.workers):
            t.cancel()
        await asyncio.sleep(0)
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
        return self.out


def generator_main(cfg: GenConfig, shared: Shared, results: Any) -> None:
    # The generator stands in for a thousand machines: it must not queue for a CPU behind the
    # master's threads (the kernel shares CPU time per thread, and the master has dozens). With
    # autogroup scheduling a nice value only ranks threads within their session's group, so the
    # generator takes a session (a group) of its own and sets that group's nice as well.
    with contextlib.suppress(OSError):
        os.setsid()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, cfg.nice)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(cfg.nice))
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        out = asyncio.run(Generator(cfg, shared).run())
        out.nice = nice
    except BaseException:
        out = GenResult(unexpected=["generator process failed: " + traceback.format_exc()[-1500:]])
        shared.abort.value = 1
    results.put(out)


# ---- the coordinator ----------------------------------------------------------------------------
def submit_experiment(url: str, token: str, trials: int) -> int:
    from examples.demo import files_of

    model_dir = temp_dir("master-load-model-")
    try:
        (model_dir / "train.py").write_text("print('never runs: the benchmark plays the agents and the trials')\n")
        r = httpx.post(url + "/api/v1/experiments", headers={"Authorization": f"Bearer {token}"}, timeout=60,
                       json={"config": EXPERIMENT_CONFIG.format(trials=trials, max_length=MAX_LENGTH),
                             "modelDefinition": files_of(model_dir)})
        r.raise_for_status()
        return int(r.json()["experiment"]["id"])
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def stored_counts(db_url: str) -> tuple[dict[str, int], int]:
    from sqlalchemy import func, select

    from control_plane.db.engine import make_engine
    from control_plane.db.models import Metric, TaskLog

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            groups = {g: int(n) for g, n in conn.execute(
                select(Metric.group_name, func.count()).group_by(Metric.group_name))}
            lines = conn.scalar(select(func.count()).select_from(TaskLog).where(
                TaskLog.source == "task", TaskLog.agent_id.like(AGENT_PREFIX + "%")))
            return groups, int(lines or 0)
    finally:
        engine.dispose()


def wait_for(what: str, value: Any, goal: int, deadline: float, procs: list[Any]) -> bool:
    last_print = 0.0
    t_start = time.monotonic()
    while value.value < goal:
        if time.monotonic() > deadline or any(not p.is_alive() for p in procs):
            print(f"  {what}: only {value.value} of {goal} after {time.monotonic() - t_start:.0f} s", flush=True)
            return False
        if time.monotonic() - last_print > 5:
            print(f"  {what}: {value.value}/{goal}", flush=True)
            last_print = time.monotonic()
        time.sleep(0.2)
    return True


@dataclass
class Usage:
    master_cpu_s: float = 0.0
    master_rss_peak: int = 0
    master_rss_end: int = 0
    master_procs: int = 0
    pg_cpu_s: float | None = None
    gen_cpu_s: list[float] = field(default_factory=list)
    master_wait_s: float = 0.0  # runnable but waiting for a CPU (summed over threads)
    gen_wait_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    load_start: str = ""
    load_end: str = ""


def run(args: argparse.Namespace, db_url: str, base: Path, pg: BenchPostgres | None) -> tuple[list[GenResult], Usage, dict[str, Any]]:
    master = MasterProcess(db_url, base / "master")
    master.start()
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    info: dict[str, Any] = {"setup_ok": False}
    shared = Shared(ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("d", 0.0), ctx.Value("d", 0.0), ctx.Value("i", 0))
    results = ctx.Queue()
    out: list[GenResult] = []
    usage = Usage()
    try:
        admin = master.token()
        r = httpx.post(master.url + TOKENS_PATH, headers={"Authorization": f"Bearer {admin}"}, json={"resourcePool": POOL})
        r.raise_for_status()
        pool_token = r.json()["token"]
        ids = [f"{AGENT_PREFIX}{i:05d}" for i in range(args.agents)]
        for k in range(args.procs):
            cfg = GenConfig(url=master.url, pool_token=pool_token, agent_ids=ids[k::args.procs], ramp_s=args.ramp,
                            report_every_s=args.report_every, validate_every_s=args.validate_every,
                            log_every_s=args.log_every, log_lines=args.log_lines,
                            batches_per_report=args.batches_per_report, poll_timeout_s=AGENT_POLL_TIMEOUT_S,
                            preempt_timeout_s=PREEMPT_TIMEOUT_S, seed=k, nice=args.nice)
            p = ctx.Process(target=generator_main, args=(cfg, shared, results), name=f"load-gen-{k}")
            p.start()
            procs.append(p)
        t_setup = time.monotonic()
        deadline = t_setup + args.setup_timeout
        print(f"set-up: {args.agents} agents registering over {args.ramp:.0f} s ...", flush=True)
        ok = wait_for("agents registered", shared.registered, args.agents, deadline, procs)
        info["registered_s"] = time.monotonic() - t_setup
        if ok:
            t_submit = time.monotonic()
            info["experiment"] = submit_experiment(master.url, admin, args.trials)
            ok = wait_for("trials running", shared.running, args.trials, deadline, procs)
            info["placed_s"] = time.monotonic() - t_submit
        info["setup_ok"] = ok
        info["setup_s"] = time.monotonic() - t_setup
        info["running_at_start"] = shared.running.value
        # An incomplete set-up is measured all the same (a master that cannot keep the cluster
        # placed is what the table should show), unless a generator died.
        if all(p.is_alive() for p in procs):
            print(f"set-up {'done' if ok else 'INCOMPLETE'} after {info['setup_s']:.0f} s "
                  f"({shared.running.value} trials running); measuring {args.seconds:.0f} s ...", flush=True)
            pg_pid = int((pg.data / "postmaster.pid").read_text().split()[0]) if pg is not None else None
            usage.load_start = loadavg()
            t0 = time.monotonic()
            shared.t0.value, shared.t1.value = t0, t0 + args.seconds
            cpu0 = tree_cpu_seconds(master.proc.pid)
            pg0 = tree_cpu_seconds(pg_pid) if pg_pid else None
            gen0 = [tree_cpu_seconds(p.pid) for p in procs]
            wait0 = tree_run_wait_seconds(master.proc.pid)
            gwait0 = [tree_run_wait_seconds(p.pid) for p in procs]
            while time.monotonic() < t0 + args.seconds:
                rss, n = tree_rss_bytes(master.proc.pid)
                usage.master_rss_peak = max(usage.master_rss_peak, rss)
                usage.master_rss_end, usage.master_procs = rss, n
                time.sleep(max(0.0, min(1.0, t0 + args.seconds - time.monotonic())))
            usage.wall_s = time.monotonic() - t0
            usage.master_cpu_s = tree_cpu_seconds(master.proc.pid) - cpu0
            usage.pg_cpu_s = tree_cpu_seconds(pg_pid) - pg0 if pg_pid and pg0 is not None else None
            usage.gen_cpu_s = [tree_cpu_seconds(p.pid) - c for p, c in zip(procs, gen0, strict=True)]
            usage.master_wait_s = tree_run_wait_seconds(master.proc.pid) - wait0
            usage.gen_wait_s = [tree_run_wait_seconds(p.pid) - w for p, w in zip(procs, gwait0, strict=True)]
            usage.load_end = loadavg()
            info["running_at_end"] = shared.running.value
        else:
            shared.abort.value = 1
        shared.t1.value = shared.t1.value or time.monotonic()
        for _ in procs:  # read before joining: a child does not exit while its result sits in the pipe
            out.append(results.get(timeout=CLIENT_TIMEOUT_S + 120))
        for p in procs:
            p.join(30)
        info["stored"] = stored_counts(db_url)
        info["t0"], info["t1"] = shared.t0.value, shared.t1.value
    finally:
        shared.abort.value = 1
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        master.stop()
    return out, usage, info


def classify(outcome: str) -> str:
    if outcome.startswith("2"):
        return "ok"
    if outcome == "503":
        return "503"
    return "error"


TIMELINE_STEP_S = 5.0


def print_timeline(in_window: list[Record], t0: float, wall_s: float) -> None:
    """Report latency through the window, by when the request was sent: a backlog left by the
    set-up, or a stall now and then (a checkpoint, a collection), shows where the p99 comes from."""
    buckets: dict[int, list[float]] = defaultdict(list)
    for rec in in_window:
        if rec[0] in REPORT_ROUTES and classify(rec[3]) == "ok" and rec[1] >= t0:
            buckets[int((rec[1] - t0) // TIMELINE_STEP_S)].append(rec[2] * 1000)
    cells = []
    for i in range(int(wall_s // TIMELINE_STEP_S) + 1):
        lat = sorted(buckets.get(i, []))
        if lat:
            cells.append(f"{i * TIMELINE_STEP_S:.0f}s {pct(lat, 0.5):.0f}/{pct(lat, 0.99):.0f}")
    print("reports through the window (sent at, p50/p99 ms): " + " · ".join(cells))


def report(args: argparse.Namespace, db: str, results: list[GenResult], usage: Usage, info: dict[str, Any]) -> int:
    unexpected = [u for r in results for u in r.unexpected]
    records = [rec for r in results for rec in r.records]
    if not info.get("t0"):
        print("\na load generator process died during the set-up; nothing measured")
        for u in unexpected[:10]:
            print("  " + u)
        return 1
    t0, t1 = info["t0"], info["t1"]
    # A request counts if it got an answer and its time overlapped the window (a long-poll begun in
    # the set-up and answered in the window counts, with its whole wait).
    in_window = [rec for rec in records if rec[1] < t1 and rec[1] + rec[2] >= t0]
    setup = Counter((rec[0], classify(rec[3])) for rec in records if rec[1] + rec[2] < t0)
    by_route: dict[str, list[Record]] = defaultdict(list)
    for rec in in_window:
        by_route[rec[0]].append(rec)
    poll_timeout = max((r.poll_timeout_s for r in results), default=AGENT_POLL_TIMEOUT_S)
    long_poll_timeout = {R_COMMANDS: poll_timeout, R_PREEMPT: PREEMPT_TIMEOUT_S}
    rows: list[list[str]] = []
    verdicts: list[tuple[str, bool]] = []
    for route in ROUTES:
        recs = by_route.get(route, [])
        if not recs:
            continue
        kinds = Counter(classify(r[3]) for r in recs)
        errs = Counter(r[3] for r in recs if classify(r[3]) == "error")
        lat = sorted(r[2] * 1000 for r in recs if classify(r[3]) == "ok")
        p99 = pct(lat, 0.99)
        if route in REPORT_ROUTES:
            target = REPORT_TARGET_MS
        elif route in long_poll_timeout:
            target = long_poll_timeout[route] * 1000 + LONG_POLL_SLACK_MS
        else:
            target = None
        verdict = "-"
        if target is not None:
            passed = bool(lat) and p99 < target
            verdict = "PASS" if passed else "NOT REACHED"
            verdicts.append((f"{route.split()[1]} p99 < {target:.0f} ms", passed))
        rows.append([route, str(len(recs)), f"{len(recs) / usage.wall_s:.1f}", str(kinds["ok"]), str(kinds["503"]),
                     " ".join(f"{k}:{v}" for k, v in sorted(errs.items())) or "0",
                     f"{pct(lat, 0.5):.0f}", f"{pct(lat, 0.95):.0f}", f"{p99:.0f}", f"{lat[-1]:.0f}" if lat else "-",
                     f"{target:.0f}" if target is not None else "-", verdict])
    total_fail = sum(1 for r in records if classify(r[3]) != "ok")
    ended = sum((r.ended for r in results), Counter())
    verdicts.insert(0, ("zero errors (whole run, 503s included)", total_fail == 0 and not unexpected and not ended))
    verdicts.insert(0, (f"every trial placed and running within {args.setup_timeout:.0f} s (set-up)", info["setup_ok"]))

    lags = sorted(lag for r in results for (t, lag) in r.lags if t0 <= t < t1)
    acked_reports = len(set().union(*(r.acked_reports for r in results)))
    acked_lines = sum(r.acked_lines for r in results)
    stored_groups, stored_lines = info["stored"]
    cores = lambda s: s / usage.wall_s  # noqa: E731
    ok_in_window = sum(1 for r in in_window if classify(r[3]) == "ok")

    print()
    placed = (f"trials placed and running {info['placed_s']:.0f} s after submission" if info["setup_ok"] else
              f"SET-UP INCOMPLETE: {info['running_at_start']} of {args.trials} trials running at the start")
    print(f"master_load: {args.agents} agents, {args.trials} trials, {db}, {usage.wall_s:.0f} s measured "
          f"after a {info['setup_s']:.0f} s set-up (agents registered in {info.get('registered_s', 0):.0f} s, "
          f"{placed}; {info.get('running_at_end', 0)} running at the end); {args.procs} generator process(es)")
    print(f"rates per trial: training report + progress every {args.report_every:g} s, validation every "
          f"{args.validate_every:g} s, {args.log_lines} log lines every {args.log_every:g} s; agent long-poll "
          f"{poll_timeout:g} s, preemption long-poll {PREEMPT_TIMEOUT_S:g} s")
    print_table(["route", "requests", "req/s", "2xx", "503", "errors", "p50 ms", "p95 ms", "p99 ms", "max ms",
                 "target ms", ""], rows, right=set(range(1, 11)))
    print()
    setup_bad = Counter()
    for (route, kind), n in setup.items():
        if kind != "ok":
            setup_bad[f"{route.split()[1].removeprefix('/api/v1/')} {kind}"] += n
    print(f"set-up phase: {sum(setup.values())} requests, not 2xx: "
          + (", ".join(f"{k}: {n}" for k, n in sorted(setup_bad.items())) or "none"))
    print_timeline(in_window, t0, usage.wall_s)
    print(f"all routes in the window: {len(in_window)} requests ({len(in_window) / usage.wall_s:.0f}/s), "
          f"{ok_in_window} 2xx")
    print(f"master: RSS {usage.master_rss_peak / 2**20:.0f} MiB peak, {usage.master_rss_end / 2**20:.0f} MiB at the end "
          f"({usage.master_procs} process(es)); CPU {usage.master_cpu_s:.1f} s = {cores(usage.master_cpu_s):.2f} cores"
          f"; {usage.master_cpu_s * 1000 / max(ok_in_window, 1):.2f} ms CPU per answered request (loops included); its threads "
          f"waited for a CPU {cores(usage.master_wait_s):.2f} thread-s per s")
    if usage.pg_cpu_s is not None:
        print(f"postgresql: CPU {usage.pg_cpu_s:.1f} s = {cores(usage.pg_cpu_s):.2f} cores")
    gen_cores = [cores(c) for c in usage.gen_cpu_s]
    lag_p99, lag_max = pct(lags, 0.99) * 1000, (lags[-1] * 1000 if lags else float("nan"))
    gen_waits = [cores(w) for w in usage.gen_wait_s]
    print(f"load generator (nice {','.join(str(r.nice) for r in results)}): CPU {' + '.join(f'{c:.2f}' for c in gen_cores)} cores, waited for a CPU "
          f"{' + '.join(f'{w:.2f}' for w in gen_waits)} s per s; event-loop lag p50 "
          f"{pct(lags, 0.5) * 1000:.0f} ms, p99 {lag_p99:.0f} ms, max {lag_max:.0f} ms")
    if any(c > 0.85 for c in gen_cores):
        print("  the load generator is saturated (a whole core): its own delay is part of the latencies above; "
              "try --procs 2")
    elif lag_p99 > 50:
        print("  the load generator's loop ran late: its own delay is part of the latencies above"
              + (" (it was kept waiting for a CPU: the cores are oversubscribed)" if any(w > 0.1 for w in gen_waits)
                 else ""))
    print(f"machine: 2-core load average {usage.load_start} at the start, {usage.load_end} at the end "
          f"(os.cpu_count()={os.cpu_count()})")
    stored_reports = sum(stored_groups.values())
    print(f"stored: {stored_reports} metric reports for {acked_reports} acknowledged "
          f"(lost {max(0, acked_reports - stored_reports)}), {stored_lines} log lines for {acked_lines} "
          f"acknowledged (lost {max(0, acked_lines - stored_lines)})")
    if ended:
        print("the master lost agents or ended trials (the whole run): "
              + ", ".join(f"{k}: {v}" for k, v in sorted(ended.items())))
    print()
    for what, passed in verdicts:
        print(f"  {what}: {'PASS' if passed else 'NOT REACHED'}")
    if acked_reports > stored_reports or acked_lines > stored_lines:
        unexpected.append("acknowledged reports or log lines are missing from the database")
    if not info["setup_ok"]:
        unexpected.append("the set-up did not complete: not every trial was running when the window began")
    if unexpected:
        print(f"\n{len(unexpected)} unexpected answer(s) or failure(s); the first ones:")
        for u in unexpected[:10]:
            print("  " + u.replace("\n", "\n  "))
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    ap.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    ap.add_argument("--pg-no-fsync", action="store_true", help="PostgreSQL with fsync off (default on)")
    ap.add_argument("--procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--nice", type=int, default=-10,
                    help="scheduling priority of the generator processes (default -10 where permitted, so the "
                         "clients are not starved by the master's threads on a small machine; 0 to share equally)")
    ap.add_argument("--ramp", type=float, default=10.0, help="agents come up over this many seconds")
    ap.add_argument("--setup-timeout", type=float, default=300.0)
    ap.add_argument("--report-every", type=float, default=5.0, help="s between a trial's training reports")
    ap.add_argument("--validate-every", type=float, default=30.0, help="s between a trial's validation reports")
    ap.add_argument("--log-every", type=float, default=2.0, help="s between a trial's log batches")
    ap.add_argument("--log-lines", type=int, default=10, help="lines per log batch")
    ap.add_argument("--batches-per-report", type=int, default=100)
    ap.add_argument("--keep", action="store_true", help="keep the master's state directory and log")
    args = ap.parse_args()
    if args.trials > args.agents:
        ap.error("--trials: at most one trial per agent (each has one slot)")
    base = temp_dir("master-load-")
    pg: BenchPostgres | None = None
    try:
        if args.db == "postgres":
            pg = BenchPostgres(fsync=not args.pg_no_fsync)
            pg.start()
            db_url = pg.create_database()
        else:
            db_url = f"sqlite:///{base / 'master.db'}"
        results, usage, info = run(args, db_url, base, pg)
        return report(args, args.db, results, usage, info)
    finally:
        if pg is not None:
            pg.stop()
        if args.keep:
            print(f"kept: {base} (the master's log: {base / 'master' / 'master.log'})")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
