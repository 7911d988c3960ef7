"""allocations: when a graceful stop was asked

A trial asked to stop (priority preemption, a drain that timed out, pause, the searcher) is killed
if it has not stopped within the preemption grace; the grace must run from the request, not from
the trial's start (else anything running longer than the grace was killed at once).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 11:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("preempt_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("preempt_requested_at")
