"""The desired route of each service, which the leader makes etcd hold.

Existing deployments get one row per service that has published a route: the route
its running or paused experiment describes, else that of its finished experiment
that published last, at the highest revision any of its experiments published.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOTAL_WEIGHT = 10_000
ACTIVE = ("running", "paused")
# the route state an experiment stands for (experiments.lifecycle.route_state_of), frozen
# here as it was when this migration was written
_RUNNING = {"open": "tripped", "half_open": "half_open"}
_ENDED = {"paused": "paused", "promoted": "promoted", "rolled_back": "rolled_back",
          "aborted": "rolled_back"}


def _route_state(state: str, breaker: str) -> str:
    if state == "running":
        return _RUNNING.get(breaker, "running")
    return _ENDED[state]


def _backfill() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT id, service, state, salt, sticky_header, sticky_cookie, "
            "canary_weight_bp, breaker_state, route_revision FROM experiments "
            "WHERE route_revision > 0 AND state != 'draft' ORDER BY id"
        )
    ).all()
    by_service: dict[str, list[Any]] = {}
    for row in rows:
        by_service.setdefault(row.service, []).append(row)
    now = datetime.now(UTC)
    routes = sa.table(
        "service_routes",
        sa.column("service", sa.String),
        sa.column("experiment_id", sa.Integer),
        sa.column("revision", sa.Integer),
        sa.column("route", sa.JSON),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    for service, candidates in by_service.items():
        active = [r for r in candidates if r.state in ACTIVE]
        owner = active[0] if active else max(candidates, key=lambda r: (r.route_revision, r.id))
        upstreams = dict(
            bind.execute(
                sa.text("SELECT name, upstream FROM variants WHERE experiment_id = :id"),
                {"id": owner.id},
            ).all()
        )
        top = max(r.route_revision for r in candidates)
        route = {
            "experiment": owner.id,
            "revision": top,
            "salt": owner.salt,
            "sticky": {"header": owner.sticky_header, "cookie": owner.sticky_cookie},
            "variants": [
                {"name": "baseline", "upstream": upstreams["baseline"],
                 "weight": TOTAL_WEIGHT - owner.canary_weight_bp},
                {"name": "canary", "upstream": upstreams["canary"],
                 "weight": owner.canary_weight_bp},
            ],
            "state": _route_state(owner.state, owner.breaker_state),
        }
        op.bulk_insert(
            routes,
            [{"service": service, "experiment_id": owner.id, "revision": top,
              "route": json.loads(json.dumps(route)), "updated_at": now}],
        )


def upgrade() -> None:
    op.create_table(
        "service_routes",
        sa.Column("service", sa.String(length=63), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("route", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"],
            name=op.f("fk_service_routes_experiment_id_experiments"),
        ),
        sa.PrimaryKeyConstraint("service", name=op.f("pk_service_routes")),
    )
    op.create_index(
        op.f("ix_service_routes_experiment_id"), "service_routes", ["experiment_id"],
        unique=False,
    )
    _backfill()


def downgrade() -> None:
    op.drop_index(op.f("ix_service_routes_experiment_id"), table_name="service_routes")
    op.drop_table("service_routes")
