"""ProcessRuntime: the `process` task runtime (runtime/base.py), a task as a process group on the host.

A task is one process group. ProcessRuntime starts the entrypoint in a new session (so the task is its
own process group and a signal to the group reaches its children) with stdin from /dev/null and its
stdout/stderr drained continuously by two reader threads into an output callback (never blocking the
child on a full pipe).

No orphans — what is chosen and why:
  * stop_task(grace): SIGTERM to the whole group, then SIGKILL to the group once the grace is over;
    after a SIGTERM, wait() reports the end only when the leader has exited *and* the group is
    empty, so grandchildren get the same grace and are gone afterwards.
  * when the leader exits on its own, release() SIGKILLs whatever is left in its group, like a
    container whose main process ends.
  * every task process carries a random marker in its environment (SHIPYARD_TASK_NONCE); release()
    also kills processes carrying it that left the group (setsid daemons).
  * agent SIGKILLed: the direct child has PR_SET_PDEATHSIG=SIGKILL (Linux, set through ctypes in
    preexec_fn) and dies with the agent. pdeathsig fires when the *thread* that forked the child
    ends, not the process, so every child is forked by one long-lived spawner thread that lives as
    long as the runtime. Grandchildren are not covered by pdeathsig; for them the markers of live
    tasks are recorded in a pidfile in the work dir (`tasks.pids`, with the kernel boot id) and the
    next agent start (clean_up_leftovers) kills every process still carrying one of those markers
    before it registers.
    A marker is recorded before the fork, so a crash between fork and bookkeeping leaves no hole;
    markers are random, so a reused pid is never killed by mistake.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_bootstrap.agent.logship import LineAssembler
from agent_bootstrap.agent.runtime.base import (
    LaunchSpec,
    LeftoverTask,
    OutputFn,
    RuntimeOptions,
    StartFailed,
    Stream,
    TaskHandle,
    register_runtime,
)
from shipyard_common.processes import group_alive, signal_group

log = logging.getLogger("shipyard.agent.runtime")

MARKER_ENV = "SHIPYARD_TASK_NONCE"
IS_LINUX = sys.platform.startswith("linux")
NAME = "process"

# Signals after which the task is ending: wait() then also waits for the rest of the group.
_TERMINATING = frozenset({int(signal.SIGTERM), int(signal.SIGINT)})


@dataclass(eq=False)
class _Task:
    """The runtime's data in a TaskHandle."""

    pgid: int
    nonce: str
    proc: subprocess.Popen[bytes] = field(repr=False)
    readers: list[threading.Thread] = field(default_factory=list, repr=False)
    terminating: bool = False
    released: bool = False


def exit_code_of(returncode: int) -> int:
    """Popen's -N (killed by signal N) as the shell and containers report it: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


# ---------------------------------------------------------------------------------------------
# Linux process plumbing


def _load_prctl() -> Callable[..., int] | None:
    if not IS_LINUX:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once in the parent: the child between fork and exec must do as little as possible.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_SIGKILL = int(signal.SIGKILL)


def _child_setup(parent_pid: int) -> None:  # runs in the forked child, before exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        # No setuid binary gives the task back what it was dropped from (LaunchSpec.run_as).
        _PRCTL(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # The agent may have died between fork and prctl; then no signal will ever come.
    if os.getppid() != parent_pid:
        os._exit(125)


def processes_with_marker(nonce: str) -> list[int]:
    """Pids (other than ours) whose environment carries SHIPYARD_TASK_NONCE=<nonce>."""
    if not IS_LINUX:
        return []
    needle = f"\0{MARKER_ENV}={nonce}\0".encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                data = f.read()
        except OSError:  # gone, or another user's process
            continue
        if needle in b"\0" + data + b"\0":
            found.append(int(name))
    return found


def kill_marked(nonce: str, rounds: int = 5) -> int:
    """SIGKILL every process carrying the marker; a few rounds, as one may fork while we scan."""
    killed = 0
    for _ in range(rounds):
        pids = processes_with_marker(nonce)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.02)
    return killed


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class TaskPidfile:
    """`tasks.pids` in the work dir: the markers (and pids) of the tasks this agent has running, so
    that the next agent on this host can kill what a SIGKILLed agent left behind. This is cleanup of
    the agent's own leftovers, not state: nothing in it is reported to the master."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._tasks: dict[str, dict[str, Any]] = {}
        self._boot = boot_id()

    def _write_locked(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        data = json.dumps({"bootId": self._boot, "agentPid": os.getpid(), "tasks": self._tasks}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the agent's, not its tasks'
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path)

    def add(self, allocation_id: str, nonce: str) -> None:
        with self._lock:
            self._tasks[allocation_id] = {"nonce": nonce, "pid": None}
            self._write_locked()

    def set_pid(self, allocation_id: str, pid: int) -> None:
        with self._lock:
            if allocation_id in self._tasks:
                self._tasks[allocation_id]["pid"] = pid
                self._write_locked()

    def remove(self, allocation_id: str) -> None:
        with self._lock:
            if self._tasks.pop(allocation_id, None) is not None:
                self._write_locked()

    def kill_leftovers(self) -> int:
        """Kill processes of tasks recorded by a previous agent (same boot only); reset the file."""
        killed = 0
        try:
            previous = json.loads(self.path.read_text())
        except FileNotFoundError:
            previous = None
        except (OSError, ValueError) as e:
            log.warning("event=pidfile_unreadable path=%s error=%r", self.path, str(e))
            previous = None
        if isinstance(previous, dict) and previous.get("bootId") == self._boot:
            for alloc, entry in (previous.get("tasks") or {}).items():
                nonce = entry.get("nonce") if isinstance(entry, dict) else None
                if isinstance(nonce, str) and nonce:
                    n = kill_marked(nonce)
                    if n:
                        log.warning("event=leftover_task_killed allocation=%s processes=%d", alloc, n)
                    killed += n
        with self._lock:
            self._tasks = {}
            self._write_locked()
        return killed


# ---------------------------------------------------------------------------------------------
# The runtime


class _Spawner:
    """One long-lived thread that forks every task (see the module docstring: pdeathsig follows the
    forking thread)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="task-spawner", daemon=True)
        self._thread.start()
        self.closed = False

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller as is
                fut.set_exception(e)

    def call(self, fn: Callable[[], Any]) -> Any:
        if self.closed:
            raise RuntimeError("the task runtime is closed")
        fut: Future[Any] = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def close(self) -> None:
        self.closed = True
        self._queue.put(None)
        self._thread.join(5)


def _pump(stream: Stream, pipe: Any, output: OutputFn, allocation_id: str) -> None:
    assembler = LineAssembler()
    fd = pipe.fileno()

    def deliver(lines: list[str]) -> None:
        for line in lines:
            try:
                output(stream, line)
            except Exception:  # a broken sink must not stop the draining, or the child blocks
                log.exception("event=output_callback_failed allocation=%s", allocation_id)

    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EBADF:
                    break
                raise
            if not data:
                break
            deliver(assembler.feed(data))
        deliver(assembler.finish())
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def _task(handle: TaskHandle) -> _Task:
    if handle.runtime != NAME or not isinstance(handle.data, _Task):
        raise ValueError(f"handle {handle.id} of allocation {handle.allocation_id} is not a process task")
    return handle.data


class ProcessRuntime:
    name = NAME
    runs_images = False

    def __init__(self, pidfile: TaskPidfile | None = None, poll_interval: float = 0.05) -> None:
        self.pidfile = pidfile
        self.poll_interval = poll_interval
        self._spawner = _Spawner()

    def start(self, spec: LaunchSpec) -> TaskHandle:
        argv = list(spec.argv)
        if spec.image:
            raise StartFailed(125, f"the process runtime cannot run image {spec.image!r}")
        if not argv or not argv[0]:
            raise StartFailed(127, "entrypoint is empty")
        nonce = secrets.token_hex(16)
        child_env = dict(spec.env)
        child_env[MARKER_ENV] = nonce
        if self.pidfile is not None:
            self.pidfile.add(spec.allocation_id, nonce)
        parent = os.getpid()
        workdir = spec.workdir
        # Dropped in the child between fork and exec (Popen: setgroups([]), setgid, setuid, in that
        # order), so nothing of the task ever runs as the agent's user.
        identity: dict[str, Any] = {}
        if spec.run_as is not None:
            identity = {"user": spec.run_as.uid, "group": spec.run_as.gid, "extra_groups": []}

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv, cwd=str(workdir), env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                preexec_fn=(lambda: _child_setup(parent)) if IS_LINUX else None, **identity,
            )

        try:
            proc: subprocess.Popen[bytes] = self._spawner.call(spawn)
        except BaseException as e:
            if self.pidfile is not None:
                self.pidfile.remove(spec.allocation_id)
            if isinstance(e, FileNotFoundError):
                if e.filename and str(e.filename) == str(workdir):
                    raise StartFailed(125, f"task directory {workdir} does not exist") from None
                raise StartFailed(127, f"entrypoint not found: {argv[0]!r} (no such file or command)") from None
            if isinstance(e, PermissionError):
                raise StartFailed(126, f"entrypoint is not executable: {argv[0]!r} (permission denied)") from None
            if isinstance(e, OSError):
                raise StartFailed(126, f"entrypoint cannot be executed: {argv[0]!r}: {e.strerror or e}") from None
            raise
        if self.pidfile is not None:
            self.pidfile.set_pid(spec.allocation_id, proc.pid)
        task = _Task(pgid=proc.pid, nonce=nonce, proc=proc)
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            t = threading.Thread(target=_pump, args=(stream, pipe, spec.output, spec.allocation_id),
                                 name=f"task-{stream}-{spec.allocation_id}", daemon=True)
            t.start()
            task.readers.append(t)
        log.info("event=task_process_started allocation=%s pid=%d argv0=%r uid=%s", spec.allocation_id, proc.pid,
                 argv[0], spec.run_as.uid if spec.run_as else os.getuid())
        return TaskHandle(id=str(proc.pid), allocation_id=spec.allocation_id, runtime=NAME, pid=proc.pid, data=task)

    def signal(self, handle: TaskHandle, sig: int) -> None:
        """Signal the task's whole process group."""
        task = _task(handle)
        if task.released:
            return  # the group id may have been reused since
        if int(sig) in _TERMINATING:
            task.terminating = True
        elif int(sig) == int(signal.SIGKILL):
            task.terminating = False  # nothing in the group can outlive SIGKILL: wait for the leader only
        signal_group(task.pgid, sig)

    def wait(self, handle: TaskHandle, timeout: float | None = None) -> int | None:
        task = _task(handle)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not task.terminating:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return exit_code_of(task.proc.wait(timeout=remaining))
                except subprocess.TimeoutExpired:
                    return None
            rc = task.proc.poll()
            if rc is not None and not group_alive(task.pgid):
                return exit_code_of(rc)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_interval)

    def release(self, handle: TaskHandle, output_timeout: float = 5.0) -> None:
        """After the leader has exited: kill what is left of the task (its group, and processes that
        left the group but carry its marker), let the readers finish, forget the pidfile entry."""
        task = _task(handle)
        if task.released:
            return
        if task.proc.poll() is None:
            raise RuntimeError("release() before the task's process exited")
        signal_group(task.pgid, signal.SIGKILL)
        task.released = True
        kill_marked(task.nonce)
        for t in task.readers:
            t.join(output_timeout)
            if t.is_alive():
                log.warning("event=task_output_still_open allocation=%s thread=%s", handle.allocation_id, t.name)
        if self.pidfile is not None:
            self.pidfile.remove(handle.allocation_id)

    def clean_up_leftovers(self) -> int:
        """Kill what the tasks of a previous agent with this pidfile left behind."""
        return self.pidfile.kill_leftovers() if self.pidfile is not None else 0

    def exit_reason(self, handle: TaskHandle) -> str | None:
        return None

    def leftovers(self) -> list[LeftoverTask]:
        return []  # a process dies with its agent (pdeathsig) or is killed by clean_up_leftovers

    def resume(self, handle: TaskHandle, output: OutputFn) -> None:
        raise ValueError("the process runtime leaves no task to reattach to")

    def close(self) -> None:
        """Stop the spawner thread. Children still running get their pdeathsig when it ends, so call
        this only after the tasks were stopped."""
        self._spawner.close()


def _create(options: RuntimeOptions) -> ProcessRuntime:
    return ProcessRuntime(TaskPidfile(options.work_dir / "tasks.pids"))


register_runtime(NAME, _create)
