"""The rows a round keeps between rounds (decision 0059), apart from any database."""

from __future__ import annotations

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
from controlplane.controller.known_rows import KnownRows
from controlplane.decision.model import Decision, RolloutState
from controlplane.decision.rollout import decide, start
from controlplane.experiments.lifecycle import ACTIVE, BreakerState, ExperimentState
from controlplane.experiments.rollout_state import stored_rollout_state
from controlplane.experiments.store import ExperimentRecord, ExperimentVersion

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _record(
    experiment_id: int, version: int, *, state: ExperimentState = ExperimentState.RUNNING,
    memory: dict[str, object] | None = None,
) -> ExperimentRecord:
    return ExperimentRecord(
        id=experiment_id, name=f"e{experiment_id}", service=f"s{experiment_id}", state=state,
        salt="salt", baseline_upstream="http://b", canary_upstream="http://c", steps=(),
        sticky_header=None, sticky_cookie=None, rule=None, current_step=0,
        canary_weight_bp=100, breaker_state=BreakerState.CLOSED, trips=0,
        step_started_at=AT, breaker_changed_at=None, route_revision=1,
        rollout_state=memory, created_at=AT, updated_at=AT, version=version,
    )  # fmt: skip


def _listing(*pairs: tuple[int, int]) -> list[ExperimentVersion]:
    return [ExperimentVersion(id=i, version=v) for i, v in pairs]


def test_only_rows_new_or_at_another_version_are_stale() -> None:
    known = KnownRows()
    listed = _listing((3, 1), (2, 5), (1, 1))
    assert known.stale(listed) == [3, 2, 1]
    assert known.refresh(listed, [_record(1, 1), _record(2, 5), _record(3, 1)], ACTIVE) == [
        _record(3, 1), _record(2, 5), _record(1, 1)
    ]
    assert known.stale(_listing((3, 1), (2, 6), (1, 1), (4, 1))) == [2, 4]


def test_what_left_the_listing_is_forgotten() -> None:
    known = KnownRows()
    known.refresh(_listing((2, 1), (1, 1)), [_record(1, 1), _record(2, 1)], ACTIVE)
    assert [r.id for r in known.refresh(_listing((2, 1)), [], ACTIVE)] == [2]
    assert len(known) == 1
    # back in the listing: read again, not taken from a forgotten copy
    assert known.stale(_listing((2, 1), (1, 1))) == [1]


def test_a_row_that_left_the_active_states_between_listing_and_load_is_not_judged() -> None:
    known = KnownRows()
    listed = _listing((2, 1), (1, 1))
    ended = _record(2, 2, state=ExperimentState.PROMOTED)
    assert known.refresh(listed, [_record(1, 1), ended], ACTIVE) == [_record(1, 1)]
    assert len(known) == 1


def test_a_row_gone_between_listing_and_load_is_skipped() -> None:
    known = KnownRows()
    assert known.refresh(_listing((2, 1), (1, 1)), [_record(1, 1)], ACTIVE) == [_record(1, 1)]


def test_the_controllers_own_write_is_known_at_its_new_version() -> None:
    known = KnownRows()
    known.refresh(_listing((1, 1)), [_record(1, 1)], ACTIVE)
    memory = start(ABSOLUTE_STEPS, 0.0).new_state
    written = _record(1, 2, memory=memory.to_dict())
    known.wrote(written, memory)
    assert known.stale(_listing((1, 2))) == []
    assert known.stored_state(written) is memory
    # a write of a row no longer held is not taken in: the listing decides what is held
    known.wrote(_record(9, 2), memory)
    assert len(known) == 1


def test_a_remembered_look_is_where_the_next_look_of_that_record_starts() -> None:
    known = KnownRows()
    memory = start(ABSOLUTE_STEPS, 0.0).new_state
    record = _record(1, 1, memory=json.loads(json.dumps(memory.to_dict())))
    known.refresh(_listing((1, 1)), [record], ACTIVE)
    looked = memory.with_changes(last_snapshot_ts=12.5)
    known.remember(record, looked)
    assert known.stored_state(record) is looked
    assert known.stale(_listing((1, 1))) == []  # nothing was written: same version
    # another record of the row (read again at a new version) starts from what it stores
    again = _record(1, 2, memory=record.rollout_state)
    known.refresh(_listing((1, 2)), [again], ACTIVE)
    assert known.stored_state(again) == memory
    # a record not held is not remembered
    known.remember(record, looked)
    assert known.stored_state(again) == memory
    known.remember(_record(9, 1), looked)
    assert len(known) == 1


def test_stored_memory_is_parsed_once_per_record_held() -> None:
    known = KnownRows()
    memory = start(ABSOLUTE_STEPS, 0.0).new_state
    record = _record(1, 1, memory=json.loads(json.dumps(memory.to_dict())))
    known.refresh(_listing((1, 1)), [record], ACTIVE)
    first = known.stored_state(record)
    assert first == stored_rollout_state(record)
    assert known.stored_state(record) is first
    # a record that is not the one held (same id and version, other contents) is
    # parsed as it is
    other = replace(record, rollout_state=None)
    assert known.stored_state(other) is None


def test_unreadable_memory_raises_each_time_it_is_asked_for() -> None:
    known = KnownRows()
    record = _record(1, 1, memory={"status": "nonsense"})
    known.refresh(_listing((1, 1)), [record], ACTIVE)
    for _ in range(2):
        with pytest.raises((KeyError, ValueError)):
            known.stored_state(record)


def _same_decision(a: Decision, b: Decision) -> bool:
    def stored(state: RolloutState) -> str:
        return repr(RolloutState.from_dict(json.loads(json.dumps(state.to_dict()))))

    return (a.reason, a.effects, a.next_check_at, stored(a.new_state)) == (
        b.reason, b.effects, b.next_check_at, stored(b.new_state)
    )


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(
    "degrade",
    [Degradation(), Degradation(onset=300.0, latency_factor=2.5),
     Degradation(onset=200.0, error_rate=0.2)],
    ids=["aa", "latency", "errors"],
)  # fmt: skip
def test_deciding_from_the_memory_written_equals_deciding_from_it_read_back(
    seed: int, degrade: Degradation
) -> None:
    """The controller decides from the state its own commit wrote, not from that state
    read back from its JSON: the two must lead to the same decisions, look after look,
    on the decision benchmark's traffic."""
    traffic = Traffic(np.random.default_rng(seed), RULE.threshold_ms, degrade)
    kept = read_back = start(ABSOLUTE_STEPS, 0.0).new_state
    now = 0.0
    for _ in range(150):
        traffic.generate(now, now + EVAL_INTERVAL_SEC, kept.canary_bp)
        now += EVAL_INTERVAL_SEC
        snapshots = traffic.snapshots(now, RULE, reservoir=False)
        fast = traffic.fast_snapshots(now, RULE, reservoir=False)
        from_kept = decide(kept, snapshots, RULE, ABSOLUTE_STEPS, now, fast)
        from_read = decide(read_back, snapshots, RULE, ABSOLUTE_STEPS, now, fast)
        assert _same_decision(from_kept, from_read)
        kept = from_kept.new_state
        read_back = RolloutState.from_dict(json.loads(json.dumps(from_read.new_state.to_dict())))
