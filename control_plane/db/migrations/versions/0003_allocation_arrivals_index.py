"""index allocations by pool and creation time

The autoscaler reads every pool's demand arrivals of the last `arrival_window` (allocations
created in the pool since then) on each tick, for its scale-down hysteresis; without this index
that read scans every allocation the pool ever had.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 10:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_allocations_pool_created_at", "allocations", ["pool", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_allocations_pool_created_at", table_name="allocations")
