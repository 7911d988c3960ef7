"""instances.parked_at, .resumed_at, .resume_connected_at: the warm pool (issue 28)

An idle on-demand instance may be stopped into the pool's warm pool (`warm_pool_size`) instead of
terminated: `parked_at` is when the stop was decided; `resumed_at` when it was last started again,
and `resume_connected_at` when its agent first registered after that start (start times, measured
as boot times are, weigh the idle policy's relaunch cost).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 15:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("parked_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("resume_connected_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("resume_connected_at")
        batch.drop_column("resumed_at")
        batch.drop_column("parked_at")
