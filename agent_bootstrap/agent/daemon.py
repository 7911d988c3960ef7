"""The agent daemon: connection loop, command handling, task supervision and shutdown.

Threads and what each owns:
  main        waits for a stop (signal, fatal error) and runs the shutdown
  control     register → long-poll commands (the heartbeat) → dispatch; reconnects with backoff
  events      delivers task events in order, with whatever session is current (retries forever;
              the outbox is small: at most three events per allocation)
  log-shipper batches task output to the master (logship.LogShipper)
  task-<id>   one per allocation: fetch + unpack the model definition, start, wait/kill, report
  task-spawner (process runtime) forks every task process, see runtime/process.py

Connection rules (docs/PROTOCOL.md):
  * a poll or registration that fails with MasterUnavailable starts reconnecting: registrations,
    each after an exponential, jittered backoff capped at the lower of `agent_reconnect_backoff_max`
    and the cap the master announced (the master declares an agent lost only after that cap plus
    its heartbeat timeout). Tasks keep running, events wait in the outbox and logs in the bounded
    shipper buffer. The agent keeps trying for as long as it runs; only an explicit limit
    (`agent_reconnect_attempts` failures in a row, or `reconnect_give_up_s` since the connection
    was lost) makes it give up: it kills its tasks, runs `on_connection_lost` once and exits with
    EXIT_CONNECTION_LOST. (Tasks are killed before the hook so that a hook that powers the
    instance off runs last.)
  * registration lists the tasks still running and those that exited while the master was away
    and whose exit event it has not taken yet: the master keeps their allocations for that event
    (its exit code decides whether the trial's restarts count it), instead of ending them as lost.
  * every other wait on the master (events, logs, the model definition) retries with a backoff
    capped at `retry_cap()` and has no bound by default; `model_def_fetch_attempts` sets one.
  * 409 on a poll: the session was replaced, register again at once (not a failure).
  * identity (credential.py): the first registration enrols the agent with the token it was given
    and returns its own credential, stored in the work dir and used from then on. A credential
    the master no longer knows (401: enrolment reset by an admin, a new database) is dropped and
    the agent enrols again with its enrolment token.
  * 401/403 (or any other 4xx) otherwise at registration or on a poll: one readable line, tasks
    killed, exit EXIT_REFUSED — retrying with the same credential cannot succeed. At the first
    registration that is a configuration mistake and nothing else happens; after the agent had been
    registered it is as cut off as after a lost connection, so `on_connection_lost` runs as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_never,
    stop_when_event_set,
    wait_random_exponential,
)

from agent_bootstrap.agent import __version__, determined_env, identity, interruption, tensorboard_dirs
from agent_bootstrap.agent.client import (
    AuthRefused,
    MasterClient,
    MasterUnavailable,
    RequestRefused,
    StaleSession,
    backoff_delay,
)
from agent_bootstrap.agent.config import AgentConfig
from agent_bootstrap.agent.credential import CredentialStore
from agent_bootstrap.agent.devices import Slot, cuda_visible_devices
from agent_bootstrap.agent.logship import HttpLogSink, LogLine, LogShipper
from agent_bootstrap.agent.runtime import (
    ContainerLaunch,
    LaunchSpec,
    LeftoverTask,
    Mount,
    OutputFn,
    RunAs,
    StartFailed,
    Stream,
    TaskHandle,
    TaskRuntime,
    stop_task,
)
from shipyard_common import host_env
from shipyard_common.agent_protocol import (
    MAX_EVENT_MESSAGE,
    ContainerSpec,
    InterruptionRequest,
    KillCommand,
    RegisterRequest,
    StartCommand,
    TaskEvent,
    TaskEventType,
    TaskSpec,
    parse_command,
)

log = logging.getLogger("shipyard.agent")

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_REFUSED = 3
EXIT_CONNECTION_LOST = 4

# Exit code reported when the agent could not set the task up (model definition, slots): like
# docker's 125, "the runtime failed", as opposed to 126/127 from the entrypoint itself.
SETUP_FAILED = 125

ClientFactory = Callable[[], MasterClient]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _signal_name(code: int) -> str | None:
    if code > 128:
        with contextlib.suppress(ValueError):
            return signal.Signals(code - 128).name
    return None


def outbound_addresses(master_url: str) -> list[str]:
    """The local address used to reach the master (a UDP connect sends nothing)."""
    parts = urlsplit(master_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return [s.getsockname()[0]]
    except OSError:
        return []


def task_environment(base: dict[str, str], spec: TaskSpec, slots: list[Slot], agent_id: str) -> dict[str, str]:
    """A process-runtime task's environment: the allowlisted part of the agent's own
    (shipyard_common/host_env.py: PATH, locale, proxies, CA bundles, storage endpoints, never
    credentials, DET_AGENT_* or the master's SHIPYARD_* settings), then the spec's (the master's
    DET_* variables and the experiment's environment_variables), then what only the agent knows:
    the visible GPUs and its id."""
    env = host_env.inherited(base)
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(slots)
    env["DET_AGENT_ID"] = agent_id
    env.setdefault("PYTHONUNBUFFERED", "1")  # so a Python trial's prints reach the logs as they happen
    # The process runtime runs tasks in the agent's own Python environment (there is no container
    # image): `python3 train.py` must find that interpreter and its packages first, unless the
    # experiment sets PATH itself (environment.environment_variables, e.g. another venv's bin).
    bindir = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    if "PATH" not in spec.env and bindir and bindir not in path.split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + path
    return env


def container_environment(spec: TaskSpec, slots: list[Slot], agent_id: str) -> dict[str, str]:
    """A container's environment: the spec's and what only the agent knows, nothing of the agent's
    own environment (the image brings its PATH and the rest)."""
    env = dict(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(slots)  # uuids: the same inside the container
    env["DET_AGENT_ID"] = agent_id
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass(eq=False)
class _Task:
    allocation_id: str
    spec: TaskSpec | None
    state: Literal["starting", "running", "exited"] = "starting"
    kill_requested: threading.Event = field(default_factory=threading.Event)
    kill_grace: float = 10.0
    kill_reason: str = "killed at the master's request"
    handle: TaskHandle | None = None
    exit_event: TaskEvent | None = None
    thread: threading.Thread | None = None

    def request_kill(self, grace: float, reason: str) -> None:
        if not self.kill_requested.is_set():
            self.kill_grace = grace
            self.kill_reason = reason
            self.kill_requested.set()


class _Fatal(Exception):
    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


class EventOutbox:
    """Task events, delivered in order with the current session; kept until the master took them."""

    def __init__(self, agent: Agent, client: MasterClient) -> None:
        self.agent = agent
        self.client = client
        self._cond = threading.Condition()
        self._pending: list[TaskEvent] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, event: TaskEvent) -> None:
        with self._cond:
            self._pending.append(event)
            self._cond.notify_all()

    def has_pending(self, allocation_id: str, kind: str) -> bool:
        with self._cond:
            return any(e.allocation_id == allocation_id and e.type == kind for e in self._pending)

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def _send(self, batch: list[TaskEvent], session: str) -> None:
        try:
            self.client.post_events(self.agent.agent_id, session, batch)
        except RequestRefused as e:
            if len(batch) == 1:
                log.warning("event=task_event_dropped allocation=%s type=%s error=%r",
                            batch[0].allocation_id, batch[0].type, e.message)
                return
            for ev in batch:  # find the one the master refuses; deliver the others
                self._send([ev], session)

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                batch = list(self._pending)
            session = self.agent.wait_for_session(timeout=1.0)
            if session is None:
                if self._closing:
                    return
                continue
            try:
                self._send(batch, session)
            except StaleSession:
                # Our session was replaced (we or the master restarted); the control loop
                # re-registers, after which the current session differs.
                self.agent.wait_for_session(timeout=self.agent.config.poll_timeout + 5, not_equal=session)
                continue
            except (MasterUnavailable, AuthRefused) as e:
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("event=task_events_undelivered events=%d failures=%d error=%r",
                                len(batch), failures, e.message)
                with self._cond:
                    delay = backoff_delay(failures, 0.5, self.agent.retry_cap(), random.random())
                    self._cond.wait_for(lambda: self._closing, timeout=delay)
                    if self._closing:
                        return
                continue
            failures = 0
            with self._cond:
                del self._pending[: len(batch)]
                self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far has been delivered; then stop the thread."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=min(left, 0.1))
            self._closing = True
            self._cond.notify_all()
            return not self._pending


class Agent:
    def __init__(self, config: AgentConfig, token: str, slots: list[Slot], runtime: TaskRuntime, *,
                 client_factory: ClientFactory | None = None, base_env: dict[str, str] | None = None) -> None:
        self.config = config
        self.agent_id = config.agent_id
        self.slots = slots
        self._slots_by_id = {s.id: s for s in slots}
        self.runtime = runtime
        self._enrolment_token = token
        self._credentials = CredentialStore(config.work_dir, config.agent_id, config.resource_pool)
        self._credential: str | None = self._credentials.load()
        # The master's announced reconnect cap (RegisterResponse.reconnect_backoff_max_s).
        self._master_backoff_cap: float | None = None
        self._client_factory = client_factory or (
            lambda: MasterClient(config.master_url, self._auth_token, timeout=config.http_timeout))
        self._base_env = dict(os.environ if base_env is None else base_env)
        self.tasks_dir = config.task_dir or config.work_dir / "tasks"
        # The agent's work dir (its credential) and the tasks dir: traverse-only for task users.
        self._own_dirs = tuple(d for d in (config.work_dir,) if d.resolve() in self.tasks_dir.resolve().parents)
        # An admin's container_user is the docker runtime's choice of user, as before.
        docker_user = getattr(runtime, "runs_images", False) and config.container_user
        self.identities = identity.TaskIdentities("agent" if docker_user else config.task_user,
                                                  config.task_uid_base, self.tasks_dir, own=self._own_dirs,
                                                  on_host=not getattr(runtime, "runs_images", False))
        # A task user runs the agent's Python on the process runtime; under /root (pyenv, conda) it
        # cannot, and `python3` silently becomes the system's, without the environment's packages.
        self._python_blocked = (identity.unreachable_interpreter(sys.executable, sys.prefix)
                                if self.identities.enabled else None)
        if self._python_blocked is not None:
            log.warning("event=task_python_unreachable python=%s blocked=%s", os.path.realpath(sys.executable),
                        self._python_blocked)

        self._stop = threading.Event()
        self._exit_code: int | None = None
        self._exit_message: str | None = None
        self._signal: str | None = None
        self._session_cond = threading.Condition()
        self._session_id: str | None = None
        self._poll_timeout = config.poll_timeout
        self._tasks_lock = threading.Lock()
        self._tasks: dict[str, _Task] = {}
        self._drain_logs = True  # false once the master is gone: do not wait for log delivery
        self._ever_registered = False

        self.shipper = LogShipper(HttpLogSink(self._client_factory(), self.agent_id),
                                  flush_interval=config.log_flush_interval, batch_lines=config.log_batch_lines,
                                  max_buffer_bytes=config.log_buffer_bytes,
                                  retry_cap=min(5.0, config.agent_reconnect_backoff_max))
        self.outbox = EventOutbox(self, self._client_factory())
        self._control = threading.Thread(target=self._control_main, name="control", daemon=True)
        self._watcher: interruption.InterruptionWatcher | None = None
        if config.interruption_watch != "off":
            self._watcher = interruption.InterruptionWatcher(
                config.interruption_watch, config.metadata_url, self.on_interruption,
                poll_s=config.interruption_poll_s, stop=self._stop)

    def _auth_token(self) -> str:
        """What the agent presents: its own credential once enrolled, else the enrolment token."""
        return self._credential or self._enrolment_token

    # -- session ---------------------------------------------------------------------------------

    def _set_session(self, session_id: str | None) -> None:
        with self._session_cond:
            self._session_id = session_id
            self._session_cond.notify_all()

    def wait_for_session(self, timeout: float, not_equal: str | None = None) -> str | None:
        with self._session_cond:
            self._session_cond.wait_for(
                lambda: (self._session_id is not None and self._session_id != not_equal) or self._stop.is_set(),
                timeout=timeout)
            return self._session_id if self._session_id != not_equal else None

    # -- stopping ------------------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        """Signal handler: only records the signal; the main thread acts on it (a handler must not
        take locks the interrupted code may hold)."""
        self._signal = signal.Signals(signum).name

    def request_stop(self, exit_code: int, message: str) -> None:
        if self._exit_code is None:
            self._exit_code = exit_code
            self._exit_message = message
        self._stop.set()
        with self._session_cond:
            self._session_cond.notify_all()

    # -- main ------------------------------------------------------------------------------------

    def run(self) -> int:
        log.info("event=agent_starting pool=%s master=%s slots=%d slot_type=%s version=%s",
                 self.config.resource_pool, self.config.master_url, len(self.slots),
                 self.slots[0].type if self.slots else "none", __version__)
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        if self.identities.enabled:
            for d in (*self._own_dirs, self.tasks_dir):
                identity.traverse_only(d)
        self.shipper.start()
        self.outbox.start()
        self._adopt_leftovers()  # before the first registration, which reports them running
        self._control.start()
        if self._watcher is not None:
            self._watcher.start()
        while not self._stop.is_set():
            if self._signal is not None:
                self.request_stop(EXIT_OK, f"received {self._signal}")
                break
            time.sleep(0.1)
        return self._shutdown()

    def _shutdown(self) -> int:
        code = EXIT_INTERNAL if self._exit_code is None else self._exit_code
        message = self._exit_message or "stopping"
        # A refusal after the agent had been registered (e.g. its credential was revoked or expired
        # while the master was away) leaves it as cut off as a lost connection: the hook runs too.
        # A refusal at the very first registration is a configuration mistake: one line, no hook.
        connection_lost = code == EXIT_CONNECTION_LOST or (code == EXIT_REFUSED and self._ever_registered)
        log.info("event=agent_stopping exit_code=%d reason=%r", code, message)
        if code != EXIT_OK:
            self._drain_logs = False
        with self._tasks_lock:
            live = [t for t in self._tasks.values() if t.state != "exited"]
        for t in live:
            t.request_kill(self._grace(t, None), f"killed: agent stopping ({message})")
        for t in live:
            if t.thread is not None:
                t.thread.join(t.kill_grace + 30)
        if code == EXIT_OK:
            # A clean stop: tell the master how the tasks ended and ship their last lines.
            self.outbox.flush(timeout=5.0)
            self.shipper.close(timeout=5.0)
        else:
            self.outbox.flush(timeout=0)
            self.shipper.close(timeout=0.5)
        if connection_lost and self.config.on_connection_lost:
            self._run_connection_lost_hook(self.config.on_connection_lost)
        self.runtime.close()
        log.info("event=agent_stopped exit_code=%d", code)
        if code != EXIT_OK:
            # The one line a person reads, last on stderr (which also carries the structured log).
            for handler in logging.getLogger().handlers:
                handler.flush()
            print(f"det-agent: {message}", file=sys.stderr, flush=True)
        return code

    def _run_connection_lost_hook(self, command: str) -> None:
        env = {k: v for k, v in self._base_env.items() if not k.startswith("DET_AGENT_")}
        env.update({"DET_AGENT_ID": self.agent_id, "DET_AGENT_INSTANCE_ID": self.config.instance_id or "",
                    "DET_MASTER": self.config.master_url})
        log.warning("event=on_connection_lost_running command=%r", command)
        try:
            proc = subprocess.run(command, shell=True, env=env, timeout=300, check=False,
                                  stdin=subprocess.DEVNULL)
            log.warning("event=on_connection_lost_done exit_code=%d", proc.returncode)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.error("event=on_connection_lost_failed error=%r", str(e))

    # -- interruption notices (agent/interruption.py) -------------------------------------------

    def on_interruption(self, notice: interruption.Notice) -> None:
        """The cloud announced that this instance goes (or may go): tell the master at once (it
        asks the tasks here to checkpoint and stop, and places nothing new here); after a final
        notice, a task still running at its deadline less the margin gets SIGTERM."""
        threading.Thread(target=self._report_interruption, args=(notice,), name="interruption-report",
                         daemon=True).start()
        if notice.final:
            threading.Thread(target=self._stop_at_deadline, args=(notice,), name="interruption-deadline",
                             daemon=True).start()

    def _report_interruption(self, notice: interruption.Notice) -> None:
        client = self._client_factory()
        failures = 0
        try:
            while not self._stop.is_set():
                session = self.wait_for_session(timeout=1.0)
                if session is None:
                    continue
                req = InterruptionRequest(session_id=session, cloud=notice.cloud, action=notice.action,
                                          deadline=notice.deadline, detail=notice.detail)
                try:
                    client.post_interruption(self.agent_id, req)
                except StaleSession:
                    self.wait_for_session(timeout=self.config.poll_timeout + 5, not_equal=session)
                    continue
                except (MasterUnavailable, AuthRefused) as e:
                    failures += 1
                    log.warning("event=interruption_report_failed failures=%d error=%r", failures, e.message)
                    self._stop.wait(backoff_delay(failures, 0.5, 5.0, random.random()))
                    continue
                except RequestRefused as e:
                    log.error("event=interruption_report_refused error=%r", e.message)
                    return
                log.info("event=interruption_reported action=%s", notice.action)
                return
        finally:
            client.close()

    def _stop_at_deadline(self, notice: interruption.Notice) -> None:
        margin = self.config.interruption_kill_margin_s
        at = interruption.kill_at(notice, margin)
        if at is None or self._stop.wait(max(0.0, (at - _now()).total_seconds())):
            return
        with self._tasks_lock:
            live = [t for t in self._tasks.values() if t.state != "exited" and not t.kill_requested.is_set()]
        for t in live:
            self._agent_line(t, f"interruption notice ({notice.describe()}): still running {margin:g}s before "
                                f"the deadline; sending SIGTERM", level="LOG_LEVEL_WARNING")
            log.warning("event=interruption_deadline_kill allocation=%s", t.allocation_id)
            t.request_kill(margin, f"stopped by the agent: the instance is being interrupted ({notice.describe()})")

    # -- control loop ----------------------------------------------------------------------------

    def _control_main(self) -> None:
        client = self._client_factory()
        try:
            self._control_loop(client)
        except _Fatal as f:
            self.request_stop(f.exit_code, f.message)
        except Exception as e:
            log.exception("event=control_loop_crashed")
            self.request_stop(EXIT_INTERNAL, f"internal error: {type(e).__name__}: {e}")
        finally:
            client.close()

    def _backoff_cap(self) -> float:
        cap = self.config.agent_reconnect_backoff_max
        if self._master_backoff_cap is not None:
            cap = min(cap, self._master_backoff_cap)
        return max(cap, 0.05)

    def retry_cap(self) -> float:
        """Cap of one wait between deliveries of events, logs and the model definition while the
        master does not answer: 5 s, or the reconnect cap when that is lower (tests shrink it)."""
        return min(5.0, self._backoff_cap())

    def _give_up_reason(self, failed: int, lost_since: float) -> str | None:
        """Why the agent stops trying, if an explicit limit says so (by default it never does)."""
        attempts = self.config.agent_reconnect_attempts
        if attempts is not None and failed >= attempts:
            return f"{failed} connection attempts failed"
        limit = self.config.reconnect_give_up_s
        if limit is not None and time.monotonic() - lost_since >= limit:
            return f"unreachable for {time.monotonic() - lost_since:.0f}s (reconnect_give_up_s={limit:g})"
        return None

    def _control_loop(self, client: MasterClient) -> None:
        failed = 0            # consecutive failed (re)connection attempts; reset by a good poll
        lost_since = time.monotonic()  # when the connection was lost (or first tried)
        auth_retried = False  # a poll refused for the credential re-registers once
        need_register = True
        wait_first = False    # the initial registration and a 409 re-register go at once
        while not self._stop.is_set():
            if need_register:
                if wait_first:
                    base = min(self.config.agent_reconnect_backoff, self._backoff_cap())
                    delay = backoff_delay(failed + 1, base, self._backoff_cap(), random.random())
                    log.info("event=reconnect_wait attempt=%d seconds=%.2f", failed + 1, delay)
                    if self._stop.wait(delay):
                        return
                try:
                    self._register(client)
                except MasterUnavailable as e:
                    failed += 1
                    log.warning("event=register_failed attempt=%d error=%r", failed, e.message)
                    reason = self._give_up_reason(failed, lost_since)
                    if reason is not None:
                        raise _Fatal(EXIT_CONNECTION_LOST,
                                     f"lost the master at {self.config.master_url}: {reason} "
                                     f"(last: {e.message})") from None
                    wait_first = True
                    continue
                need_register = False
            assert self._session_id is not None
            try:
                raw = client.commands(self.agent_id, self._session_id, self._poll_timeout)
            except StaleSession:
                log.info("event=session_stale")
                self._set_session(None)
                need_register, wait_first = True, False
                continue
            except MasterUnavailable as e:
                if e.retry_after_s is not None:
                    # The master answered and is shedding load (503 + Retry-After): the session is
                    # fine, so poll again after its hint instead of registering anew.
                    log.info("event=master_busy retry_after_s=%.1f", e.retry_after_s)
                    if self._stop.wait(e.retry_after_s * (1 + 0.5 * random.random())):
                        return
                    continue
                log.warning("event=connection_lost error=%r", e.message)
                self._set_session(None)
                if failed == 0:
                    lost_since = time.monotonic()
                need_register, wait_first = True, True
                continue
            except AuthRefused as e:
                if auth_retried:
                    raise _Fatal(EXIT_REFUSED, f"the master no longer accepts this agent's credential "
                                               f"({e.status}): {e.message}") from None
                # Register again: a credential the master forgot is replaced by enrolling anew.
                log.warning("event=poll_refused status=%s error=%r", e.status, e.message)
                auth_retried = True
                self._set_session(None)
                need_register, wait_first = True, False
                continue
            except RequestRefused as e:
                raise _Fatal(EXIT_REFUSED, f"the master refused the command poll: {e.message}") from None
            failed = 0
            auth_retried = False
            for item in raw:
                if self._stop.is_set():
                    return
                self._dispatch(item)

    def _register(self, client: MasterClient) -> None:
        with self._tasks_lock:
            # A task whose exit the master has not heard yet (it ended while the master was away)
            # is still this agent's to report: listed, the master keeps its allocation until the
            # exit event that follows this registration, which carries the exit code (a failure
            # then counts in the trial's restarts). Unlisted, it would end as "agent restarted
            # without it", an infrastructure cause that counts nowhere.
            running = sorted(a for a, t in self._tasks.items()
                             if t.state != "exited" or self.outbox.has_pending(a, "exited"))
        req = RegisterRequest(agent_id=self.agent_id, resource_pool=self.config.resource_pool, version=__version__,
                              slots=[s.info() for s in self.slots], running_allocations=running,
                              addresses=outbound_addresses(self.config.master_url),
                              instance_id=self.config.instance_id)
        try:
            resp = None
            if self._credential is not None:
                try:
                    resp = client.register(req, token=self._credential)
                except AuthRefused as e:
                    if e.status != 401:
                        raise
                    # Unknown or revoked: an admin reset the enrolment, or this is a new database.
                    log.warning("event=credential_refused action=enrol_again error=%r", e.message)
                    self._credential = None
            if resp is None:
                resp = client.register(req, token=self._enrolment_token)
        except AuthRefused as e:
            raise _Fatal(EXIT_REFUSED, f"the master refused this agent ({e.status}): {e.message} — check the "
                                       f"agent token and the resource pool ({self.config.resource_pool!r})") from None
        except RequestRefused as e:
            raise _Fatal(EXIT_REFUSED, f"the master refused the registration: {e.message}") from None
        if resp.agent_credential:
            self._credential = resp.agent_credential
            try:
                self._credentials.save(resp.agent_credential, resp.cluster_id)
            except OSError as e:
                # Usable until the agent restarts; after that the master refuses its enrolment token.
                log.error("event=credential_not_saved path=%s error=%r", self._credentials.path, e.strerror)
            else:
                log.info("event=enrolled path=%s", self._credentials.path)
        if resp.reconnect_backoff_max_s:
            self._master_backoff_cap = resp.reconnect_backoff_max_s
        if resp.heartbeat_interval_s:
            self._poll_timeout = max(1.0, min(self.config.poll_timeout, resp.heartbeat_interval_s))
        log.info("event=registered pool=%s running=%d kill=%d", self.config.resource_pool, len(running), len(resp.kill))
        self._ever_registered = True
        self._set_session(resp.session_id)
        for alloc in resp.kill:
            self._kill(alloc, None, "killed: the master no longer wants it after the agent reconnected")

    # -- commands --------------------------------------------------------------------------------

    def _dispatch(self, raw: dict[str, Any]) -> None:
        try:
            cmd = parse_command(raw)
        except ValueError as e:
            alloc = raw.get("allocationId")
            log.warning("event=bad_command allocation=%s error=%r", alloc, str(e))
            if raw.get("type") == "start" and isinstance(alloc, str) and alloc:
                self._refuse_start(alloc, f"invalid start command: {e}")
            return
        if isinstance(cmd, StartCommand):
            self._start(cmd)
        elif isinstance(cmd, KillCommand):
            self._kill(cmd.allocation_id, cmd.grace_seconds, "killed at the master's request")

    def _refuse_start(self, allocation_id: str, message: str) -> None:
        with self._tasks_lock:
            if allocation_id in self._tasks:
                return
            task = _Task(allocation_id=allocation_id, spec=None, state="exited")
            self._tasks[allocation_id] = task
        self._exited(task, SETUP_FAILED, message)

    def _start(self, cmd: StartCommand) -> None:
        alloc = cmd.allocation_id
        with self._tasks_lock:
            if self._stop.is_set():
                return  # shutting down: the task would be killed at once; the master will reschedule
            if alloc in self._tasks:
                log.debug("event=duplicate_start_ignored allocation=%s", alloc)
                return
            task = _Task(allocation_id=alloc, spec=cmd.spec)
            self._tasks[alloc] = task
            log.info("event=task_start allocation=%s task=%s trial=%s slots=%s", alloc,
                     cmd.spec.task_id, cmd.spec.trial_id, ",".join(cmd.spec.slot_ids))
            task.thread = threading.Thread(target=self._supervise, args=(task,), name=f"task-{alloc}", daemon=True)
            task.thread.start()  # under the lock, so shutdown never sees a task with an unstarted thread

    def _grace(self, task: _Task, grace: float | None) -> float:
        if grace is not None:
            return grace
        if task.spec is not None and task.spec.kill_grace_seconds is not None:
            return task.spec.kill_grace_seconds
        return self.config.default_kill_grace

    def _kill(self, alloc: str, grace: float | None, reason: str) -> None:
        with self._tasks_lock:
            task = self._tasks.get(alloc)
            if task is None:
                # Not ours (e.g. started before this agent restarted): report it gone, or the
                # master would repeat the kill forever.
                task = _Task(allocation_id=alloc, spec=None, state="exited")
                self._tasks[alloc] = task
                unknown = True
            else:
                unknown = False
        if unknown:
            log.info("event=kill_unknown_allocation allocation=%s", alloc)
            self._exited(task, None, "allocation is not running on this agent")
            return
        if task.state == "exited":
            if task.exit_event is not None and not self.outbox.has_pending(alloc, "exited"):
                self.outbox.add(task.exit_event)
            return
        if not task.kill_requested.is_set():
            log.info("event=task_kill allocation=%s grace=%s", alloc, self._grace(task, grace))
        task.request_kill(self._grace(task, grace), reason)

    # -- one task ----------------------------------------------------------------------------------

    def _event(self, task: _Task, kind: TaskEventType, *, pid: int | None = None,
               exit_code: int | None = None, message: str | None = None) -> TaskEvent:
        if message is not None and len(message) > MAX_EVENT_MESSAGE:
            message = message[: MAX_EVENT_MESSAGE - 3] + "..."
        ev = TaskEvent(allocation_id=task.allocation_id, type=kind, time=_now(), pid=pid, exit_code=exit_code,
                       message=message)
        self.outbox.add(ev)
        return ev

    def _exited(self, task: _Task, exit_code: int | None, message: str | None) -> None:
        task.state = "exited"
        task.exit_event = self._event(task, "exited", exit_code=exit_code, message=message)
        log.info("event=task_exited allocation=%s exit_code=%s message=%r", task.allocation_id, exit_code, message)

    def _agent_line(self, task: _Task, text: str, level: str = "LOG_LEVEL_ERROR") -> None:
        spec = task.spec
        self.shipper.add(LogLine(allocation_id=task.allocation_id, task_id=spec.task_id if spec else "",
                                 token=spec.token if spec else None, text=f"[shipyard-agent] {text}\n",
                                 stdtype="stderr", source="agent", level=level))

    def _task_dir(self, alloc: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", alloc)[:100] or "task"
        return self.tasks_dir / f"{safe}-{secrets.token_hex(4)}"

    def _fetch_model_definition(self, task: _Task, dest: Path) -> None:
        from shipyard_common.model_def import ModelDefInvalid, unpack_model_definition

        spec = task.spec
        assert spec is not None and spec.model_definition_path
        # The master may be away (restarting): keep asking while the task is wanted and the agent
        # runs, unless model_def_fetch_attempts bounds it.
        attempts = self.config.model_def_fetch_attempts
        stop = stop_when_event_set(task.kill_requested) | stop_when_event_set(self._stop)
        stop = stop | (stop_after_attempt(attempts) if attempts is not None else stop_never)
        client = self._client_factory()
        try:
            retrying = Retrying(stop=stop, wait=wait_random_exponential(multiplier=0.5, max=self.retry_cap()),
                                retry=retry_if_exception_type(MasterUnavailable), reraise=True,
                                sleep=lambda s: task.kill_requested.wait(s))
            archive = retrying(client.fetch_model_definition, spec.model_definition_path, spec.token)
        finally:
            client.close()
        try:
            unpack_model_definition(archive, dest, max_bytes=self.config.model_def_max_bytes)
        except ModelDefInvalid as e:
            raise _SetupError(f"model definition refused: {e}") from None

    def _supervise(self, task: _Task) -> None:
        alloc = task.allocation_id
        spec = task.spec
        assert spec is not None
        workdir: Path | None = None
        try:
            self._event(task, "starting")
            try:
                slots = [self._slots_by_id[s] for s in spec.slot_ids]
            except KeyError as e:
                raise _SetupError(f"slot {e.args[0]!r} is not a slot of agent {self.agent_id}") from None
            workdir = self._task_dir(alloc)
            workdir.mkdir(mode=0o700)
            if spec.model_definition_path:
                try:
                    self._fetch_model_definition(task, workdir)
                except (MasterUnavailable, AuthRefused, RequestRefused) as e:
                    if not task.kill_requested.is_set():  # killed while waiting: reported below
                        raise _SetupError(f"could not fetch the model definition: {e.message}") from None
            if task.kill_requested.is_set():
                self._exited(task, None, f"{task.kill_reason} before the process started")
                return
            container = self._container_launch(spec, slots)
            base = (task_environment(self._base_env, spec, slots, self.agent_id) if container is None
                    else container_environment(spec, slots, self.agent_id))
            env = determined_env.prepare(base, workdir)
            run_as = self._give_to_task_user(spec, workdir, env)
            if run_as is not None and container is None:
                self._warn_unreachable_python(task, run_as)
            try:
                handle = self.runtime.start(LaunchSpec(
                    allocation_id=alloc, argv=spec.argv, env=env, workdir=workdir, output=self._output_fn(task),
                    image=container.image if container else None, container=container, run_as=run_as))
            except StartFailed as e:
                self._agent_line(task, e.message)
                self._drain(alloc)
                self._exited(task, e.exit_code, e.message)
                return
            task.handle = handle
            task.state = "running"
            self._event(task, "running", pid=handle.pid)
            self._run_to_end(task, handle)
        except _SetupError as e:
            self._agent_line(task, e.message)
            self._drain(alloc)
            self._exited(task, SETUP_FAILED, e.message)
        except Exception as e:
            log.exception("event=task_supervisor_crashed allocation=%s", alloc)
            if task.handle is not None and self.runtime.wait(task.handle, 0) is None:
                with contextlib.suppress(Exception):
                    stop_task(self.runtime, task.handle, 0)
            if task.state != "exited":
                self._exited(task, SETUP_FAILED, f"agent error: {type(e).__name__}: {e}")
        finally:
            if workdir is not None and not self.config.keep_task_dirs:
                shutil.rmtree(workdir, ignore_errors=True)
            if task.state == "exited":
                # The record stays (so repeated commands stay idempotent) but small: a spec carries
                # the whole experiment config.
                task.spec = None
                task.handle = None

    def _warn_unreachable_python(self, task: _Task, run_as: RunAs) -> None:
        """Say in the task's own log, before any `No module named ...`, why its `python3` is not
        the agent's (unless the experiment chose its PATH itself)."""
        if self._python_blocked is None or task.spec is None or "PATH" in task.spec.env:
            return
        self._agent_line(task, (
            f"this agent's Python ({os.path.realpath(sys.executable)}) cannot be run by the task's user "
            f"(uid {run_as.uid}): {self._python_blocked} is not traversable by other users, so `python3` is "
            f"the first one on PATH that uid {run_as.uid} can run, without the agent's packages. Install the "
            f"agent with a Python outside {self._python_blocked} (e.g. under /opt or /usr/local), or set PATH in "
            f"environment.environment_variables to an environment task users can read"), level="LOG_LEVEL_WARNING")

    def _give_to_task_user(self, spec: TaskSpec, workdir: Path, env: dict[str, str]) -> RunAs | None:
        """The task's OS identity (identity.py); its directory handed to it, its checkpoint
        directory made if missing, HOME its directory (the agent's HOME is not its to write)."""
        run_as = self.identities.run_as(spec.user_id)
        if run_as is None:
            return None
        try:
            identity.give_tree(workdir, run_as)
            c = spec.container
            if c is not None and c.checkpoint_path:
                identity.shared_checkpoint_dir(c.checkpoint_path, (c.storage_root, str(self.config.work_dir)))
        except OSError as e:
            raise _SetupError(f"cannot prepare the task for uid {run_as.uid}: {e}") from None
        self._tensorboard_dirs(spec, env, run_as)
        if "HOME" not in spec.env:
            env["HOME"] = str(workdir)
        return run_as

    def _tensorboard_dirs(self, spec: TaskSpec, env: dict[str, str], run_as: RunAs) -> None:
        """A trial's TensorBoard directories in shared_fs storage, made by the agent for its user; a
        TensorBoard task's sources told which uid owns each (agent/tensorboard_dirs.py). A failure
        costs the trial its TensorBoard files, not its run: logged."""
        c = spec.container
        if tensorboard_dirs.SOURCES_ENV in env:
            env[tensorboard_dirs.SOURCES_ENV] = tensorboard_dirs.with_owner_uids(
                env[tensorboard_dirs.SOURCES_ENV], self.identities.run_as)
        if c is None or not c.checkpoint_path or "DET_TRIAL_ID" not in env:
            return
        try:
            tensorboard_dirs.prepare(c.checkpoint_path, env.get("DET_CLUSTER_ID", ""),
                                     env.get("DET_EXPERIMENT_ID", ""), env["DET_TRIAL_ID"], run_as)
        except (OSError, ValueError) as e:
            log.warning("event=tensorboard_dirs_failed allocation=%s error=%r", spec.allocation_id, str(e))

    def _run_to_end(self, task: _Task, handle: TaskHandle) -> None:
        """Wait for the task (killing it when asked), clean it up and report how it ended."""
        code = self._wait_or_kill(task, handle)
        message = None
        if task.kill_requested.is_set():
            message = task.kill_reason
        elif code != 0:
            sig = _signal_name(code)
            explain = getattr(self.runtime, "exit_reason", None)
            message = (explain(handle) if explain else None) or (
                f"exited with code {code}" + (f" (killed by {sig})" if sig else ""))
        self.runtime.release(handle)
        self._drain(task.allocation_id)
        self._exited(task, code, message)

    def _container_launch(self, spec: TaskSpec, slots: list[Slot]) -> ContainerLaunch | None:
        """The container to run the task in, or None to run it as a process. An image asked for on an
        agent that runs processes is refused with the reason (rather than run outside its image)."""
        c = spec.container or ContainerSpec()
        if not getattr(self.runtime, "runs_images", False):
            if c.image:
                raise _SetupError(
                    f"the experiment asks for image {c.image!r} (environment.image) but agent {self.agent_id} runs "
                    f"tasks as processes (runtime: {self.runtime.name}); run it in a pool whose agents have "
                    f"runtime: docker, or remove environment.image")
            return None
        gpus = tuple(s.uuid or str(s.index) for s in slots if s.type == "cuda")
        slot_type = "cuda" if gpus else "cpu"
        image = c.image or (self.config.container_image_cuda if gpus else self.config.container_image_cpu)
        if not image:
            raise _SetupError(f"no container image for {slot_type} slots: the experiment sets no environment.image "
                              f"and agent {self.agent_id} has no container_image_{slot_type}")
        mounts = [Mount(m.host_path, m.container_path, m.read_only, m.optional) for m in c.mounts]
        for entry in self.config.container_mounts:
            host, _, inside = entry.partition(":")
            mounts.append(Mount(host, inside or host, read_only=True))
        # Determined's `determined.core` finds its info files through this shim (determined_env.py).
        shim = str(determined_env.SHIM_DIR)
        mounts.append(Mount(shim, shim, read_only=True))
        return ContainerLaunch(image=image, task_id=spec.task_id, force_pull=c.force_pull,
                               registry_auth=c.registry_auth, shm_size_bytes=c.shm_size_bytes,
                               memory_bytes=c.memory_bytes, mounts=tuple(mounts), gpus=gpus,
                               storage_root=c.storage_root, cap_add=tuple(c.cap_add), cap_drop=tuple(c.cap_drop),
                               devices=tuple(f"{d.host_path}:{d.container_path}:{d.mode}" for d in c.devices))

    def _adopt_leftovers(self) -> None:
        """Reattach to the tasks a previous agent left running (containers): they are reported at
        registration; the master keeps those it still wants and lists the others in `kill`."""
        for left in getattr(self.runtime, "leftovers", list)():
            alloc = left.handle.allocation_id
            spec = TaskSpec(allocation_id=alloc, task_id=left.task_id, entrypoint=[], token=left.token)
            task = _Task(allocation_id=alloc, spec=spec, state="running", handle=left.handle)
            with self._tasks_lock:
                if alloc in self._tasks:
                    continue
                self._tasks[alloc] = task
            self.runtime.resume(left.handle, self._output_fn(task))
            log.info("event=task_reattached allocation=%s task=%s", alloc, left.handle.id)
            task.thread = threading.Thread(target=self._supervise_leftover, args=(task, left),
                                           name=f"task-{alloc}", daemon=True)
            task.thread.start()

    def _supervise_leftover(self, task: _Task, left: LeftoverTask) -> None:
        try:
            self._run_to_end(task, left.handle)
        except Exception as e:
            log.exception("event=task_supervisor_crashed allocation=%s", task.allocation_id)
            if task.state != "exited":
                self._exited(task, SETUP_FAILED, f"agent error: {type(e).__name__}: {e}")
        finally:
            # The directory a leftover names came from its container's labels: removed only when
            # it is one of this agent's task directories.
            if (left.workdir is not None and not self.config.keep_task_dirs
                    and left.workdir.resolve().is_relative_to(self.tasks_dir.resolve())):
                shutil.rmtree(left.workdir, ignore_errors=True)
            if task.state == "exited":
                task.spec = None
                task.handle = None

    def _wait_or_kill(self, task: _Task, handle: TaskHandle) -> int:
        while True:
            code = self.runtime.wait(handle, timeout=0.2)
            if code is not None:
                return code
            if task.kill_requested.is_set():
                return stop_task(self.runtime, handle, task.kill_grace)

    def _drain(self, alloc: str) -> None:
        """Ship the task's last lines before reporting it exited: the master may revoke the
        allocation token when it learns the allocation ended."""
        if self._drain_logs and not self.shipper.drain(alloc, timeout=10.0):
            log.warning("event=task_logs_not_drained allocation=%s", alloc)

    def _output_fn(self, task: _Task) -> OutputFn:
        spec = task.spec
        assert spec is not None

        def output(stream: Stream, text: str) -> None:
            self.shipper.add(LogLine(allocation_id=task.allocation_id, task_id=spec.task_id, token=spec.token,
                                     text=text, stdtype=stream))

        return output


class _SetupError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
