from __future__ import annotations

import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from control_plane.db.engine import make_engine
from control_plane.db.migrate import current_revision, upgrade
from control_plane.db.models import Base


def test_migrations_create_exactly_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    assert current_revision(engine) == "0023"
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), Base.metadata)
    assert diff == [], diff
    upgrade(engine)  # idempotent
    assert set(inspect(engine).get_table_names()) >= {t.name for t in Base.metadata.sorted_tables}
    engine.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_det_master_db_upgrade_command(db_url: str, tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "control_plane", "--db", db_url, "--state-dir", str(tmp_path),
                          "db", "upgrade"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0023"
