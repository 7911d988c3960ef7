"""wake_signal: wake-ups across master processes on SQLite

On SQLite, a change the other master processes should wake up for bumps `seq` in its own
transaction; each process polls the row (db/wakebus.py). PostgreSQL uses NOTIFY instead.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    wake = op.create_table(
        "wake_signal",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.bulk_insert(wake, [{"id": 1, "seq": 0}])


def downgrade() -> None:
    op.drop_table("wake_signal")
