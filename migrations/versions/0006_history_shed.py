"""History points keep what the sidecars shed: per variant, count and rate.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Points written before this revision read as nothing shed (the columns' default), which
is what a sidecar of that release did: it had no overload protection to shed with.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (("shed", sa.BigInteger), ("shed_rps", sa.REAL))


def upgrade() -> None:
    with op.batch_alter_table("history_points") as batch:
        for prefix in ("b", "c"):
            for name, kind in _COLUMNS:
                batch.add_column(
                    sa.Column(f"{prefix}_{name}", kind(), nullable=False, server_default="0")
                )


def downgrade() -> None:
    with op.batch_alter_table("history_points") as batch:
        for prefix in ("b", "c"):
            for name, _ in _COLUMNS:
                batch.drop_column(f"{prefix}_{name}")
