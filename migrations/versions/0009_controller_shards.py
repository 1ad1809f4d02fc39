"""Controller shards: the fence of each shard's owner, checked by every decision.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06

Empty until controllers run sharded (CANARY_CONTROLLER_SHARDS); a single elected
controller never writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "controller_shards",
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(253), nullable=False),
        sa.Column("held_since", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("shard", name="pk_controller_shards"),
    )


def downgrade() -> None:
    op.drop_table("controller_shards")
