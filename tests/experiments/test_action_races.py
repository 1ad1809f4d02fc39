"""A user's action meeting a row the controller has just saved is judged again on the
row as it now is, instead of failing with a conflict the user can do nothing about."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from controlplane.db.migrate import upgrade
from controlplane.experiments.actions import ACTION_ATTEMPTS, apply_action, create_experiment
from controlplane.experiments.lifecycle import ExperimentState, LifecycleAction
from controlplane.experiments.store import ExperimentSpec, ExperimentStore, StepSpec
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import RevisionConflict
from controlplane.kernel.settings import Settings
from controlplane.runtime import open_backends

SPEC = ExperimentSpec(
    name="checkout v2",
    service="checkout",
    baseline_upstream="http://127.0.0.1:9001",
    canary_upstream="http://127.0.0.1:9002",
    steps=(StepSpec(1000, 30), StepSpec(10000, 30)),
    sticky_header="x-user-id",
    sticky_cookie=None,
    rule=None,
)


class RacedStore:
    """The real store, where another writer (as the controller would) saves the
    experiment between the action's read and its write, `races` times."""

    def __init__(self, store: ExperimentStore, races: int) -> None:
        self.store = store
        self.races = races

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self.store.transaction() as tx:
            yield _RacedTransaction(self, tx)

    async def race(self, experiment_id: int) -> None:
        # a committed write of the row by someone else: its version moves on
        async with self.store.transaction() as other:
            row = await other.load_experiment(experiment_id=experiment_id)
            moved = replace(row, updated_at=row.updated_at + timedelta(milliseconds=250))
            await other.save_state(experiment=moved)


class _RacedTransaction:
    def __init__(self, outer: RacedStore, tx: Any) -> None:
        self._outer = outer
        self._tx = tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    async def load_experiment(self, *, experiment_id: int) -> Any:
        row = await self._tx.load_experiment(experiment_id=experiment_id)
        if self._outer.races > 0:
            self._outer.races -= 1
            await self._outer.race(experiment_id)
        return row


@pytest.fixture
async def started(pg_url: str, etcd_prefix: str) -> AsyncIterator[tuple[Any, int]]:
    # PostgreSQL only: SQLite serialises writers, so no write can come in between
    settings = Settings(database_url=pg_url, etcd="memory://", etcd_prefix=etcd_prefix,
                        redis_url="memory://")  # fmt: skip
    upgrade(settings.database_url)
    backends = await open_backends(settings, clock=FakeClock())
    try:
        experiment = await create_experiment(
            store=backends.store, clock=FakeClock(), spec=SPEC, actor="user:test"
        )
        await apply_action(
            store=backends.store, changes=backends.route_changes, clock=FakeClock(),
            experiment_id=experiment.id, action=LifecycleAction.START, actor="user:test",
        )  # fmt: skip
        yield backends, experiment.id
    finally:
        await backends.close()


async def test_an_action_raced_by_a_save_is_judged_again_and_lands(
    started: tuple[Any, int],
) -> None:
    backends, experiment_id = started
    store = RacedStore(backends.store, races=2)
    after = await apply_action(
        store=store, changes=backends.route_changes, clock=FakeClock(),  # type: ignore[arg-type]
        experiment_id=experiment_id, action=LifecycleAction.ROLLBACK, actor="user:ops",
    )  # fmt: skip
    assert store.races == 0  # both races happened, and the third attempt committed
    assert after.state is ExperimentState.ROLLED_BACK


async def test_an_action_raced_every_time_reports_the_conflict(started: tuple[Any, int]) -> None:
    backends, experiment_id = started
    store = RacedStore(backends.store, races=ACTION_ATTEMPTS)
    with pytest.raises(RevisionConflict):
        await apply_action(
            store=store, changes=backends.route_changes, clock=FakeClock(),  # type: ignore[arg-type]
            experiment_id=experiment_id, action=LifecycleAction.ROLLBACK, actor="user:ops",
        )  # fmt: skip
    async with backends.store.transaction() as tx:
        row = await tx.load_experiment(experiment_id=experiment_id)
    assert row.state is ExperimentState.RUNNING
