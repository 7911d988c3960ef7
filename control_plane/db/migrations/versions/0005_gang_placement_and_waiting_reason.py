"""allocations: gangs across agents, and why an allocation waits

`placement` lists every part of an allocation placed across agents ([{"agent": id, "slots": [...]}],
the chief first; NULL for an allocation on one agent, whose `agent_id` and `slot_ids` say it all,
as before). `waiting_reason` is the scheduler's latest word on why a pending allocation waits
(shown by `det job list`), NULL once it is placed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 11:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("waiting_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("waiting_reason")
        batch.drop_column("placement")
