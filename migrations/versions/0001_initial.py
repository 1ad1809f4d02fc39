"""Experiments, variants, steps and the events audit trail.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE = sa.text("state IN ('running', 'paused')")


def utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("service", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("salt", sa.String(length=64), nullable=False),
        sa.Column("sticky_header", sa.String(length=128), nullable=True),
        sa.Column("sticky_cookie", sa.String(length=128), nullable=True),
        sa.Column("rule", sa.JSON(), nullable=True),
        sa.Column("current_step", sa.Integer(), nullable=False),
        sa.Column("canary_weight_bp", sa.Integer(), nullable=False),
        sa.Column("breaker_state", sa.String(length=16), nullable=False),
        sa.Column("trips", sa.Integer(), nullable=False),
        sa.Column("step_started_at", utc(), nullable=True),
        sa.Column("breaker_changed_at", utc(), nullable=True),
        sa.Column("route_revision", sa.Integer(), nullable=False),
        sa.Column("rollout_state", sa.JSON(), nullable=True),
        sa.Column("created_at", utc(), nullable=False),
        sa.Column("updated_at", utc(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "breaker_state IN ('closed', 'open', 'half_open')",
            name=op.f("ck_experiments_breaker_state"),
        ),
        sa.CheckConstraint(
            "state IN ('draft', 'running', 'paused', 'promoted', 'rolled_back', 'aborted')",
            name=op.f("ck_experiments_state"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
    )
    op.create_index(op.f("ix_experiments_service"), "experiments", ["service"])
    op.create_index(op.f("ix_experiments_state"), "experiments", ["state"])
    op.create_index(
        "uq_experiments_active_service",
        "experiments",
        ["service"],
        unique=True,
        postgresql_where=ACTIVE,
        sqlite_where=ACTIVE,
    )

    op.create_table(
        "variants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("upstream", sa.String(length=2048), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_variants_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_variants")),
        sa.UniqueConstraint(
            "experiment_id", "name", name=op.f("uq_variants_experiment_id_name")
        ),
    )
    op.create_index(op.f("ix_variants_experiment_id"), "variants", ["experiment_id"])

    op.create_table(
        "steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("weight_bp", sa.Integer(), nullable=False),
        sa.Column("hold_sec", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "weight_bp > 0 AND weight_bp <= 10000", name=op.f("ck_steps_weight_bp")
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_steps_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint(
            "experiment_id", "position", name=op.f("uq_steps_experiment_id_position")
        ),
    )
    op.create_index(op.f("ix_steps_experiment_id"), "steps", ["experiment_id"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("service", sa.String(length=63), nullable=False),
        sa.Column("at", utc(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_events_experiment_id_experiments"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_experiment_id"), "events", ["experiment_id"])
    op.create_index("ix_events_service_at", "events", ["service", "at"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("steps")
    op.drop_table("variants")
    op.drop_index("uq_experiments_active_service", table_name="experiments")
    op.drop_table("experiments")
