"""Table tests for decide() while the sidecars shed (docs/decisions/0025): under
`overload: hold` a look whose baseline shed is held, never a breach nor a pass; under
`overload: judge` it is judged, the shed counts in its evidence. Every `now` is given."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from controlplane.decision import (
    BreakerState,
    Decision,
    EventKind,
    RecordEvent,
    RolloutState,
    decide,
)
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import BreakerRule, parse_rule
from controlplane.kernel.snapshots import WindowSnapshot
from tests.decision.factory import STEPS, T0, half_open, healthy, rule, slow, state

HOLD = rule()
JUDGE = rule(overload="judge")


def shedding(
    snaps: dict[str, WindowSnapshot], *, baseline: int = 0, canary: int = 0
) -> dict[str, WindowSnapshot]:
    return {
        "baseline": dataclasses.replace(snaps["baseline"], shed=baseline),
        "canary": dataclasses.replace(snaps["canary"], shed=canary),
    }


def at(s: RolloutState, snaps: dict[str, WindowSnapshot], now: float, r: BreakerRule) -> Decision:
    return decide(s, snaps, r, STEPS, now)


def kinds(d: Decision) -> list[EventKind]:
    return [a.kind for a in d.effects if isinstance(a, RecordEvent)]


def looks(
    r: BreakerRule, frames: list[dict[str, WindowSnapshot]], s: RolloutState | None = None,
    start: float = T0 + 20,
) -> list[Decision]:  # fmt: skip
    """One decision per frame, 250 ms apart, each on a fresh snapshot."""
    s = s if s is not None else state()
    out = []
    for i, frame in enumerate(frames):
        t = start + i * 0.25
        stamped = {k: dataclasses.replace(v, ts=t) for k, v in frame.items()}
        d = at(s, stamped, t, r)
        out.append(d)
        s = d.new_state
    return out


def test_a_slow_canary_is_held_not_tripped_while_the_baseline_sheds() -> None:
    ds = looks(HOLD, [shedding(slow(0), baseline=400)] * 6)
    assert all(d.new_state.breaker is BreakerState.CLOSED for d in ds)
    assert all(d.new_state.consecutive_breaches == 0 for d in ds)
    assert [kinds(d) for d in ds] == [[EventKind.OVERLOAD_HOLD]] + [[]] * 5  # edges only
    last = ds[-1]
    assert last.evidence["window"]["verdict"] == "overloaded"
    assert "look_alpha" not in last.evidence  # no test ran: no alpha spent
    assert last.evidence["window"]["guardrails"] == {}
    overload = last.evidence["overload"]
    assert overload["policy"] == "hold" and overload["held"] is True
    baseline = overload["variants"]["baseline"]
    assert baseline["shed"] == 400
    assert baseline["shed_share"] == pytest.approx(400 / (400 + 99_000))
    assert overload["variants"]["canary"] == {"shed": 0, "shed_share": 0.0}
    assert last.evidence["window"]["variants"]["baseline"]["shed"] == 400
    assert "shedding" in last.reason
    hold = next(a for a in ds[0].effects if isinstance(a, RecordEvent))
    assert "shed 400 requests" in hold.reason
    assert hold.payload["overload"]["held"] is True
    json.dumps(last.evidence)


def test_the_hold_ends_when_the_baseline_stops_shedding_and_judging_resumes() -> None:
    ds = looks(HOLD, [shedding(slow(0), baseline=10), slow(0), slow(0)])
    assert kinds(ds[0]) == [EventKind.OVERLOAD_HOLD]
    assert kinds(ds[1]) == [EventKind.OVERLOAD_CLEARED]
    assert ds[1].new_state.consecutive_breaches == 1
    assert ds[1].evidence["overload"]["held"] is False
    assert ds[2].new_state.breaker is BreakerState.OPEN  # judged again: a real trip
    assert kinds(ds[2]) == [EventKind.TRIPPED]
    assert ds[2].evidence["overload"] == {
        "policy": "hold",
        "held": False,
        "variants": {
            "canary": {"shed": 0, "shed_share": 0.0},
            "baseline": {"shed": 0, "shed_share": 0.0},
        },
    }


def test_a_breach_streak_does_not_survive_a_held_look() -> None:
    ds = looks(HOLD, [slow(0), shedding(slow(0), baseline=1), slow(0)])
    assert [d.new_state.consecutive_breaches for d in ds] == [1, 0, 1]
    assert ds[-1].new_state.breaker is BreakerState.CLOSED


def test_judge_trips_a_slow_canary_while_the_baseline_sheds_and_names_the_shed() -> None:
    ds = looks(JUDGE, [shedding(slow(0), baseline=400, canary=3)] * 2)
    assert ds[-1].new_state.breaker is BreakerState.OPEN
    assert kinds(ds[0]) == [] and kinds(ds[1]) == [EventKind.TRIPPED]
    overload = ds[-1].evidence["overload"]
    assert overload["policy"] == "judge" and overload["held"] is False
    assert overload["variants"]["baseline"]["shed"] == 400
    window = ds[-1].evidence["window"]
    assert window["verdict"] == "breach"
    assert window["variants"]["canary"]["shed"] == 3
    trip = next(a for a in ds[-1].effects if isinstance(a, RecordEvent))
    assert trip.payload["evidence"]["overload"]["variants"]["baseline"]["shed"] == 400


def test_a_canary_shedding_alone_is_judged_and_trips() -> None:
    # its own gate sheds because it is slow: holding would hide the regression
    ds = looks(HOLD, [shedding(slow(0), canary=250)] * 2)
    assert ds[-1].new_state.breaker is BreakerState.OPEN
    assert all(EventKind.OVERLOAD_HOLD not in kinds(d) for d in ds)
    assert ds[-1].evidence["overload"]["variants"]["canary"]["shed"] == 250


def test_a_due_step_does_not_advance_while_held_and_advances_after() -> None:
    s = at(state(), healthy(T0 + 10, count=500), T0 + 10, HOLD).new_state
    held = at(s, shedding(healthy(T0 + 60, count=500), baseline=5), T0 + 60, HOLD)
    assert held.new_state.step_index == 0
    assert kinds(held) == [EventKind.OVERLOAD_HOLD]
    assert held.new_state.tally == s.tally  # a held window is not the step's evidence
    assert held.new_state.srm_tally == s.srm_tally  # nor counts for the split
    again = at(held.new_state, shedding(healthy(T0 + 61, count=500), baseline=5), T0 + 61, HOLD)
    assert again.new_state.step_index == 0 and kinds(again) == []
    cleared = at(again.new_state, healthy(T0 + 62, count=500), T0 + 62, HOLD)
    assert kinds(cleared) == [EventKind.OVERLOAD_CLEARED, EventKind.STEP_ADVANCED]
    assert cleared.new_state.step_index == 1


def test_a_probe_does_not_close_while_held() -> None:
    probing = half_open(HOLD)
    d1 = at(probing, healthy(T0 + 110), T0 + 110, HOLD)
    assert d1.new_state.breaker is BreakerState.CLOSED  # the control: it would close
    d2 = at(probing, shedding(healthy(T0 + 110), baseline=9), T0 + 110, HOLD)
    assert d2.new_state.breaker is BreakerState.HALF_OPEN
    assert "shedding" in d2.reason and kinds(d2) == [EventKind.OVERLOAD_HOLD]


def test_the_no_data_timer_does_not_run_while_held() -> None:
    r = rule(no_data="fail", no_data_timeout_sec=5)
    empty = shedding(healthy(0, count=0), baseline=50)
    ds = looks(r, [empty] * 40)  # 10 s of looks without a canary sample
    assert all(d.new_state.breaker is BreakerState.CLOSED for d in ds)
    assert all(d.new_state.no_data_since is None for d in ds)
    # the control: the same emptiness without shedding trips on no data
    control = looks(r, [healthy(0, count=0)] * 40)
    assert control[-1].new_state.breaker is BreakerState.OPEN


def test_a_stale_repeat_of_a_held_look_keeps_the_hold() -> None:
    first = looks(HOLD, [shedding(slow(0), baseline=1)])[0]
    snaps = shedding(slow(T0 + 20), baseline=1)
    repeat = at(first.new_state, snaps, T0 + 21, HOLD)  # the same snapshot again
    assert repeat.new_state.overload_held and kinds(repeat) == []
    assert repeat.evidence["overload"]["held"] is True


def test_the_hold_is_kept_in_the_persisted_state() -> None:
    held = looks(HOLD, [shedding(slow(0), baseline=1)])[0].new_state
    assert held.overload_held
    assert RolloutState.from_dict(json.loads(json.dumps(held.to_dict()))) == held
    assert RolloutState.from_dict({**held.to_dict(), "overload_held": None}).overload_held is False


def test_the_rule_option_is_stored_only_when_not_hold() -> None:
    assert "overload" not in json.loads(HOLD.to_json())
    assert json.loads(JUDGE.to_json())["overload"] == "judge"
    assert parse_rule(JUDGE.to_json()) == JUDGE
    assert parse_rule(HOLD.to_json()).overload.value == "hold"
    data: dict[str, Any] = json.loads(HOLD.to_json())
    with pytest.raises(ValidationFailed):
        parse_rule({**data, "overload": "ignore"})
