"""login_failures: the login throttle's failures, shared by every master process

With API workers (and masters on several hosts) a throttle kept in one process's memory would let
each process grant its own quota of guesses.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 16:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "login_failures",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_login_failures_key", "login_failures", ["scope", "key", "at"])
    op.create_index("ix_login_failures_at", "login_failures", ["at"])


def downgrade() -> None:
    op.drop_table("login_failures")
