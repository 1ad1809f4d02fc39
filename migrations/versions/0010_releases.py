"""A service has a stable version and a release history; a variant may carry a label;
an experiment may follow its service's stable version as its baseline.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

Each service that already has a desired route gets the stable version that route
stands for: a promoted route's canary, else its baseline (a running experiment's
baseline is what serves the service outside its canary share). No history is made
up for the releases before this revision.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("variants", sa.Column("version", sa.String(64), nullable=True))
    op.add_column(
        "experiments",
        sa.Column("baseline_follows_stable", sa.Boolean(), nullable=False,
                  server_default=sa.text("false")),
    )
    stable = op.create_table(
        "stable_versions",
        sa.Column("service", sa.String(63), nullable=False),
        sa.Column("upstream", sa.String(2048), nullable=False),
        sa.Column("label", sa.String(64), nullable=True),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_stable_versions_experiment_id_experiments"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("service", name=op.f("pk_stable_versions")),
    )
    op.create_table(
        "releases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("service", sa.String(63), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("from_upstream", sa.String(2048), nullable=True),
        sa.Column("from_label", sa.String(64), nullable=True),
        sa.Column("to_upstream", sa.String(2048), nullable=False),
        sa.Column("to_label", sa.String(64), nullable=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "kind IN ('seeded', 'rebased', 'promoted', 'rolled_back', 'aborted')",
            name=op.f("ck_releases_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_releases_experiment_id_experiments"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_releases")),
    )
    op.create_index(op.f("ix_releases_experiment_id"), "releases", ["experiment_id"])
    op.create_index("ix_releases_service_id", "releases", ["service", "id"])
    _seed_stable_versions(stable)


def _stable_upstream(route: Any) -> str | None:
    """The upstream a stored route stands for as its service's stable version."""
    if not isinstance(route, dict):
        return None
    variants = {
        v.get("name"): v for v in route.get("variants", ()) if isinstance(v, dict)
    }
    name = "canary" if route.get("state") == "promoted" and "canary" in variants else "baseline"
    upstream = variants.get(name, {}).get("upstream")
    return upstream if isinstance(upstream, str) else None


def _seed_stable_versions(stable: sa.Table) -> None:
    bind = op.get_bind()
    routes = sa.table(
        "service_routes",
        sa.column("service", sa.String),
        sa.column("experiment_id", sa.Integer),
        sa.column("route", sa.JSON),
    )
    now = datetime.now(UTC)
    rows = []
    for service, experiment_id, route in bind.execute(
        sa.select(routes.c.service, routes.c.experiment_id, routes.c.route)
    ):
        upstream = _stable_upstream(route)
        if upstream is not None:
            rows.append({"service": service, "upstream": upstream, "label": None,
                         "experiment_id": experiment_id, "since": now, "version": 1})
    if rows:
        op.bulk_insert(stable, rows)


def downgrade() -> None:
    op.drop_index("ix_releases_service_id", table_name="releases")
    op.drop_index(op.f("ix_releases_experiment_id"), table_name="releases")
    op.drop_table("releases")
    op.drop_table("stable_versions")
    with op.batch_alter_table("variants") as batch:
        batch.drop_column("version")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("baseline_follows_stable")
