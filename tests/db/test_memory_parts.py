"""The rollout memory stored in two parts (decision 0068): what every look changes, and
the step's evidence, written only when it changed; read back as one memory, on
PostgreSQL and SQLite."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from controlplane.benchmarks.decision import Degradation
from controlplane.controller.apply import decided_state
from controlplane.db import migrate
from controlplane.db.session import make_engine
from controlplane.db.store import SqlExperimentStore
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.experiments.memory_parts import (
    EVIDENCE_KEYS,
    merged_memory,
    same_evidence,
    split_memory,
)
from controlplane.experiments.store import ExperimentRecord, ExperimentStore
from tests.controller.test_known_rows import _record
from tests.db.test_memory_text import AT, SPEC, _decisions
from tests.support.shared_databases import migrated_pg, pg_url, sqlite_url  # noqa: F401


def _raw(store: ExperimentStore, experiment_id: int) -> tuple[Any, Any]:
    """(experiments.rollout_state, rollout_evidence.body) as stored, parsed."""
    assert isinstance(store, SqlExperimentStore)
    with store.database.engine.connect() as conn:
        look = conn.execute(
            text("SELECT rollout_state FROM experiments WHERE id = :id"), {"id": experiment_id}
        ).scalar()
        body = conn.execute(
            text("SELECT body FROM rollout_evidence WHERE experiment_id = :id"),
            {"id": experiment_id},
        ).scalar()
    parse = lambda v: json.loads(v) if isinstance(v, str) else v  # noqa: E731
    return parse(look), parse(body)


def _plain(memory: Any) -> Any:
    return json.loads(json.dumps(memory))


async def _running(store: ExperimentStore) -> ExperimentRecord:
    async with store.transaction() as tx:
        created = await tx.create_experiment(spec=SPEC, salt="s", now=AT)
    return replace(created, state=ExperimentState.RUNNING)


def test_split_and_merge_are_inverse_and_a_whole_memory_reads_as_written() -> None:
    decision = _decisions(1, Degradation(onset=5.0, latency_factor=2.5), 60)[-1]
    memory = decided_state(_record(1, 1), decision, AT).rollout_state
    assert memory is not None
    look, evidence = split_memory(memory)
    assert look is not None and evidence is not None
    assert set(evidence) == set(EVIDENCE_KEYS) and not set(look) & set(EVIDENCE_KEYS)
    assert merged_memory(look, evidence) == memory
    # written whole (before the split): its own parts win over any evidence row
    assert merged_memory(memory, {"tally": {"other": 1}}) == memory
    assert split_memory(None) == (None, None) and merged_memory(None, evidence) is None


def test_the_evidence_is_the_same_between_windows_and_new_when_one_is_added() -> None:
    decisions = _decisions(0, Degradation(), 130)
    record = _record(1, 1)
    same = moved = 0
    for a, b in itertools.pairwise(decisions):
        kept = all(getattr(a.new_state, k) is getattr(b.new_state, k) for k in EVIDENCE_KEYS)
        before = decided_state(record, a, AT).rollout_state
        after = decided_state(record, b, AT).rollout_state
        assert same_evidence(before, after) is kept
        same += kept
        moved += not kept
    assert same > moved > 0  # most looks add no window; some do
    # a memory read back from the store shares no object with a decided one
    state = decided_state(record, decisions[-1], AT).rollout_state
    assert not same_evidence(_plain(state), state)
    assert not same_evidence(None, state) and not same_evidence(state, None)


async def test_a_look_that_adds_no_window_leaves_the_evidence_as_stored(
    store: ExperimentStore,
) -> None:
    """Look after look as the controller commits them: each reads back as decided; the
    evidence row changes only on the looks whose tally took a window, and a write that
    says the evidence is stored does not touch it (shown by a write that lies)."""
    record = await _running(store)
    previous: dict[str, Any] | None = None
    rewritten = kept = 0
    for look, decision in enumerate(_decisions(1, Degradation(onset=20.0), 90)):
        if look % 3:
            continue
        written = decided_state(record, decision, AT)
        stored = same_evidence(previous, written.rollout_state)
        async with store.transaction() as tx:
            (saved,) = await tx.save_states(experiments=[written], evidence_stored=[stored])
        assert saved is not None
        async with store.transaction() as tx:
            loaded = await tx.load_experiment(experiment_id=record.id)
        assert loaded.rollout_state == _plain(written.rollout_state)
        look_part, body = _raw(store, record.id)
        assert set(look_part) & set(EVIDENCE_KEYS) == set()  # never in the look's part
        assert body == _plain(split_memory(written.rollout_state)[1])
        rewritten += not stored
        kept += stored
        previous, record = written.rollout_state, saved
    assert kept > rewritten > 1
    # the caller's word is taken: told the evidence is stored, the store writes none
    other = decided_state(record, _decisions(0, Degradation(), 50)[-1], AT)
    async with store.transaction() as tx:
        (saved,) = await tx.save_states(experiments=[other], evidence_stored=[True])
    assert saved is not None
    assert _raw(store, record.id)[1] == _plain(split_memory(previous)[1])


async def test_a_memory_written_whole_reads_as_written_and_the_next_write_splits_it(
    store: ExperimentStore,
) -> None:
    record = await _running(store)
    decisions = _decisions(0, Degradation(), 60)
    whole = decided_state(record, decisions[-2], AT).rollout_state
    assert isinstance(store, SqlExperimentStore)
    with store.database.engine.begin() as conn:  # as a writer before the split wrote it
        conn.execute(
            text("UPDATE experiments SET rollout_state = :m WHERE id = :id"),
            {"m": json.dumps(whole), "id": record.id},
        )
    async with store.transaction() as tx:
        loaded = await tx.load_experiment(experiment_id=record.id)
    assert loaded.rollout_state == _plain(whole)
    assert _raw(store, record.id)[1] is None
    # the controller's next write: a memory read back shares nothing, so all is written
    nxt = decided_state(loaded, decisions[-1], AT)
    stored = same_evidence(loaded.rollout_state, nxt.rollout_state)
    assert not stored
    async with store.transaction() as tx:
        (saved,) = await tx.save_states(experiments=[nxt], evidence_stored=[stored])
    assert saved is not None
    look_part, body = _raw(store, record.id)
    assert not set(look_part) & set(EVIDENCE_KEYS)
    assert body == _plain(split_memory(nxt.rollout_state)[1])
    async with store.transaction() as tx:
        again = await tx.load_experiment(experiment_id=record.id)
    assert again.rollout_state == _plain(nxt.rollout_state)


async def test_the_generic_save_splits_too_and_a_cleared_memory_clears_its_evidence(
    store: ExperimentStore,
) -> None:
    record = await _running(store)
    decision = _decisions(0, Degradation(), 60)[-1]
    async with store.transaction() as tx:
        saved = await tx.save_state(experiment=decided_state(record, decision, AT))
    look_part, body = _raw(store, record.id)
    assert not set(look_part) & set(EVIDENCE_KEYS) and set(body) == set(EVIDENCE_KEYS)
    assert saved.rollout_state == _plain(decided_state(record, decision, AT).rollout_state)
    async with store.transaction() as tx:
        cleared = await tx.save_state(experiment=replace(saved, rollout_state=None))
    assert cleared.rollout_state is None
    assert _raw(store, record.id) == (None, None)
    # and the batch path, for a row with evidence
    async with store.transaction() as tx:
        again = await tx.save_state(experiment=decided_state(cleared, decision, AT))
        (done,) = await tx.save_states(experiments=[replace(again, rollout_state=None)])
    assert done is not None
    assert _raw(store, record.id) == (None, None)


async def test_a_deleted_experiment_takes_its_evidence_with_it(store: ExperimentStore) -> None:
    async with store.transaction() as tx:
        draft = await tx.create_experiment(spec=SPEC, salt="s", now=AT)
        saved = await tx.save_state(experiment=decided_state(
            draft, _decisions(0, Degradation(), 45)[-1], AT
        ))  # fmt: skip
    assert _raw(store, draft.id)[1] is not None
    async with store.transaction() as tx:
        await tx.delete_experiment(experiment=replace(saved, state=ExperimentState.DRAFT))
    assert _raw(store, draft.id) == (None, None)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_downgrade_folds_the_evidence_back_into_the_memory(
    backend: str, request: pytest.FixtureRequest
) -> None:
    import asyncio

    from controlplane.db.session import Database

    url: str = request.getfixturevalue("pg_url" if backend == "postgresql" else "sqlite_url")
    migrate.upgrade(url)
    database = Database(make_engine(url))
    try:
        store = SqlExperimentStore(database)

        async def write() -> dict[str, Any] | None:
            record = await _running(store)
            written = decided_state(record, _decisions(0, Degradation(), 45)[-1], AT)
            async with store.transaction() as tx:
                await tx.save_states(experiments=[written])
            return written.rollout_state

        memory = asyncio.run(write())
    finally:
        database.dispose()
    migrate.downgrade(url, "0011")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT rollout_state FROM experiments")).scalar()
    finally:
        engine.dispose()
        migrate.upgrade(url)  # the session's shared database stays at head
    assert (json.loads(stored) if isinstance(stored, str) else stored) == _plain(memory)
