"""Shared fixtures. Every test that touches the database runs on SQLite and on PostgreSQL
through the `db_url` fixture."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import hypothesis
import pytest

from tests.pg import PostgresServer, find_pg_bin, free_port, skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
ADMIN_PASSWORD = "admin-test-pw-1"
# The interpreter of the masters the tests start. tests/pythons/ runs the agent's and the
# harness's tests under other Pythons, without the master's dependencies: it sets this to the
# main venv's, so their agents (sys.executable) meet a real master.
MASTER_PYTHON = os.environ.get("SHIPYARD_MASTER_PYTHON") or sys.executable

# Masters the tests start run as one process unless a test asks for API workers: each worker
# costs a second of imports at every start, and the suite starts masters a few hundred times.
# The product's default (a control process and one worker per core) is what
# tests/integration/test_cluster.py, test_ha.py, tests/control_plane/test_workers.py and
# `make demo` run.
os.environ.setdefault("SHIPYARD_API_WORKERS", "1")

# Property tests assert behaviour, never speed (speed is benchmarks/' business): Hypothesis' default
# 200 ms deadline per example failed a merge property under the full suite's load on 2 cores.
hypothesis.settings.register_profile("shipyard", deadline=None)
hypothesis.settings.load_profile("shipyard")

# Argon2id at its smallest work factor for the masters the tests start (in process through
# `master_config`, as processes through the environment). The product's default (3 passes over
# 64 MiB, 4 lanes) costs 0.1-0.2 s a hash here, and the suite hashes and verifies thousands of
# passwords (every master's admin, every login). tests/control_plane/test_auth.py runs the
# defaults, and the re-hash of a stored hash made under other parameters at login.
TEST_PASSWORD_HASHING = {"password_hash_time_cost": 1, "password_hash_memory_kib": 1024, "password_hash_parallelism": 1}
for _name, _value in TEST_PASSWORD_HASHING.items():
    os.environ.setdefault("SHIPYARD_" + _name.upper(), str(_value))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        skip_or_fail("no PostgreSQL binaries (initdb, pg_ctl) found; set PG_BIN or install postgresql")
    server = PostgresServer(bin_dir)
    try:
        server.start()
    except subprocess.CalledProcessError as e:
        skip_or_fail(f"could not start a throwaway PostgreSQL: {e.stderr.decode(errors='replace')[-400:]}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shipyard.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()


@pytest.fixture(scope="session")
def migrated_schemas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Per database kind, a database the migrations brought to head once for this test process:
    the in-process masters of `master_config` start from a copy (their start then finds nothing to
    migrate), instead of running every migration again for each of some 500 tests. `db_url`
    stays an empty database; tests/control_plane/db/test_migrations.py migrates from nothing."""
    return {}


def _from_migrated_schema(db_url: str, request: pytest.FixtureRequest) -> None:
    """Make the new, empty database `db_url` a copy of the migrated one of its kind."""
    import shutil

    from sqlalchemy.engine import make_url

    from control_plane.db import migrate
    from control_plane.db.engine import make_engine

    schemas: dict[str, str] = request.getfixturevalue("migrated_schemas")
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        if "sqlite" not in schemas:
            template = request.getfixturevalue("tmp_path_factory").mktemp("schema") / "migrated.db"
            engine = make_engine(f"sqlite:///{template}")
            migrate.upgrade(engine)
            engine.dispose()
            schemas["sqlite"] = str(template)
        assert url.database and not Path(url.database).exists()
        shutil.copyfile(schemas["sqlite"], url.database)
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    if "postgres" not in schemas:
        template_url = server.create_database()
        engine = make_engine(template_url)
        migrate.upgrade(engine)
        engine.dispose()
        schemas["postgres"] = str(make_url(template_url).database)
    server.recreate_from(str(url.database), schemas["postgres"])


@pytest.fixture
def master_config(db_url: str, tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    from control_plane.config import load_config

    _from_migrated_schema(db_url, request)
    return load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD,
                       **TEST_PASSWORD_HASHING)


@pytest.fixture
def master(master_config):  # type: ignore[no-untyped-def]
    from control_plane.master import Master

    m = Master(master_config)
    m.prepare()
    yield m
    m.stop()


@pytest.fixture
def client(master):  # type: ignore[no-untyped-def]
    """An in-process HTTP client against the real app (no loops running)."""
    from fastapi.testclient import TestClient

    from control_plane.api.app import create_app

    with TestClient(create_app(master)) as c:
        yield c


def login(client, username: str = "admin", password: str = ADMIN_PASSWORD) -> dict[str, str]:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


@pytest.fixture
def admin_headers(client) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return login(client)


class LiveMaster:
    """A real `det-master` process on a free port."""

    def __init__(self, db_url: str, state_dir: Path, extra_env: dict[str, str] | None = None,
                 config_path: Path | None = None, module: str = "control_plane") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = state_dir
        self.db_url = db_url
        self.log_path = state_dir / "master.log"
        self.env = dict(os.environ, SHIPYARD_ADMIN_PASSWORD=ADMIN_PASSWORD, **(extra_env or {}))
        self.config_path = config_path
        self.module = module  # the entry module: `python -m <module>` (a test-only one may wrap the master)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [MASTER_PYTHON, "-m", self.module, "--port", str(self.port), "--db", self.db_url,
               "--state-dir", str(self.state_dir)]
        if self.config_path:
            cmd[3:3] = ["--config", str(self.config_path)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
                                     cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"master exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/info", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("master did not answer in time")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def token(self, username: str = "admin", password: str = ADMIN_PASSWORD) -> str:
        r = httpx.post(self.url + "/api/v1/auth/login", json={"username": username, "password": password})
        r.raise_for_status()
        return r.json()["token"]


@pytest.fixture
def live_master(db_url: str, tmp_path: Path) -> Iterator[LiveMaster]:
    m = LiveMaster(db_url, tmp_path / "master-state")
    m.start()
    yield m
    m.stop()


# The longest files of the suite (a minute or more of one worker each, measured in full runs), run
# first: `make test` hands whole files to its two workers in collection order, and one of these
# collected last kept one worker busy for minutes after the other had nothing left.
LONGEST_FIRST = (
    "tests/e2e/test_strict_master_boot.py",
    "tests/pythons/test_python_3_9.py",
    "tests/pythons/test_python_3_10.py",
    "tests/control_plane/api/test_schemathesis.py",
    "tests/control_plane/api/test_schemathesis_postgres.py",
    "tests/integration/test_master_outage.py",
    "tests/pythons/test_python_3_12.py",
    "tests/pythons/test_python_3_13.py",
    "tests/e2e/test_deploy_boot.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(str(config.rootpath))

    def key(item: pytest.Item) -> int:
        try:
            path = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: every file keeps its own order, the rest keep theirs
