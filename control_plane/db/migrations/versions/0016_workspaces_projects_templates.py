"""workspaces, projects and config templates (Determined 0.38.1's homes for experiments)

Every experiment lives in a project and every project in a workspace. The default workspace
`Uncategorized` and its project `Uncategorized` are ids 1 and 1, as in Determined; experiments that
existed before this revision move there (`experiments.project_id` defaults to 1). Templates are
named experiment-config bases held by a workspace (`det template`, `det e create --template`).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 19:50:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    workspaces = op.create_table(
        "workspaces",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("immutable", sa.Boolean(), nullable=False),
        sa.Column("default_compute_pool", sa.String(64), nullable=True),
        sa.Column("default_aux_pool", sa.String(64), nullable=True),
        sa.Column("checkpoint_storage", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    projects = op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("key", sa.String(32), nullable=False, unique=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("immutable", sa.Boolean(), nullable=False),
        sa.Column("notes", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("workspace_id", "name"),
    )
    op.create_index("ix_projects_workspace_id", "projects", ["workspace_id"])
    op.create_table(
        "templates",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("workspace_id", sa.Integer(), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    # Fresh tables: the first rows get id 1 on SQLite and PostgreSQL alike (no explicit ids, so
    # PostgreSQL's sequences stay in step).
    now = datetime.now(UTC)
    op.bulk_insert(workspaces, [{"name": "Uncategorized", "owner_id": None, "archived": False, "immutable": True,
                                 "default_compute_pool": None, "default_aux_pool": None,
                                 "checkpoint_storage": None, "created_at": now}])
    op.bulk_insert(projects, [{"name": "Uncategorized", "key": "UNCAT", "description": "", "workspace_id": 1,
                               "owner_id": None, "archived": False, "immutable": True, "notes": [],
                               "created_at": now}])
    # Existing experiments move into Uncategorized (the server default backfills every row).
    op.add_column("experiments", sa.Column("project_id", sa.Integer(), nullable=False, server_default="1"))
    op.create_index("ix_experiments_project_id", "experiments", ["project_id"])


def downgrade() -> None:
    op.drop_index("ix_experiments_project_id", table_name="experiments")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("project_id")
    op.drop_table("templates")
    op.drop_index("ix_projects_workspace_id", table_name="projects")
    op.drop_table("projects")
    op.drop_table("workspaces")
