"""The migrations build the models' schema on both databases, and undo it."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from controlplane.db import migrate
from controlplane.db.models import Base
from controlplane.db.session import make_engine

TABLES = {
    "experiments", "variants", "steps", "events", "api_tokens", "service_routes",
    "notification_subscriptions", "notification_deliveries", "history_points",
    "history_metric_points", "stable_versions", "releases", "rollout_evidence",
}


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_database(request: pytest.FixtureRequest) -> str:
    fixture = "pg_url" if request.param == "postgresql" else "sqlite_url"
    url: str = request.getfixturevalue(fixture)
    return url


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_creates_every_table_on_an_empty_database(empty_database: str) -> None:
    assert migrate.current(empty_database) is None
    migrate.upgrade(empty_database)
    assert table_names(empty_database) >= TABLES
    assert migrate.current(empty_database) == migrate.head(empty_database)


def test_models_and_migrations_agree(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    engine = make_engine(empty_database)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_downgrade_base_removes_every_table(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    migrate.downgrade(empty_database, "base")
    assert table_names(empty_database) & TABLES == set()
    assert migrate.current(empty_database) is None
    migrate.upgrade(empty_database)  # and up again from base
    assert table_names(empty_database) >= TABLES


def test_replicas_upgrading_together_wait_for_each_other(pg_url: str) -> None:
    """Three processes start on an empty PostgreSQL database at once: one migrates,
    the others wait on the migration lock and find the schema current (without the
    lock, two of them create the same tables and one fails)."""
    import subprocess
    import sys

    code = "import sys; from controlplane.db import migrate; migrate.upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, pg_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(3)
    ]
    results = [(proc.communicate(timeout=120)[1].decode(), proc.returncode) for proc in procs]
    assert [code for _, code in results] == [0, 0, 0], [err[-600:] for err, _ in results]
    assert migrate.current(pg_url) == migrate.head(pg_url)
    assert table_names(pg_url) >= TABLES


def _route(service: str, state: str, canary_bp: int) -> dict[str, object]:
    return {
        "experiment": 1, "revision": 3, "salt": "s", "sticky": {"header": "x-user-id"},
        "variants": [
            {"name": "baseline", "upstream": f"http://{service}-v1:8080",
             "weight": 10_000 - canary_bp},
            {"name": "canary", "upstream": f"http://{service}-v2:8080", "weight": canary_bp},
        ],
        "state": state,
    }  # fmt: skip


def test_upgrading_gives_each_routed_service_the_stable_version_its_route_stands_for(
    empty_database: str,
) -> None:
    """Routes committed before 0010: a promoted one stands for its canary, any other for
    its baseline (a running experiment's baseline serves the rest of the traffic)."""
    import json
    from datetime import UTC, datetime

    from sqlalchemy import text

    migrate.upgrade(empty_database, "0009")
    at = datetime(2026, 12, 1, tzinfo=UTC)
    engine = make_engine(empty_database)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO experiments (id, name, service, state, salt, current_step, "
                     "canary_weight_bp, breaker_state, trips, route_revision, created_at, "
                     "updated_at, version) VALUES (1, 'x', 'shop', 'promoted', 's', 0, 10000, "
                     "'closed', 0, 3, :at, :at, 1)"),
                {"at": at},
            )  # fmt: skip
            for service, state, canary_bp in [
                ("shop", "promoted", 10_000), ("cart", "rolled_back", 0), ("pay", "running", 500)
            ]:
                conn.execute(
                    text("INSERT INTO service_routes (service, experiment_id, revision, route, "
                         "updated_at) VALUES (:service, 1, 3, :route, :at)"),
                    {"service": service, "route": json.dumps(_route(service, state, canary_bp)),
                     "at": at},
                )  # fmt: skip
        migrate.upgrade(empty_database)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT service, upstream, label, experiment_id FROM stable_versions "
                     "ORDER BY service")
            ).all()
            history = conn.execute(text("SELECT count(*) FROM releases")).scalar()
            follows = conn.execute(
                text("SELECT baseline_follows_stable FROM experiments")
            ).scalar()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [
        ("cart", "http://cart-v1:8080", None, 1),
        ("pay", "http://pay-v1:8080", None, 1),
        ("shop", "http://shop-v2:8080", None, 1),
    ]
    assert history == 0  # no history is made up
    assert not follows
