"""Migration 0002 (one live credential per agent id) on a database that a race had already left
with two live credentials for one agent: the newest is kept, the others revoked, then the index
holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from control_plane.db.engine import make_engine
from control_plane.db.migrate import current_revision, upgrade
from control_plane.db.models import Token


def test_0002_keeps_the_newest_live_credential_of_each_agent(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine, "0001")
    now = datetime.now(UTC)
    rows = [("h1", "agent_credential", "a1"), ("h2", "agent_credential", "a1"), ("h3", "agent_credential", "a2"),
            ("h4", "agent", "a1"), ("h5", "agent", "a1")]
    with engine.begin() as conn:
        conn.execute(insert(Token), [{"token_hash": h, "kind": k, "agent_id": a, "pool": "default",
                                      "created_at": now} for h, k, a in rows])
    upgrade(engine, "0002")
    assert current_revision(engine) == "0002"
    with engine.begin() as conn:
        live = conn.execute(select(Token.token_hash).where(Token.revoked_at.is_(None)).order_by(Token.token_hash))
        assert [r[0] for r in live] == ["h2", "h3", "h4", "h5"]
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(Token).values(token_hash="h6", kind="agent_credential", agent_id="a2", created_at=now))
    engine.dispose()
