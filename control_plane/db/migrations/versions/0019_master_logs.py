"""master_logs: the master's own log lines, from every process, for `det master logs` (issue 30)

Determined keeps its master's recent log entries in memory; Shipyard's master is several processes
(the leader and its API workers, which may answer any request), so each writes its lines here in
batches and the newest `master_log_retention` are kept.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 00:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "master_logs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("process", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("master_logs")
