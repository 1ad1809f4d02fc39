"""The leader rides out a backend outage on its lease; only a lost fence deposes it.

The in-process store and SQLite; the reconciler fails on cue as it would when an
etcd member is lost mid-write.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controlplane.controller.reconciler import RouteReconciler
from controlplane.controller.runner import Controller
from controlplane.db.migrate import upgrade
from controlplane.kernel.errors import BackendError, BackendUnavailable, NotLeader
from controlplane.kernel.kv import Fence
from controlplane.kernel.settings import Settings
from controlplane.runtime import Backends, open_backends


@dataclass
class FailingReconciler(RouteReconciler):
    """Fails each run with the next error in `failures`, then reconciles as usual."""

    failures: list[BackendError] = field(default_factory=list)
    fences: list[Fence | None] = field(default_factory=list)

    async def run(self, backends: Backends, fence: Fence | None) -> None:
        self.fences.append(fence)
        if self.failures:
            raise self.failures.pop(0)
        await super().run(backends, fence)


@pytest.fixture
async def backends(tmp_path: Path, etcd_prefix: str) -> AsyncIterator[Backends]:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/canary.db", etcd="memory://",
                        etcd_prefix=etcd_prefix, redis_url="memory://")
    upgrade(settings.database_url)
    opened = await open_backends(settings)
    yield opened
    await opened.close()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def run_with(backends: Backends, failures: list[BackendError]) -> Controller:
    reconciler = FailingReconciler(failures=list(failures))
    controller = Controller(identity="one", reconciler=reconciler, outage_pause=0.01)
    await controller.start(backends)
    try:
        # the reconciler runs again once every failure was spent
        await until(lambda: len(reconciler.fences) > len(failures))
        await until(lambda: controller.stats.leader)
    finally:
        await controller.stop()
    return controller


async def test_an_unreachable_backend_is_ridden_out_on_the_same_fence(
    backends: Backends,
) -> None:
    controller = await run_with(backends, [BackendUnavailable("etcd put: no answer")] * 2)
    reconciler = controller.reconciler
    assert isinstance(reconciler, FailingReconciler)
    assert controller.stats.terms == 1
    assert controller.stats.outages_ridden == 2
    assert len(set(reconciler.fences)) == 1


@pytest.mark.parametrize("error", [NotLeader("fence gone"), BackendError("etcd: INTERNAL")])
async def test_a_lost_fence_or_a_hard_error_still_steps_down(
    backends: Backends, error: BackendError
) -> None:
    controller = await run_with(backends, [error])
    reconciler = controller.reconciler
    assert isinstance(reconciler, FailingReconciler)
    assert controller.stats.terms == 2
    assert controller.stats.outages_ridden == 0
    assert len(set(reconciler.fences)) == 2
