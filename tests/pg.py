"""A throwaway PostgreSQL server for the test session: initdb + pg_ctl on a free port.

Skipped with a clear reason where no PostgreSQL binaries exist; with CI=true (or
SHIPYARD_REQUIRE_POSTGRES=1) that skip becomes a failure."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

CANDIDATE_BIN_DIRS = [os.environ.get("PG_BIN", ""), "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin",
                      "/usr/lib/postgresql/17/bin", "/usr/local/pgsql/bin"]


def postgres_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("SHIPYARD_REQUIRE_POSTGRES") == "1"


def find_pg_bin() -> Path | None:
    for d in CANDIDATE_BIN_DIRS:
        if d and (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="shipyard-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.user = "shipyard"

    def _run(self, *cmd: str) -> None:
        env = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8")
        preexec = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root; run it as nobody.
            import pwd

            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            for p in self.dir.rglob("*"):
                os.chown(p, nobody.pw_uid, nobody.pw_gid)

            def preexec() -> None:  # type: ignore[misc]
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)

            env["HOME"] = str(self.dir)
        subprocess.run(cmd, check=True, env=env, preexec_fn=preexec, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, cwd=self.dir)

    def start(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8")
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start")

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{database}"

    def recreate_from(self, name: str, template: str) -> None:
        """Drop the (unused) database `name` and make it again as a copy of `template`."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE "{name}"')
            cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        conn.close()

    def create_database(self) -> str:
        import psycopg2

        name = "t_" + uuid.uuid4().hex[:12]
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self.url(name)


def skip_or_fail(reason: str) -> None:
    if postgres_required():
        pytest.fail(f"PostgreSQL is required here (CI=true): {reason}")
    pytest.skip(reason)


def missing_part(reason: str) -> None:
    """A system part a test needs (cloud-init, sshd, PostgreSQL) is not here: skip, or fail under CI
    (where `make test` has installed it, so missing means broken)."""
    if postgres_required():
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)
