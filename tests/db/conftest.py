"""The experiment store on both backends, for the store's tests (a module using it
imports the pg_url and sqlite_url fixtures of tests.support.shared_databases)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.db.migrate import upgrade
from controlplane.db.session import Database, make_engine
from controlplane.db.store import SqlExperimentStore
from controlplane.experiments.store import ExperimentStore


@pytest.fixture(params=["postgresql", "sqlite"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ExperimentStore]:
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    database = Database(make_engine(url))
    try:
        yield SqlExperimentStore(database)
    finally:
        database.dispose()
