"""agents: when a drain began

`det agent disable --drain` lets an agent's work finish instead of killing it; the drain's start
is kept on the agent (`drain_started_at`, NULL when not draining) so that the placement loop can
preempt what is still running after `agent_drain_timeout_s`, and `det agent list` can show it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 11:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("drain_started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("drain_started_at")
