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
from controlplane.kernel.tasks import cancel_and_wait
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


class LosesOneCancellation(Controller):
    """A round that loses its first cancellation, as redis-py's client has at the
    edge of one of its own timeouts, and carries on."""

    entered: asyncio.Event
    lost_once = False

    async def evaluate_all(self, backends: Backends, fence: Fence | None) -> float | None:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.lost_once:
                raise
            self.lost_once = True
        return None


async def test_a_deposed_lead_ends_even_when_a_round_loses_its_cancellation(
    backends: Backends,
) -> None:
    controller = LosesOneCancellation(identity="one", reconciler=RouteReconciler())
    controller.entered = asyncio.Event()
    leadership = backends.kv.leadership(backends.keys.election, identity="one", ttl=5)
    fence = await leadership.campaign()
    leading = asyncio.create_task(controller._lead_until_lost(backends, fence, leadership))
    await asyncio.wait_for(controller.entered.wait(), timeout=30)
    await leadership.resign()  # the lease is gone: the lead must end
    # a hang guard, not a speed claim: before, the replica waited for the lead for ever
    # (wait_for would not do: the old code swallowed its cancellation too)
    done, _ = await asyncio.wait({leading}, timeout=30)
    if not done:
        await cancel_and_wait(leading)
    assert done, "the lead outlived its lease"
    assert controller.lost_once
    leading.result()
