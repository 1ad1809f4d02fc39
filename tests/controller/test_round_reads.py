"""A round reads in full only the rows that moved, and writes its memory at the
version it read (decision 0059): on PostgreSQL + etcd + Redis, then SQLite + memory."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from controlplane.benchmarks.scale import _create
from controlplane.controller.apply import decided_state
from controlplane.controller.runner import Controller, board_snapshots
from controlplane.db.migrate import upgrade
from controlplane.decision.model import Step
from controlplane.decision.rollout import start
from controlplane.experiments.actions import apply_action
from controlplane.experiments.lifecycle import ACTIVE, ExperimentState, LifecycleAction
from controlplane.experiments.store import ExperimentRecord, ShardSelection
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import CodecError
from controlplane.kernel.settings import Settings
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.runtime import Backends, open_backends


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    controller: Controller
    ids: list[int]

    async def round(self) -> None:
        self.clock.advance(0.25)
        await self.controller.evaluate_all(self.backends, None)

    async def stored(self) -> dict[int, ExperimentRecord]:
        async with self.backends.store.transaction() as tx:
            found, _ = await tx.list_experiments()
        return {r.id: r for r in found}

    async def bump(self, experiment_id: int) -> None:
        """What any other writer does to the row: a new version."""

        def write(*, session: Session) -> None:
            session.execute(
                text("UPDATE experiments SET version = version + 1 WHERE id = :id"),
                {"id": experiment_id},
            )

        async with self.backends.database.transaction() as tx:
            await tx.run(write)


async def _rig(settings: Settings, *, streams: bool) -> AsyncIterator[Rig]:
    upgrade(settings.database_url)
    clock = FakeClock()
    backends = await open_backends(settings, clock=clock, streams=streams)
    try:
        ids = [int(e) for e, _ in await _create(backends, 4, False)]
        controller = Controller(identity="rounds")
        await controller.open(backends)
        try:
            yield Rig(backends, clock, controller, ids)
        finally:
            await controller.stop()
    finally:
        await backends.close()


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    async for made in _rig(backend_settings, streams=False):
        yield made


@pytest.fixture
async def fed(backend_settings: Settings) -> AsyncIterator[Rig]:
    """`rig` with a stats board, which `_publish` feeds."""
    async for made in _rig(backend_settings, streams=True):
        yield made


def _without_memory(record: ExperimentRecord) -> ExperimentRecord:
    return replace(record, rollout_state=None)


async def _assert_held_as_stored(rig: Rig) -> None:
    """What the controller holds is what a full read of the active rows gives."""
    stored = {i: r for i, r in (await rig.stored()).items() if r.state in ACTIVE}
    held = {r.id: r for r in rig.controller.known_rows.records()}
    assert held.keys() == stored.keys()
    for experiment_id, record in held.items():
        row = stored[experiment_id]
        assert _without_memory(record) == _without_memory(row)
        assert json.loads(json.dumps(record.rollout_state)) == row.rollout_state


async def test_rows_are_read_again_only_when_another_writer_moved_them(rig: Rig) -> None:
    await rig.round()
    assert rig.controller.stats.rows_loaded == 4
    await _assert_held_as_stored(rig)
    written = rig.controller.stats.decisions_applied
    assert written == 4  # every first look writes the rollout's memory
    for _ in range(3):
        await rig.round()
        await _assert_held_as_stored(rig)
    # its own writes did not make it read a row again
    assert rig.controller.stats.rows_loaded == 4

    paused = rig.ids[0]
    await apply_action(
        store=rig.backends.store, changes=rig.backends.route_changes, clock=rig.clock,
        experiment_id=paused, action=LifecycleAction.PAUSE, actor="test",
    )  # fmt: skip
    evaluations = rig.controller.stats.evaluations
    await rig.round()
    assert rig.controller.stats.rows_loaded == 5
    # the pause is seen in the very next round: that experiment is not judged
    assert rig.controller.stats.evaluations == evaluations + 3
    await _assert_held_as_stored(rig)


async def test_a_row_that_moved_during_the_round_is_not_written_and_is_decided_again(
    rig: Rig,
) -> None:
    moved = rig.ids[1]
    bumped: list[str] = []

    async def read_and_bump(
        backends: Backends, experiment: str, window_sec: int
    ) -> Mapping[str, WindowSnapshot]:
        # between the round's read of the rows and its memory commit
        if experiment == str(moved) and not bumped:
            bumped.append(experiment)
            await rig.bump(moved)
        return await board_snapshots(backends, experiment, window_sec)

    rig.controller.snapshot_reader = read_and_bump
    before = await rig.stored()
    await rig.round()
    after = await rig.stored()
    assert rig.controller.stats.conflicts == 1
    assert after[moved].rollout_state is None
    assert after[moved].version == before[moved].version + 1
    for other in set(rig.ids) - {moved}:
        assert after[other].rollout_state is not None
        assert after[other].version == before[other].version + 1

    await rig.round()
    again = await rig.stored()
    assert again[moved].rollout_state is not None
    assert again[moved].version == after[moved].version + 1
    await _assert_held_as_stored(rig)


async def test_save_states_writes_what_save_state_writes(rig: Rig) -> None:
    """The round's UPDATE at the version read, against the ORM's write it replaced:
    two experiments alike, one saved each way, read back alike."""
    first, second = (await rig.stored())[rig.ids[2]], (await rig.stored())[rig.ids[3]]
    decision = start((Step(1, 60),), 100.0)
    moment = datetime.fromtimestamp(rig.clock.now(), UTC)
    async with rig.backends.store.transaction() as tx:
        by_orm = await tx.save_state(experiment=decided_state(first, decision, moment))
    async with rig.backends.store.transaction() as tx:
        (by_update,) = await tx.save_states(
            experiments=[decided_state(second, decision, moment)]
        )
    assert by_update is not None
    stored = await rig.stored()

    def comparable(record: ExperimentRecord) -> dict[str, Any]:
        fields = dict(record.__dict__)
        for own in ("id", "name", "service", "salt", "created_at", "route_revision"):
            fields.pop(own)
        return fields

    assert comparable(stored[first.id]) == comparable(stored[second.id])
    assert comparable(by_update) == comparable(by_orm)
    assert stored[second.id].version == second.version + 1

    # the same record again: its version is gone, nothing is written
    async with rig.backends.store.transaction() as tx:
        (stale,) = await tx.save_states(experiments=[decided_state(second, decision, moment)])
    assert stale is None
    assert (await rig.stored())[second.id] == stored[second.id]


@pytest.mark.parametrize("count", [1, 2, 3])
async def test_versions_list_the_same_experiments_as_the_full_listing(
    rig: Rig, count: int
) -> None:
    await apply_action(
        store=rig.backends.store, changes=rig.backends.route_changes, clock=rig.clock,
        experiment_id=rig.ids[0], action=LifecycleAction.ROLLBACK, actor="test",
    )  # fmt: skip
    for chosen in ({0}, set(range(count)), set()):
        selection = ShardSelection(count=count, shards=frozenset(chosen))
        async with rig.backends.store.transaction() as tx:
            full, _ = await tx.list_experiments(states=ACTIVE, shards=selection)
            versions = await tx.list_versions(states=ACTIVE, shards=selection)
            loaded = await tx.load_experiments(ids=[v.id for v in versions])
        assert [(e.id, e.version) for e in full] == [(v.id, v.version) for v in versions]
        assert sorted(loaded, key=lambda e: -e.id) == full
        assert all(e.state is not ExperimentState.ROLLED_BACK for e in loaded)


async def test_an_unforeseen_error_of_one_experiment_leaves_the_others_judged(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    poisoned = rig.ids[2]

    async def read_or_fail(
        backends: Backends, experiment: str, window_sec: int
    ) -> Mapping[str, WindowSnapshot]:
        if experiment == str(poisoned):
            raise RuntimeError("no check foresaw this")
        return await board_snapshots(backends, experiment, window_sec)

    rig.controller.snapshot_reader = read_or_fail
    before = await rig.stored()
    with caplog.at_level(logging.ERROR, logger="controlplane.controller.runner"):
        await rig.round()
        await rig.round()
    after = await rig.stored()
    assert rig.controller.stats.unexpected_errors == 2
    assert after[poisoned].version == before[poisoned].version
    for other in set(rig.ids) - {poisoned}:
        assert after[other].rollout_state is not None
    # the trace once, not at every round
    logged = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


async def test_an_experiment_that_cannot_be_evaluated_is_counted_each_round_logged_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged stats hash (decision 0075: a head that does not read) stays damaged
    round after round: each look is counted, the warning written once a minute."""
    damaged = rig.ids[1]

    async def read_or_refuse(
        backends: Backends, experiment: str, window_sec: int
    ) -> Mapping[str, WindowSnapshot]:
        if experiment == str(damaged):
            raise CodecError(f"experiment {experiment}: a partial window in the stats "
                             "hash is malformed (the head @part:c9 does not read)")  # fmt: skip
        return await board_snapshots(backends, experiment, window_sec)

    rig.controller.snapshot_reader = read_or_refuse
    errors = rig.controller.stats.errors
    before = await rig.stored()
    with caplog.at_level(logging.WARNING, logger="controlplane.controller.runner"):
        for _ in range(3):
            await rig.round()
    assert rig.controller.stats.errors - errors == 3
    assert (await rig.stored())[damaged].version == before[damaged].version
    logged = [r for r in caplog.records if "not evaluated" in r.getMessage()]
    assert len(logged) == 1 and "@part:c9" in logged[0].getMessage()
    rig.clock.advance(61.0)  # a minute on: written again
    with caplog.at_level(logging.WARNING, logger="controlplane.controller.runner"):
        await rig.round()
    assert len([r for r in caplog.records if "not evaluated" in r.getMessage()]) == 2


async def _publish(rig: Rig, windows: dict[int, Any], ledgers: dict[int, Any]) -> None:
    """A second of samples to every experiment, published as a collector does."""
    import numpy as np

    from controlplane.benchmarks.round import _batch
    from controlplane.collector.second_partials import export_head_and_seconds
    from controlplane.collector.sharding import part_field

    assert rig.backends.board is not None
    now = rig.clock.now()
    fields = {}
    for experiment_id, window in windows.items():
        window.record(_batch(np.random.default_rng(experiment_id), 50, now), now)
        fields[str(experiment_id)] = export_head_and_seconds(
            window, now, head=part_field("c1"), collector="c1", unacked=[],
            ledger=ledgers[experiment_id],
        )  # fmt: skip
        ledgers[experiment_id].sent()
    await rig.backends.board.write_many(fields)


async def test_a_look_that_moves_only_the_snapshot_time_is_kept_not_written(
    fed: Rig,
) -> None:
    """A window built at the look's instant is newer at every look: such a look is
    remembered by the controller and the next one starts from it, but the row is not
    written (decision 0077); a row read again starts from what it stores."""
    from controlplane.collector.second_partials import SlotLedger
    from controlplane.collector.windows import ExperimentWindow, WindowConfig
    from controlplane.controller import runner
    from controlplane.decision.model import RolloutState

    t0 = fed.clock.now()
    windows = {
        i: ExperimentWindow(str(i), WindowConfig(10, 250.0), clock_now=t0 - 12, seed=1)
        for i in fed.ids
    }
    ledgers = {i: SlotLedger() for i in fed.ids}
    judged: list[tuple[int, RolloutState]] = []
    decide = runner.decide

    def seen(
        state: RolloutState, snapshots: Mapping[str, WindowSnapshot], *args: Any, **kwargs: Any
    ) -> Any:
        judged.append((int(snapshots["canary"].experiment), state))
        return decide(state, snapshots, *args, **kwargs)

    runner.decide = seen  # type: ignore[assignment]
    try:
        for _ in range(3):
            fed.clock.advance(1.0)
            await _publish(fed, windows, ledgers)
            await fed.round()
        written = await fed.stored()
        applied = fed.controller.stats.decisions_applied
        kept = fed.controller.stats.looks_kept
        judged.clear()
        for _ in range(3):  # the same second, looked at again at later instants
            await fed.round()
        assert fed.controller.stats.decisions_applied == applied
        assert fed.controller.stats.looks_kept == kept + 3 * len(fed.ids)
        assert await fed.stored() == written  # no version moved, nothing rewritten
        # each look started from the one before it, not from the row
        for experiment_id in fed.ids:
            times = [s.last_snapshot_ts for i, s in judged if i == experiment_id]
            assert times[0] is not None
            assert times == [times[0], times[0] + 0.25, times[0] + 0.5]
            stored = (written[experiment_id].rollout_state or {})["last_snapshot_ts"]
            assert stored < times[0]  # the first look's, the only one written
        last = times[-1]
        # another writer moves a row: it is read again, and judged from what it stores
        await fed.bump(fed.ids[0])
        judged.clear()
        await fed.round()
        moved = {i: s.last_snapshot_ts for i, s in judged}
        assert moved.pop(fed.ids[0]) == (written[fed.ids[0]].rollout_state or {})[
            "last_snapshot_ts"
        ]
        assert list(moved.values()) == [last + 0.25] * (len(fed.ids) - 1)
        await _assert_held_as_stored(fed)
    finally:
        runner.decide = decide  # type: ignore[assignment]
