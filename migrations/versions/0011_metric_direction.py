"""A provider metric's history points say which change is bad, so that merging them
keeps what a plot against the bound must not hide: troughs for a metric guarding
against a fall.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

Rows written before this revision read as `increase`, the direction they were merged
for.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("history_metric_points") as batch:
        batch.add_column(
            sa.Column("direction", sa.String(8), nullable=False, server_default="increase")
        )


def downgrade() -> None:
    with op.batch_alter_table("history_metric_points") as batch:
        batch.drop_column("direction")
