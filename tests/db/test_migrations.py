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
