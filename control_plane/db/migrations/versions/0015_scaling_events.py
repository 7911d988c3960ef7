"""scaling_events: the autoscaler's decisions, as every API worker reads them

The leader's autoscaler writes a row per decision that changed something (launches with their type
and capacity, terminations with reason and cause, consolidation moves) and collapses a run of steady
ticks into one row; the pool page, `det resource-pool describe` and the API read them, whichever
worker answers. Rows are pruned by age and count (`scaling_history_days`, `scaling_history_rows`).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 17:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scaling_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("launch", sa.Integer(), nullable=False),
        sa.Column("terminate", sa.Integer(), nullable=False),
        sa.Column("ticks", sa.Integer(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_scaling_events_pool_id", "scaling_events", ["pool", "id"])


def downgrade() -> None:
    op.drop_table("scaling_events")
