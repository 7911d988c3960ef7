"""When a notebook or TensorBoard is idle (pure): no traffic through the master's proxy and, for a
notebook, no activity of Jupyter's own (its API, its kernels) for the timeout, and no kernel
executing. A running cell keeps it alive however long it runs; a closed tab with quiet kernels does
not."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Activity:
    ready_at: datetime  # when it began serving (its allocation started running)
    proxy_at: datetime | None  # the latest request through the master's proxy
    jupyter_at: datetime | None  # Jupyter's last_activity (/api/status): API calls and kernel messages
    busy_kernels: int  # kernels whose execution_state is not idle
    has_kernels: bool = True  # a notebook (a TensorBoard has no kernel and no activity of its own)


def idle_reason(a: Activity, now: datetime, timeout_s: float) -> str | None:
    """Why the task should stop now, or None while it is in use."""
    if a.busy_kernels:
        return None
    since = max(t for t in (a.ready_at, a.proxy_at, a.jupyter_at) if t is not None)
    idle = (now - since).total_seconds()
    if idle < timeout_s:
        return None
    kernels = " and no kernel activity" if a.has_kernels else ""
    return f"stopped: idle for {idle:.0f}s (no traffic through the master's proxy{kernels}; idle timeout {timeout_s:g}s)"
