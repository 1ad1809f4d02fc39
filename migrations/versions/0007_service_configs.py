"""Breaker rules and overload protection are kept in SQL, as routes are: one desired
config per service and kind, which the leader makes etcd hold.

The configs etcd held before are imported by the first leader of this release, once
(`etcd_imports` records it): a migration cannot reach etcd.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "service_configs",
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("service", sa.String(63), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('rule', 'overload')", name="ck_service_configs_kind"),
        sa.PrimaryKeyConstraint("kind", "service", name="pk_service_configs"),
    )
    op.create_table(
        "etcd_imports",
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("imported", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("kind", name="pk_etcd_imports"),
    )


def downgrade() -> None:
    op.drop_table("etcd_imports")
    op.drop_table("service_configs")
