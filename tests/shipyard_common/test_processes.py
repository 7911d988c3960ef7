"""Process-group helpers with real processes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from shipyard_common.processes import group_alive, pid_alive, signal_group, start_session, stop_process_group

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")

# Prints its pid and its group's, starts a child in the same group, then waits.
LEADER = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(os.getpid(), os.getpgid(0), child.pid, flush=True)\n"
    "time.sleep(600)\n"
)
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def read_line(log: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if text.endswith("\n"):
            return text.strip()
        time.sleep(0.02)
    raise AssertionError(f"nothing in {log}")


def test_a_session_leads_its_group_and_stopping_ends_the_whole_group(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "leader.log"
    proc = start_session([sys.executable, "-c", LEADER], log, dict(os.environ))
    try:
        pid, pgid, child = (int(x) for x in read_line(log).split())
        assert pid == proc.pid == pgid != os.getpgid(0)
        assert pid_alive(pid) and pid_alive(child) and group_alive(pgid)
        stop_process_group(pgid, grace=10)
        proc.wait(10)
        assert not pid_alive(pid)
        deadline = time.monotonic() + 10
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(child)
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    proc = start_session([sys.executable, "-c", STUBBORN], log, dict(os.environ))
    try:
        assert read_line(log) == "up"
        t0 = time.monotonic()
        stop_process_group(proc.pid, grace=0.5, poll_interval=0.02)
        assert time.monotonic() - t0 >= 0.5
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_gone_processes_and_groups() -> None:
    proc = start_session([sys.executable, "-c", "pass"], Path(os.devnull), dict(os.environ))
    proc.wait(10)
    assert not pid_alive(proc.pid) and not group_alive(proc.pid)
    signal_group(proc.pid, signal.SIGTERM)  # no error
    stop_process_group(proc.pid, grace=0.1)  # returns at once
