"""tasks: commands and notebooks, scheduled like trials (issue 29)

A task other than a trial: its kind, owner, config, pool, its context archive (a
model_definitions row) and where it serves once running (`proxy_address`, reported by the task),
with the latest traffic through the master's proxy (`last_activity_at`, for idle timeouts). Its
allocation (allocations.task_id = tasks.id) is placed by the same scheduler as trials'.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 20:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("context_id", sa.Integer(), sa.ForeignKey("model_definitions.id"), nullable=True),
        sa.Column("proxy_address", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_activity_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("tasks")
