"""The plots' history keeps the rules' provider metrics: one row per metric per reading.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06

Experiments judged before this revision have no metric rows: their rules had no
provider metrics to read.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "history_metric_points",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("span_sec", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("compare", sa.String(16), nullable=False),
        sa.Column("b_value", sa.REAL(), nullable=True),
        sa.Column("c_value", sa.REAL(), nullable=True),
        sa.Column("bound", sa.REAL(), nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_history_metric_points_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "experiment_id", "name", "at", name=op.f("pk_history_metric_points")
        ),
    )


def downgrade() -> None:
    op.drop_table("history_metric_points")
