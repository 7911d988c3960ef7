"""The task runtime seam: how the agent runs a task, whatever a task is made of.

A runtime is `start(spec) -> handle`, `signal(handle, sig)`, `wait(handle, timeout) -> exit status
or None`, `release(handle)`, plus `clean_up_leftovers()` for the agent's restart and `close()`. The
handle is opaque: the daemon keeps it and hands it back, and never reads the runtime's data in it.
Exit statuses follow the shell and container convention: 0..127 from the task, 128+N when signal N
ended it, 125..127 when the task could not be set up or its entrypoint not run.

Runtimes are registered by name (`register_runtime`); the agent picks one with `create_runtime`.
`process` (runtime/process.py) runs a task as a process group on the host. A container runtime (for
`environment.image`) is one more module that registers itself, with no change to the daemon.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

log = logging.getLogger("shipyard.agent.runtime")

Stream = Literal["stdout", "stderr"]
OutputFn = Callable[[Stream, str], None]


class StartFailed(Exception):
    """The task could not be started; `exit_code` follows the shell (127 not found, 126 not
    executable, 125 the runtime failed) so the master sees the code a shell would have given."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


@dataclass(frozen=True)
class LaunchSpec:
    """What to run for one allocation. `output` receives the task's output line by line, from
    threads of the runtime; it must not block for long."""

    allocation_id: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)  # holds the allocation's session token
    workdir: Path
    output: OutputFn = field(repr=False)
    # A container image, for runtimes that run one; the process runtime refuses a spec with one.
    image: str | None = None


@dataclass(frozen=True, eq=False)
class TaskHandle:
    """A started task. `id` names it within its runtime (a pid, a container id); `pid` is the host
    pid of its main process when the runtime knows one (reported to the master, for people);
    `data` belongs to the runtime alone."""

    id: str
    allocation_id: str
    runtime: str
    pid: int | None = None
    data: Any = field(default=None, repr=False)


class TaskRuntime(Protocol):
    name: str

    def start(self, spec: LaunchSpec) -> TaskHandle:
        """Start the task; raises StartFailed when it cannot be started."""
        ...

    def signal(self, handle: TaskHandle, sig: int) -> None:
        """Deliver `sig` to the whole task (all its processes); a task that is gone is not an error."""
        ...

    def wait(self, handle: TaskHandle, timeout: float | None = None) -> int | None:
        """The task's exit status once it has ended, None if it has not within `timeout` seconds
        (0: just look; None: wait as long as it takes). After SIGTERM/SIGINT the task has ended only
        when all of its processes have, so the grace of `stop_task` covers all of them."""
        ...

    def release(self, handle: TaskHandle) -> None:
        """After the task ended: remove whatever is left of it (stray processes, a container) and
        its bookkeeping. Idempotent."""
        ...

    def clean_up_leftovers(self) -> int:
        """At agent start, before registering: end what a previous agent on this host left running
        (it was not reported, so the master has already written it off). Returns how many were ended."""
        ...

    def close(self) -> None:
        """Stop the runtime's own threads; call after the tasks were stopped."""
        ...


def stop_task(runtime: TaskRuntime, handle: TaskHandle, grace: float) -> int:
    """SIGTERM, then SIGKILL once `grace` seconds have passed without the task ending. Returns its
    exit status (143 if it ended on the SIGTERM, 137 if it had to be killed)."""
    runtime.signal(handle, signal.SIGTERM)
    log.info("event=task_sigterm allocation=%s task=%s grace=%s", handle.allocation_id, handle.id, grace)
    code = runtime.wait(handle, grace)
    if code is None:
        log.info("event=task_sigkill allocation=%s task=%s", handle.allocation_id, handle.id)
        runtime.signal(handle, signal.SIGKILL)
        code = runtime.wait(handle)
        assert code is not None, "wait() without a timeout returned no exit status"
    return code


@dataclass(frozen=True)
class RuntimeOptions:
    """What every runtime may be built from: the agent's work directory (for its bookkeeping)."""

    work_dir: Path


RuntimeFactory = Callable[[RuntimeOptions], TaskRuntime]
_RUNTIMES: dict[str, RuntimeFactory] = {}


class UnknownRuntime(ValueError):
    pass


def register_runtime(name: str, factory: RuntimeFactory) -> None:
    if name in _RUNTIMES and _RUNTIMES[name] is not factory:
        raise ValueError(f"a task runtime named {name!r} is already registered")
    _RUNTIMES[name] = factory


def runtime_names() -> list[str]:
    return sorted(_RUNTIMES)


def create_runtime(name: str, options: RuntimeOptions) -> TaskRuntime:
    factory = _RUNTIMES.get(name)
    if factory is None:
        raise UnknownRuntime(f"runtime: no task runtime named {name!r} (known: {', '.join(runtime_names())})")
    return factory(options)
