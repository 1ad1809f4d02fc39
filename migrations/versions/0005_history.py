"""The plots' history: one row per experiment and second of judged windows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _variant_columns(prefix: str) -> list[sa.Column[object]]:
    return [
        sa.Column(f"{prefix}_count", sa.BigInteger(), nullable=False),
        sa.Column(f"{prefix}_rps", sa.REAL(), nullable=False),
        sa.Column(f"{prefix}_failure_ratio", sa.REAL(), nullable=False),
        sa.Column(f"{prefix}_p50_ms", sa.REAL(), nullable=True),
        sa.Column(f"{prefix}_p95_ms", sa.REAL(), nullable=True),
        sa.Column(f"{prefix}_p99_ms", sa.REAL(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "history_points",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("span_sec", sa.Integer(), nullable=False),
        sa.Column("window_sec", sa.Integer(), nullable=False),
        sa.Column("canary_weight_bp", sa.Integer(), nullable=False),
        sa.Column("threshold_ms", sa.REAL(), nullable=True),
        sa.Column("failure_bound", sa.REAL(), nullable=True),
        *_variant_columns("b"),
        *_variant_columns("c"),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_history_points_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", "at", name=op.f("pk_history_points")),
    )


def downgrade() -> None:
    op.drop_table("history_points")
