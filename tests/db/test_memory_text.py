"""The rollout memory as the controller writes it (kept JSON text of its frozen parts)
reads back, on PostgreSQL and SQLite, to the state it was written from."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest

from controlplane.benchmarks.decision import (
    ABSOLUTE_STEPS,
    EVAL_INTERVAL_SEC,
    RULE,
    Degradation,
    Traffic,
)
from controlplane.controller.apply import decided_state
from controlplane.decision.model import Decision, RolloutState
from controlplane.decision.rollout import decide, start
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.experiments.store import ExperimentSpec, ExperimentStore, StepSpec
from controlplane.kernel.json_text import dumps
from tests.support.shared_databases import migrated_pg, pg_url, sqlite_url  # noqa: F401

AT = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = ExperimentSpec(
    name="v2", service="checkout", baseline_upstream="http://127.0.0.1:9001",
    canary_upstream="http://127.0.0.1:9002", steps=(StepSpec(500, 30),),
    sticky_header="x-user-id", sticky_cookie=None, rule=None,
)  # fmt: skip



def _decisions(seed: int, degrade: Degradation, looks: int) -> list[Decision]:
    """The decision benchmark's traffic, with reservoirs and units: every look's
    decision, the tally's parts kept between windows as the controller keeps them."""
    traffic = Traffic(np.random.default_rng(seed), RULE.threshold_ms, degrade)
    state = start(ABSOLUTE_STEPS, 0.0).new_state
    now = 0.0
    found = []
    for _ in range(looks):
        traffic.generate(now, now + EVAL_INTERVAL_SEC, state.canary_bp)
        now += EVAL_INTERVAL_SEC
        snapshots = traffic.snapshots(now, RULE, reservoir=True)
        fast = traffic.fast_snapshots(now, RULE, reservoir=True)
        decision = decide(state, snapshots, RULE, ABSOLUTE_STEPS, now, fast)
        found.append(decision)
        state = decision.new_state
    return found


@pytest.mark.parametrize(
    ("seed", "degrade"),
    [(0, Degradation()), (1, Degradation(onset=200.0, latency_factor=2.5))],
    ids=["aa", "latency"],
)
async def test_the_memory_written_reads_back_to_its_state(
    store: ExperimentStore, seed: int, degrade: Degradation
) -> None:
    async with store.transaction() as tx:
        created = await tx.create_experiment(spec=SPEC, salt="s", now=AT)
    record = replace(created, state=ExperimentState.RUNNING)
    before = start(ABSOLUTE_STEPS, 0.0).new_state
    windows_written = 0
    for look, decision in enumerate(_decisions(seed, degrade, 130)):
        tally_moved = decision.new_state.tally is not before.tally
        before = decision.new_state
        if look % 4 and not tally_moved:  # a fresh look every fourth, as in a round
            continue
        windows_written += tally_moved
        written = decided_state(record, decision, AT)
        assert written.rollout_state is not None
        # the kept text is json.dumps's, twice over (the second from what was kept)
        assert dumps(written.rollout_state) == json.dumps(written.rollout_state)
        assert dumps(written.rollout_state) == json.dumps(written.rollout_state)
        async with store.transaction() as tx:
            (saved,) = await tx.save_states(experiments=[written])
        assert saved is not None
        async with store.transaction() as tx:
            loaded = await tx.load_experiment(experiment_id=record.id)
        assert loaded.rollout_state is not None
        assert loaded.rollout_state == json.loads(json.dumps(written.rollout_state))
        back = RolloutState.from_dict(loaded.rollout_state)
        assert back == decision.new_state
        assert repr(back) == repr(
            RolloutState.from_dict(json.loads(json.dumps(decision.new_state.to_dict())))
        )
        record = saved
    assert windows_written >= 3  # looks whose tally took a window, not only kept ones


def test_a_frozen_part_keeps_its_dict_and_a_changed_one_gets_its_own() -> None:
    decisions = _decisions(0, Degradation(), 130)
    pairs = list(itertools.pairwise(decisions))
    same = [(a, b) for a, b in pairs if a.new_state.tally is b.new_state.tally]
    moved = [(a, b) for a, b in pairs if a.new_state.tally != b.new_state.tally]
    assert same and moved  # the traffic has both kinds of look
    for a, b in same:
        assert a.new_state.to_dict()["tally"] is b.new_state.to_dict()["tally"]
    for a, b in moved:
        assert a.new_state.to_dict()["tally"] != b.new_state.to_dict()["tally"]
        fresh = replace(b.new_state.tally)  # a new value: its dict built anew
        assert fresh.to_dict() == b.new_state.tally.to_dict()


async def test_a_round_of_memory_writes_every_row_at_its_version_and_tells_which_moved(
    store: ExperimentStore,
) -> None:
    """Many rows in one call (one statement on PostgreSQL): each written row reads back
    as written at its version + 1; the row another writer moved is not written and is
    the only one reported so."""
    created = []
    async with store.transaction() as tx:
        for k in range(5):
            created.append(await tx.create_experiment(
                spec=replace(SPEC, service=f"svc{k}"), salt="s", now=AT
            ))  # fmt: skip
    decisions = _decisions(0, Degradation(), 45)
    first = [
        decided_state(replace(e, state=ExperimentState.RUNNING), decisions[k], AT)
        for k, e in enumerate(created)
    ]
    async with store.transaction() as tx:
        moved = await tx.save_states(experiments=[first[2]])  # another writer, first
    assert moved[0] is not None
    later = AT.replace(minute=5)
    second = [
        decided_state(replace(e, step_started_at=None), decisions[40 + k], later)
        for k, e in enumerate(first)
    ]
    async with store.transaction() as tx:
        written = await tx.save_states(experiments=second)
    assert [w is not None for w in written] == [True, True, False, True, True]
    async with store.transaction() as tx:
        stored = {e.id: await tx.load_experiment(experiment_id=e.id) for e in created}
    for record, result in zip(second, written, strict=True):
        row = stored[record.id]
        if result is None:
            assert row.version == record.version + 1  # the other writer's, left as it is
            assert row.updated_at == AT
            continue
        assert row.version == record.version + 1 == result.version
        assert row.rollout_state == json.loads(json.dumps(record.rollout_state))
        for name in ("state", "breaker_state", "trips", "current_step", "canary_weight_bp",
                     "step_started_at", "breaker_changed_at", "updated_at"):  # fmt: skip
            assert getattr(row, name) == getattr(record, name), name
