"""consolidation_moves.replacement_launch_id, .pending, .abandoned: a move onto a new, cheaper instance (issue 28)

Consolidation may replace an instance by one of a cheaper option: the replacement is launched
first (its launch id on each move row) and the work is asked to move only once the replacement's
agent has connected (`pending` until then), or `abandoned` when the replacement failed, did not
connect in time, was not cheaper after a capacity failover, or took other work first.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 09:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("consolidation_moves") as batch:
        batch.add_column(sa.Column("replacement_launch_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("pending", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("abandoned", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("consolidation_moves") as batch:
        batch.drop_column("abandoned")
        batch.drop_column("pending")
        batch.drop_column("replacement_launch_id")
