"""The SQL experiment store on PostgreSQL and SQLite: one unit of work per block,
typed records out, stale writes refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import ACTIVE, BreakerState, ExperimentState
from controlplane.experiments.store import ExperimentSpec, ExperimentStore, StepSpec
from controlplane.kernel.errors import NotFound, RevisionConflict
from controlplane.kernel.routes import RouteState
from tests.support.shared_databases import migrated_pg, pg_url, sqlite_url  # noqa: F401

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def spec(service: str = "checkout", name: str = "v2") -> ExperimentSpec:
    return ExperimentSpec(
        name=name, service=service, baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002",
        steps=(StepSpec(500, 30), StepSpec(2500, 60)),
        sticky_header="x-user-id", sticky_cookie=None, rule=None,
    )


class Boom(Exception):
    pass



async def test_a_record_comes_back_typed_with_its_spec(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        created = await tx.create_experiment(spec=spec(), salt="s", now=NOW)
    async with store.transaction() as tx:
        loaded = await tx.load_experiment(experiment_id=created.id)
    assert loaded == created
    assert loaded.state is ExperimentState.DRAFT
    assert loaded.breaker_state is BreakerState.CLOSED
    assert loaded.spec == spec()
    assert [s.position for s in loaded.steps] == [0, 1]


async def test_a_failed_block_leaves_nothing(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        draft = await tx.create_experiment(spec=spec(), salt="s", now=NOW)
    with pytest.raises(Boom):
        async with store.transaction() as tx:
            running = replace(draft, state=ExperimentState.RUNNING, current_step=0)
            saved = await tx.save_state(experiment=running)
            await tx.save_desired_route(experiment=saved, canary_bp=500,
                                        state=RouteState.RUNNING, now=NOW)
            await tx.append_event(service="checkout", at=NOW, actor="t", kind=EventKind.START,
                                  experiment_id=draft.id)
            raise Boom
    async with store.transaction() as tx:
        after = await tx.load_experiment(experiment_id=draft.id)
        events, total = await tx.list_events(experiment_id=draft.id)
    assert after == draft
    assert (list(events), total) == ([], 0)


async def test_a_write_from_a_stale_read_is_refused(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        draft = await tx.create_experiment(spec=spec(), salt="s", now=NOW)
    async with store.transaction() as tx:
        moved = await tx.save_state(experiment=replace(draft, trips=1))
    assert moved.version > draft.version
    with pytest.raises(RevisionConflict):
        async with store.transaction() as tx:
            await tx.save_state(experiment=replace(draft, trips=7))
    async with store.transaction() as tx:
        assert (await tx.load_experiment(experiment_id=draft.id)).trips == 1


async def test_desired_routes_take_growing_revisions(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        draft = await tx.create_experiment(spec=spec(), salt="s", now=NOW)
        first, noted = await tx.save_desired_route(experiment=draft, canary_bp=500,
                                                   state=RouteState.RUNNING, now=NOW)
        second, noted = await tx.save_desired_route(experiment=noted, canary_bp=0,
                                                    state=RouteState.TRIPPED, now=NOW)
    assert (first.revision, second.revision) == (1, 2)
    assert noted.route_revision == 2
    assert second.state is RouteState.TRIPPED and second.weight_of("canary") == 0


async def test_lists_filter_and_order(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        a = await tx.create_experiment(spec=spec("a"), salt="s", now=NOW)
        b = await tx.create_experiment(spec=spec("b"), salt="s", now=NOW)
        await tx.save_state(experiment=replace(b, state=ExperimentState.PAUSED))
        for minutes, kind in enumerate((EventKind.TRIPPED, EventKind.PAUSE, EventKind.TRIPPED)):
            await tx.append_event(service="a", at=NOW + timedelta(minutes=minutes),
                                  actor="t", kind=kind, reason=str(minutes))
    async with store.transaction() as tx:
        every, total = await tx.list_experiments()
        active, _ = await tx.list_experiments(states=ACTIVE)
        others, _ = await tx.list_experiments(excluding=b.id)
        latest, count = await tx.list_events(service="a", kind=EventKind.TRIPPED, newest_first=True,
                                             limit=1)
        with pytest.raises(NotFound):
            await tx.load_experiment(experiment_id=999_999)
    assert [e.id for e in every] == [b.id, a.id] and total == 2
    assert [e.id for e in active] == [b.id]
    assert [e.id for e in others] == [a.id]
    assert count == 2 and [e.reason for e in latest] == ["2"]


async def test_every_kind_written_reads_back_as_its_member(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        for minutes, kind in enumerate(EventKind):
            await tx.append_event(service="kinds", at=NOW + timedelta(minutes=minutes),
                                  actor="t", kind=kind)
    async with store.transaction() as tx:
        events, total = await tx.list_events(service="kinds", limit=len(EventKind))
    assert total == len(EventKind)
    assert [EventKind(e.kind) for e in events] == list(EventKind)
    assert all(type(e.kind) is str for e in events)  # a plain string, as read from a row


async def test_a_kind_outside_the_enum_is_never_stored(store: ExperimentStore) -> None:
    with pytest.raises(ValueError, match="is not a valid EventKind"):
        async with store.transaction() as tx:
            await tx.append_event(service="kinds", at=NOW, actor="t",
                                  kind="rule-changed")  # type: ignore[arg-type]
    async with store.transaction() as tx:
        assert await tx.list_events(service="kinds") == ([], 0)
