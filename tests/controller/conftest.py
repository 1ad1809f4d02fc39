"""The `rig` of the reconciler tests: a leader over its own backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.controller.reconciler import RouteReconciler
from controlplane.db.migrate import upgrade
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.settings import Settings
from controlplane.runtime import open_backends
from tests.support.reconcile_rig import Rig


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
