"""cluster_messages: the cluster-wide message (issue 30, `det master cluster-message set/get/clear`)

Determined's table: each `set` expires the previous message and adds a row; the newest row that
has not ended is the cluster's message (shown from its start_time). Rows are kept as the history.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 05:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cluster_messages",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("created_by", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_cluster_messages_created_time", "cluster_messages", ["created_time"])


def downgrade() -> None:
    op.drop_index("ix_cluster_messages_created_time", table_name="cluster_messages")
    op.drop_table("cluster_messages")
