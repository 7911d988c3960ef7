"""The task runtime seam: how the agent runs a task, whatever a task is made of.

A runtime is `start(spec) -> handle`, `signal(handle, sig)`, `wait(handle, timeout) -> exit status
or None`, `release(handle)`, plus `clean_up_leftovers()` for the agent's restart and `close()`. The
handle is opaque: the daemon keeps it and hands it back, and never reads the runtime's data in it.
Exit statuses follow the shell and container convention: 0..127 from the task, 128+N when signal N
ended it, 125..127 when the task could not be set up or its entrypoint not run.

Runtimes are registered by name (`register_runtime`); the agent picks one with `create_runtime`.
`process` (runtime/process.py) runs a task as a process group on the host; `docker`
(runtime/docker.py) runs it in a container from `environment.image` (LaunchSpec.container), and
reattaches to its containers after an agent restart (`leftovers`, `resume`).
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
class Mount:
    """A host path bound into a container."""

    host_path: str
    container_path: str
    read_only: bool = False
    optional: bool = False  # left out when host_path is missing


@dataclass(frozen=True)
class ContainerLaunch:
    """What a runtime that runs images needs beyond the command: chosen by the daemon from the task
    spec (environment.image & co.) and the agent's config."""

    image: str
    task_id: str = ""
    force_pull: bool = False
    registry_auth: dict[str, str] | None = field(default=None, repr=False)
    shm_size_bytes: int | None = None
    memory_bytes: int | None = None
    mounts: tuple[Mount, ...] = ()
    # The GPUs of the allocation's slots (uuids, or indexes), passed as a device request; none for CPU slots.
    gpus: tuple[str, ...] = ()
    # The cluster's checkpoint storage root (ContainerSpec.storage_root): a missing writable mount
    # source is made only below it or the agent's work dir (agent/host_paths.py).
    storage_root: str | None = None
    # Capabilities added to and dropped from the container's (Docker's names), and host devices
    # (Docker's host:container:mode), from the config (the master's allow_task_host_access).
    cap_add: tuple[str, ...] = ()
    cap_drop: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunAs:
    """The OS user and group a task runs as (agent/identity.py), without supplementary groups."""

    uid: int
    gid: int


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
    container: ContainerLaunch | None = None
    # Who the task runs as; None: as the agent's own user (an agent that cannot switch users).
    run_as: RunAs | None = None


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


@dataclass(frozen=True)
class LeftoverTask:
    """A task a previous agent on this host left running that the runtime can reattach to (a
    container survives its agent): the daemon reports it to the master at registration, which keeps
    it if the allocation is still wanted there and says kill otherwise."""

    handle: TaskHandle
    task_id: str
    token: str | None = field(default=None, repr=False)
    workdir: Path | None = None


class TaskRuntime(Protocol):
    name: str
    # Whether the runtime runs container images (LaunchSpec.container); the daemon refuses a task
    # that asks for an image on an agent whose runtime does not (a runtime without it does not).
    runs_images: bool

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

    # The three below are optional: the daemon treats a runtime without them as one whose tasks
    # die with the agent and whose exit status says it all.

    def exit_reason(self, handle: TaskHandle) -> str | None:
        """After wait() returned: why the task ended, when the runtime knows more than the exit
        status (a container killed for lack of memory); None otherwise."""
        ...

    def leftovers(self) -> list[LeftoverTask]:
        """The tasks clean_up_leftovers() kept for reattaching (none for runtimes whose tasks die
        with their agent)."""
        ...

    def resume(self, handle: TaskHandle, output: OutputFn) -> None:
        """Reattach to a leftover task: stream its output from now on."""
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
    """What every runtime may be built from: the agent's work directory (for its bookkeeping), its
    id (containers are labelled with it) and the container settings of its config."""

    work_dir: Path
    agent_id: str = ""
    docker_host: str | None = None
    container_user: str | None = None
    # docker: give each container the harness's libraries its image lacks (runtime/harness_libs.py)
    harness_libs: bool = False


class RuntimeUnavailable(Exception):
    """The runtime cannot work on this host (no container engine answers); the message says why."""


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
