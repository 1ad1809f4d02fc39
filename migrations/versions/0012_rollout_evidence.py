"""The step's evidence of each rollout memory in a table of its own, written when it
changes rather than at every look.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

Rows written before this revision keep their whole memory in
`experiments.rollout_state` and read as written; the controller's next write splits
them. A downgrade folds the evidence back into `rollout_state` first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout_evidence",
        sa.Column("experiment_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name="fk_rollout_evidence_experiment_id_experiments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", name="pk_rollout_evidence"),
    )


def downgrade() -> None:
    bind = op.get_bind()
    evidence = sa.table(
        "rollout_evidence", sa.column("experiment_id", sa.Integer()), sa.column("body", sa.JSON())
    )
    experiments = sa.table(
        "experiments", sa.column("id", sa.Integer()), sa.column("rollout_state", sa.JSON())
    )
    rows = bind.execute(
        sa.select(evidence.c.experiment_id, evidence.c.body, experiments.c.rollout_state).join(
            experiments, experiments.c.id == evidence.c.experiment_id
        )
    ).all()
    for experiment_id, body, look in rows:
        if look is None:
            continue
        body = json.loads(body) if isinstance(body, str) else body
        look = json.loads(look) if isinstance(look, str) else look
        bind.execute(
            experiments.update()
            .where(experiments.c.id == experiment_id)
            .values(rollout_state={**body, **look})
        )
    op.drop_table("rollout_evidence")
