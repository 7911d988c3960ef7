"""quota_leases: counters shared by every master process (log searches, request-body memory)

The per-caller limit on open log searches was counted in each API worker's memory, so a caller got
the limit once per worker. Leases in the database are counted by every process; each expires
unless renewed by the process that holds it, so a crashed worker's shares come back.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quota_leases",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_quota_leases_key", "quota_leases", ["key", "expires_at"])
    op.create_index("ix_quota_leases_expires", "quota_leases", ["expires_at"])


def downgrade() -> None:
    op.drop_table("quota_leases")
