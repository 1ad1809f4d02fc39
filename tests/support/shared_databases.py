"""Fixtures a test module imports to run on the session's migrated databases
(tests/support/databases.py says why): `from tests.support.shared_databases import
migrated_pg, pg_url, sqlite_url`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.databases import copy_sqlite, emptied, migrated


@pytest.fixture(scope="session")
def migrated_pg(pg_database_url: str) -> str:
    return migrated(pg_database_url)


@pytest.fixture
def pg_url(migrated_pg: str) -> str:
    """Overrides the shared fixture: the session's migrated database, emptied (these
    tests need the schema, not a database of their own)."""
    return emptied(migrated_pg)


@pytest.fixture
def sqlite_url(tmp_path: Path, migrated_sqlite: Path) -> str:
    """Overrides the shared fixture: a copy of the session's migrated SQLite database."""
    return copy_sqlite(migrated_sqlite, tmp_path / "canary.db")
