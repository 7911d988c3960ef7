"""tasks.workspace_id: the workspace a command, notebook, TensorBoard or shell belongs to (issue 30)

Determined 0.38.1's launch requests carry `workspaceId`; the task's roles (who may kill it) and its
pool's bindings are its workspace's. Tasks launched before this revision belong to workspace 1,
Uncategorized (the server default backfills every row), where every user is Editor as before.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 02:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("workspace_id", sa.Integer(), nullable=False, server_default="1"))
    op.create_index("ix_tasks_workspace_id", "tasks", ["workspace_id"])


def downgrade() -> None:
    op.drop_index("ix_tasks_workspace_id", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("workspace_id")
