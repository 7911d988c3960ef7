"""SQLite's writers queue on one gate across the master's processes (control_plane/db/engine.py
`_WriterGate`): an exclusive lock on a file beside the database, so that a writer in one process
waits for the other's transaction on a lock the kernel hands over at once, not in SQLite's busy
handler (sleeps of up to 100 ms that miss the moment the database is free)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import text

from control_plane.db import engine as engine_mod

WAIT = 30.0

# Another process that takes the gate as a master's writer would, and lets it go when told.
_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
os.close(fd)
"""


def _write(engine, value: int) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": value})


def test_a_writer_waits_for_another_process_on_the_lock_file(tmp_path: Path) -> None:
    db = tmp_path / "state" / "shipyard.db"
    engine = engine_mod.make_engine(f"sqlite:///{db}", pool_size=2)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (v INTEGER)"))
        lock = Path(str(db) + engine_mod.WRITER_LOCK_SUFFIX)
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600  # beside the database, private as it is
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            done = threading.Event()
            writer = threading.Thread(target=lambda: (_write(engine, 1), done.set()), daemon=True)
            writer.start()
            # The other process holds the gate: this process's writer waits for it...
            assert not done.wait(0.5)
            # ...while a reader does not.
            with engine_mod.read_only(engine).connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 0
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert done.wait(WAIT)  # ...and writes once it is let go
            writer.join(WAIT)
        finally:
            holder.kill()
            holder.wait()
        # Every transaction lets it go: another process can take it now.
        probe = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(lock)], timeout=WAIT)
        assert probe.returncode == 0
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
    finally:
        engine.dispose()


def test_a_writer_does_not_wait_forever_for_a_stuck_process(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A process that keeps the gate (stuck inside a transaction) delays the others' writers by the
    # gate's timeout at most; then SQLite decides, as it did before the gate.
    monkeypatch.setattr(engine_mod, "_GATE_TIMEOUT_S", 0.3)
    db = tmp_path / "shipyard.db"
    engine = engine_mod.make_engine(f"sqlite:///{db}", pool_size=2)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(db) + engine_mod.WRITER_LOCK_SUFFIX],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with engine.begin() as conn:  # the holder has no SQLite lock: the write goes through
            conn.execute(text("CREATE TABLE t (v INTEGER)"))
        _write(engine, 1)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
    finally:
        holder.kill()
        holder.wait()
        engine.dispose()


def test_writers_of_two_engines_on_one_file_share_the_gate(tmp_path: Path) -> None:
    # One gate per file in a process: a second engine's writer waits on the same in-process lock
    # (never on its own process's lock file, which would wait forever).
    db = tmp_path / "shipyard.db"
    first = engine_mod.make_engine(f"sqlite:///{db}", pool_size=2)
    second = engine_mod.make_engine(f"sqlite:///{db}", pool_size=2)
    try:
        with first.begin() as conn:
            conn.execute(text("CREATE TABLE t (v INTEGER)"))
        done = threading.Event()
        with first.begin() as conn:
            conn.execute(text("INSERT INTO t (v) VALUES (1)"))
            writer = threading.Thread(target=lambda: (_write(second, 2), done.set()), daemon=True)
            writer.start()
            assert not done.wait(0.3)  # waits for the first engine's transaction
        assert done.wait(WAIT)  # and writes once it commits
        writer.join(WAIT)
        with second.connect() as conn:
            assert conn.execute(text("SELECT v FROM t ORDER BY v")).scalars().all() == [1, 2]
    finally:
        first.dispose()
        second.dispose()
