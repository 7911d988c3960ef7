"""consolidation_moves: every allocation moved off an instance by consolidation

Consolidation asks the allocations of an instance to checkpoint and stop so that they resume on the
pool's other instances, then terminates the emptied instance. Each move is a row: when, which
instance and allocation, why and the estimated saving. The pool's disruption budget (moves per
hour) counts them, and describe and the web UI show the recent ones.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 17:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "consolidation_moves",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("launch_id", sa.String(64), nullable=False),
        sa.Column("instance_id", sa.String(128), nullable=True),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("allocation_id", sa.String(64), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("saving", sa.Float(), nullable=False),
        sa.Column("saving_unit", sa.String(16), nullable=False),
    )
    op.create_index("ix_consolidation_moves_pool_at", "consolidation_moves", ["pool", "at"])


def downgrade() -> None:
    op.drop_table("consolidation_moves")
