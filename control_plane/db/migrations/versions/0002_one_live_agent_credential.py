"""one live credential per agent id

Two enrolments racing for the same new agent id could both be issued a credential; a partial
unique index on the live agent credentials makes the database refuse the second.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25 10:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "kind = 'agent_credential' AND revoked_at IS NULL"


def upgrade() -> None:
    # A race before this index may have left two live credentials for one agent id: keep the
    # newest (the one its last registration returned), revoke the others.
    op.execute(sa.text(
        f"UPDATE tokens SET revoked_at = CURRENT_TIMESTAMP WHERE {LIVE} AND id NOT IN "
        f"(SELECT max(id) FROM tokens WHERE {LIVE} GROUP BY agent_id)"))
    op.create_index("uq_tokens_live_agent_credential", "tokens", ["agent_id"], unique=True,
                    sqlite_where=sa.text(LIVE), postgresql_where=sa.text(LIVE))


def downgrade() -> None:
    op.drop_index("uq_tokens_live_agent_credential", table_name="tokens")
