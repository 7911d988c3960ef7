"""login_failures keyed by (address, username): the throttle no longer counts per username alone

Guesses for a username from one address locked its owner out from every other address. A failure
is now one row naming both, counted per (address, username) and per address. The old rows (per
username and per address, within a five-minute window) are dropped: they only slowed guessing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _create(*columns: sa.Column[Any]) -> None:
    op.create_table(
        "login_failures",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        *columns,
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_login_failures_at", "login_failures", ["at"])


def upgrade() -> None:
    op.drop_table("login_failures")
    _create(sa.Column("address", sa.String(255), nullable=False), sa.Column("username", sa.String(128), nullable=False))
    op.create_index("ix_login_failures_address", "login_failures", ["address", "username", "at"])


def downgrade() -> None:
    op.drop_table("login_failures")
    _create(sa.Column("scope", sa.String(16), nullable=False), sa.Column("key", sa.String(255), nullable=False))
    op.create_index("ix_login_failures_key", "login_failures", ["scope", "key", "at"])
