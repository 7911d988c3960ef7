"""instances.capacity: whether an instance was bought spot or on demand

A pool may launch several instance types, each spot or on demand (`capacity: spot | on-demand |
spot-then-on-demand`). The launch row records the type and capacity the scale decider chose, then
what the cloud launched (after a capacity failover it may be another). Rows from before are "".

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 18:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("capacity", sa.String(16), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("capacity")
