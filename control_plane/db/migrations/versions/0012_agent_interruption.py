"""agents: the cloud's interruption notice the agent reported

A spot instance's two-minute warning (AWS) or preemption notice (GCP), reported by its agent: when
it came, what it announced and when the instance goes. The agent takes no new work from then, its
allocations are asked to checkpoint and stop, and the autoscaler no longer counts its instance as
capacity.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 17:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("interruption_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("interruption_action", sa.String(16), nullable=True))
        batch.add_column(sa.Column("interruption_deadline", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("interruption_deadline")
        batch.drop_column("interruption_action")
        batch.drop_column("interruption_at")
