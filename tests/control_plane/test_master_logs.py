"""`GET /api/v1/master/logs` and `det master logs` (issue 30): a real master process writes its own
log lines to the database (services/master_logs.py); admins read them, oldest first, the last N,
and follow new ones; anyone else is refused."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ADMIN_PASSWORD, ROOT, LiveMaster


def entries(m: LiveMaster, token: str, **params: Any) -> list[dict[str, Any]]:
    r = httpx.get(m.url + "/api/v1/master/logs", params=params, headers={"Authorization": f"Bearer {token}"},
                  timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(line)["result"]["logEntry"] for line in r.text.splitlines() if line.strip()]


def wait_for(m: LiveMaster, token: str, text: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = entries(m, token)
        if any(text in e["message"] for e in got):
            return got
        time.sleep(0.3)
    raise AssertionError(f"{text!r} never reached the master's log: {got[-5:]}")


def test_admins_read_the_masters_log_others_are_refused(live_master: LiveMaster, tmp_path: Path) -> None:
    token = live_master.token()
    got = wait_for(live_master, token, "event=master_listening")
    first = got[0]
    assert first["level"].startswith("LOG_LEVEL_") and first["timestamp"].endswith("Z")
    assert [e["id"] for e in got] == sorted(e["id"] for e in got)
    assert "\n" not in "".join(e["message"] for e in got)

    # A failed login with a forged line in the username: logged, escaped, on one line.
    httpx.post(live_master.url + "/api/v1/auth/login",
               json={"username": "eve\nts=x level=INFO event=login username=admin", "password": "nope"})
    got = wait_for(live_master, token, "event=login_failed username=eve\\nts=x")
    assert not any("\nts=x" in e["message"] for e in got)  # never a raw newline: no forged line

    before = entries(live_master, token)
    last_two = entries(live_master, token, offset=-2)  # the master may have written more since
    assert len(last_two) == 2 and before[-2]["id"] <= last_two[0]["id"] < last_two[1]["id"], (before[-2:], last_two)
    assert len(entries(live_master, token, limit=1)) == 1

    # Following: a line written after the stream opened arrives on it.
    with httpx.stream("GET", live_master.url + "/api/v1/master/logs",
                      params={"follow": "true", "offset": -1}, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as r:
        lines = r.iter_lines()
        next(lines)  # the newest line so far
        httpx.post(live_master.url + "/api/v1/auth/login", json={"username": "followed-user", "password": "nope"})
        for line in lines:
            if "username=followed-user" in json.loads(line)["result"]["logEntry"]["message"]:
                break
        else:
            raise AssertionError("the followed stream ended without the new line")

    admin = {"Authorization": f"Bearer {token}"}
    assert httpx.post(live_master.url + "/api/v1/users", headers=admin, json={
        "user": {"username": "viewer"}, "password": "viewer-password-1"}).status_code == 200
    other = live_master.token("viewer", "viewer-password-1")
    r = httpx.get(live_master.url + "/api/v1/master/logs", headers={"Authorization": f"Bearer {other}"})
    assert r.status_code == 403, r.text
    assert httpx.get(live_master.url + "/api/v1/master/logs").status_code == 401

    # Shipyard's det: the last 2 lines, one per line, with their level.
    env = dict(os.environ, SHIPYARD_CLI_DIR=str(tmp_path / "cli"))
    det = [sys.executable, "-m", "cli.main", "-m", live_master.url]
    login = subprocess.run([*det, "user", "login", "admin", "--password", ADMIN_PASSWORD], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=60)
    assert login.returncode == 0, login.stderr
    out = subprocess.run([*det, "master", "logs", "--tail", "2"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.strip().splitlines()
    assert len(printed) == 2 and all(" [INFO] logger=" in ln or " [WARNING] logger=" in ln for ln in printed), out.stdout


def test_the_recorder_keeps_the_newest_lines_while_the_database_is_away(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import sessionmaker

    from control_plane.db.models import MasterLog
    from control_plane.services import master_logs

    engine = create_engine(f"sqlite:///{tmp_path / 'logs.db'}")
    MasterLog.__table__.create(engine)
    away = {"now": True}

    def sessions():  # type: ignore[no-untyped-def]
        if away["now"]:
            raise OSError("the database is away")
        return sessionmaker(engine)()

    rec = master_logs.Recorder(sessions, "test", retention=100, flush_s=3600)  # type: ignore[arg-type]
    log = logging.getLogger("test.master_logs")
    log.addHandler(rec)
    log.setLevel(logging.INFO)
    try:
        for i in range(3):
            log.info("event=line n=%d", i)
        assert rec._flush() is False and rec.dropped == 0  # kept for the next try
        away["now"] = False
        assert rec._flush() is True
        with sessionmaker(engine)() as s:
            assert [m.message for m in s.scalars(select(MasterLog).order_by(MasterLog.id))] == [
                f"logger=test.master_logs event=line n={i}" for i in range(3)]
    finally:
        log.removeHandler(rec)
        rec.close()
