"""Task runtimes: the seam (base.py) and its implementations, each registered by name on import.

To add one (a container runtime for `environment.image`, say): a module here that implements
`TaskRuntime` and calls `register_runtime("<name>", factory)`, imported below.
"""

from __future__ import annotations

from agent_bootstrap.agent.runtime.base import (
    LaunchSpec,
    OutputFn,
    RuntimeOptions,
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

# Importing an implementation registers it.
from agent_bootstrap.agent.runtime.process import (
    MARKER_ENV,
    ProcessRuntime,
    TaskPidfile,
    exit_code_of,
    kill_marked,
    processes_with_marker,
)

__all__ = [
    "MARKER_ENV", "LaunchSpec", "OutputFn", "ProcessRuntime", "RuntimeOptions", "StartFailed", "Stream",
    "TaskHandle", "TaskPidfile", "TaskRuntime", "UnknownRuntime", "create_runtime", "exit_code_of",
    "kill_marked", "processes_with_marker", "register_runtime", "runtime_names", "stop_task",
]
