"""The `rig` of the reconciler tests: a leader over its own backends.

The PostgreSQL cases share the session's migrated database, emptied before each
test (tests/support/databases.py), instead of creating and migrating one a case.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.controller.reconciler import RouteReconciler
from controlplane.db.migrate import upgrade
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.settings import Settings
from controlplane.runtime import open_backends
from tests.support.databases import emptied, migrated
from tests.support.reconcile_rig import Rig


@pytest.fixture(scope="session")
def migrated_pg(pg_database_url: str) -> str:
    return migrated(pg_database_url)


@pytest.fixture
def pg_url(migrated_pg: str) -> str:
    """Overrides the shared fixture: the session's migrated database, emptied."""
    return emptied(migrated_pg)


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    upgrade(backend_settings.database_url)
    clock = FakeClock()
    backends = await open_backends(backend_settings, clock=clock, streams=False)
    leadership = backends.kv.leadership(backends.keys.election, identity="leader", ttl=3600)
    fence = await leadership.campaign()
    try:
        yield Rig(backends, clock, fence, RouteReconciler())
    finally:
        await leadership.resign()
        await backends.close()
