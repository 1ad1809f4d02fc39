"""The shards' fences in SQL (db/shards.py): a replica that lost a shard commits nothing
for it, on PostgreSQL and SQLite; on PostgreSQL, a claim and a decision of the same
shard racing each other commit one after the other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from controlplane.controller.shards import shard_of
from controlplane.db.migrate import upgrade
from controlplane.db.session import Database, make_engine
from controlplane.db.shards import shard_fences
from controlplane.db.store import SqlExperimentStore
from controlplane.experiments.events import EventKind
from controlplane.experiments.store import ExperimentSpec, ShardSelection, StepSpec
from controlplane.kernel.errors import NotLeader

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["postgresql", "sqlite"])
async def database(request: pytest.FixtureRequest) -> AsyncIterator[Database]:
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    db = Database(make_engine(url))
    try:
        yield db
    finally:
        db.dispose()


async def fences(database: Database) -> dict[int, tuple[int, str]]:
    async with database.transaction() as tx:
        return await tx.run(shard_fences)


async def note(store: SqlExperimentStore, *, shard: int, fence: int, owner: str) -> None:
    """A unit of work fenced by the shard, writing one event."""
    async with store.transaction() as tx:
        await tx.hold_shard(shard=shard, fence=fence, owner=owner, now=NOW)
        await tx.append_event(service="shop", at=NOW, actor=owner, kind=EventKind.NO_RULE,
                              reason=f"fenced by {fence}")


async def reasons(store: SqlExperimentStore) -> list[str]:
    async with store.transaction() as tx:
        events, _ = await tx.list_events(service="shop")
    return [e.reason for e in events]


async def test_the_first_claim_creates_the_shards_row_and_its_owner_commits(
    database: Database,
) -> None:
    store = SqlExperimentStore(database)
    await note(store, shard=7, fence=100, owner="a")
    await note(store, shard=7, fence=100, owner="a")
    assert await fences(database) == {7: (100, "a")}
    assert await reasons(store) == ["fenced by 100", "fenced by 100"]


async def test_after_a_newer_claim_the_former_owner_commits_nothing(database: Database) -> None:
    store = SqlExperimentStore(database)
    await note(store, shard=3, fence=100, owner="a")
    await note(store, shard=3, fence=250, owner="b")

    with pytest.raises(NotLeader, match="shard 3"):
        await note(store, shard=3, fence=100, owner="a")

    assert await fences(database) == {3: (250, "b")}
    assert await reasons(store) == ["fenced by 100", "fenced by 250"]


async def test_shards_are_fenced_each_on_its_own(database: Database) -> None:
    store = SqlExperimentStore(database)
    await note(store, shard=1, fence=500, owner="b")
    await note(store, shard=2, fence=100, owner="a")
    assert await fences(database) == {1: (500, "b"), 2: (100, "a")}


async def test_a_claim_waits_for_a_decision_in_flight_and_then_fences_it_out(
    pg_url: str,
) -> None:
    upgrade(pg_url)
    database = Database(make_engine(pg_url))
    store = SqlExperimentStore(database)
    try:
        await note(store, shard=5, fence=100, owner="a")
        decided = asyncio.Event()
        release = asyncio.Event()

        async def slow_decision() -> None:
            async with store.transaction() as tx:
                await tx.hold_shard(shard=5, fence=100, owner="a", now=NOW)
                decided.set()
                await release.wait()  # the old owner's commit is in flight
                await tx.append_event(service="shop", at=NOW, actor="a",
                                      kind=EventKind.NO_RULE, reason="late decision of a")

        decision = asyncio.create_task(slow_decision())
        await decided.wait()
        claim = asyncio.create_task(note(store, shard=5, fence=300, owner="b"))
        await asyncio.sleep(0.2)  # give the claim the time to reach the row lock
        assert not claim.done(), "the claim went past the row a decision holds"
        release.set()
        await decision
        await claim

        with pytest.raises(NotLeader):
            await note(store, shard=5, fence=100, owner="a")
        assert await reasons(store) == ["fenced by 100", "late decision of a", "fenced by 300"]
    finally:
        database.dispose()


async def test_the_database_selects_the_experiments_of_some_shards_as_shard_of_does(
    database: Database,
) -> None:
    store = SqlExperimentStore(database)
    ids = []
    async with store.transaction() as tx:
        for i in range(20):
            created = await tx.create_experiment(spec=spec(f"svc-{i}"), salt="s", now=NOW)
            ids.append(created.id)
        chosen, _ = await tx.list_experiments(shards=ShardSelection(8, frozenset({1, 6})))
        none, _ = await tx.list_experiments(shards=ShardSelection(8, frozenset()))
    assert sorted(e.id for e in chosen) == [i for i in ids if shard_of(i, 8) in {1, 6}]
    assert chosen and none == []


def spec(service: str) -> ExperimentSpec:
    return ExperimentSpec(
        name="v2", service=service, baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002", steps=(StepSpec(500, 30),),
        sticky_header="x-user-id", sticky_cookie=None, rule=None,
    )
