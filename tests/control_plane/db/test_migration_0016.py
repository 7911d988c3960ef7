"""Migration 0016 on a database with experiments: they land in project 1 `Uncategorized` of
workspace 1 `Uncategorized`, and the next workspace and project get ids 2 (PostgreSQL's sequences
stay in step with the seeded rows)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Column, MetaData, Table, insert, select

from control_plane.db.engine import make_engine
from control_plane.db.migrate import upgrade
from control_plane.db.models import Experiment, ModelDefinition, Project, User, Workspace

# The experiments table as 0015 has it (the model's project_id comes with 0016).
_EXPERIMENTS_0015 = Table("experiments", MetaData(),
                          *[Column(c.name, c.type) for c in Experiment.__table__.columns if c.name != "project_id"])


def test_0016_moves_existing_experiments_into_uncategorized(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine, "0015")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(insert(User).values(id=1, username="u", password_hash="x", created_at=now, modified_at=now))
        conn.execute(insert(ModelDefinition).values(id=1, archive=b"", size_bytes=0, sha256="0" * 64, file_count=0))
        for i in (1, 2):
            conn.execute(insert(_EXPERIMENTS_0015).values(
                id=i, name=f"e{i}", description="", notes="", labels=[], config={}, original_config="",
                state="COMPLETED", owner_id=1, archived=False, model_definition_id=1, resource_pool="default",
                weight=1.0, job_id=f"job-{i}", progress=0.0, searcher_event_seq=0, warnings=[], start_time=now,
            ))
    upgrade(engine, "0016")
    with engine.begin() as conn:
        assert [tuple(r) for r in conn.execute(select(Experiment.id, Experiment.project_id).order_by(Experiment.id))] \
            == [(1, 1), (2, 1)]
        ws = conn.execute(select(Workspace.id, Workspace.name, Workspace.immutable)).all()
        assert [tuple(r) for r in ws] == [(1, "Uncategorized", True)]
        pj = conn.execute(select(Project.id, Project.name, Project.workspace_id)).all()
        assert [tuple(r) for r in pj] == [(1, "Uncategorized", 1)]
        conn.execute(insert(Workspace).values(name="team", archived=False, immutable=False, created_at=now))
        conn.execute(insert(Project).values(name="p", key="P", description="", workspace_id=1, archived=False,
                                            immutable=False, notes=[], created_at=now))
        assert conn.execute(select(Workspace.id).where(Workspace.name == "team")).scalar() == 2
        assert conn.execute(select(Project.id).where(Project.key == "P")).scalar() == 2
    engine.dispose()
