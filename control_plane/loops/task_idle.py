"""Idle notebooks and TensorBoards (issue 29): every few seconds, for each serving one with an idle
timeout, ask a notebook's Jupyter (directly, with the task's token, not counted as activity) for its own last
activity and its kernels' execution states, ask the core (core/task_idle.py) with the proxy's
traffic beside, and stop those it finds idle, with a line in their logs saying why."""

from __future__ import annotations

import logging
from datetime import datetime

import httpx

from control_plane.core.task_idle import Activity, idle_reason
from control_plane.db.engine import transaction
from control_plane.master import Master
from control_plane.services import tasks

log = logging.getLogger("shipyard.task_idle")

CHECK_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 3.0


def _probe(c: tasks.IdleCandidate, token: str) -> tuple[datetime | None, int]:
    """(Jupyter's last_activity, kernels executing); (None, 0) when it does not answer."""
    base = f"http://{c.address}/proxy/{c.task_id}/api"
    headers = {"Authorization": f"token {token}"}
    try:
        with httpx.Client(timeout=PROBE_TIMEOUT_S, headers=headers) as client:
            status = client.get(f"{base}/status")
            kernels = client.get(f"{base}/kernels", params={"no_track_activity": "1"})
        status.raise_for_status()
        kernels.raise_for_status()
        last = datetime.fromisoformat(status.json()["last_activity"].replace("Z", "+00:00"))
        busy = sum(1 for k in kernels.json() if k.get("execution_state") not in ("idle", "dead", None))
        return last, busy
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        log.debug("event=idle_probe_failed task_id=%s error=%r", c.task_id, str(e))
        return None, 0


def tick(master: Master) -> None:
    with master.read_sessions() as s:
        candidates = tasks.idle_candidates(s, master)
    for c in candidates:
        notebook = c.kind == "notebook"
        jupyter_at, busy = _probe(c, tasks.jupyter_token(master, c.task_id)) if notebook else (None, 0)
        reason = idle_reason(Activity(c.ready_at, c.proxy_at, jupyter_at, busy, notebook), master.clock(), c.timeout_s)
        if reason is not None:
            with transaction(master.sessions) as s:
                tasks.stop_idle(s, master, c.task_id, reason)


def register(master: Master) -> None:
    master.add_loop("task_idle", lambda: tick(master), CHECK_INTERVAL_S, min_gap_s=CHECK_INTERVAL_S)
