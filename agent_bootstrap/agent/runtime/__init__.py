"""Task runtimes: the seam (base.py) and its implementations, each registered by name on import.

To add one: a module here that implements `TaskRuntime` and calls `register_runtime("<name>",
factory)`, imported below. `process` runs tasks as host processes, `docker` as containers.
"""

from __future__ import annotations

from agent_bootstrap.agent.runtime.base import (
    ContainerLaunch,
    LaunchSpec,
    LeftoverTask,
    Mount,
    OutputFn,
    RunAs,
    RuntimeOptions,
    RuntimeUnavailable,
    StartFailed,
    Stream,
    TaskHandle,
    TaskRuntime,
    UnknownRuntime,
    create_runtime,
    register_runtime,
    runtime_names,
    stop_task,
)

# Importing an implementation registers it (docker imports its SDK only when the runtime is created).
from agent_bootstrap.agent.runtime.docker import DockerRuntime
from agent_bootstrap.agent.runtime.process import (
    MARKER_ENV,
    ProcessRuntime,
    TaskPidfile,
    exit_code_of,
    kill_marked,
    processes_with_marker,
)

__all__ = [
    "MARKER_ENV", "ContainerLaunch", "DockerRuntime", "LaunchSpec", "LeftoverTask", "Mount", "OutputFn",
    "ProcessRuntime", "RunAs", "RuntimeOptions", "RuntimeUnavailable", "StartFailed", "Stream",
    "TaskHandle", "TaskPidfile", "TaskRuntime", "UnknownRuntime", "create_runtime", "exit_code_of",
    "kill_marked", "processes_with_marker", "register_runtime", "runtime_names", "stop_task",
]
