"""A look at nothing new reuses what the last look derived from the same window
(WindowSnapshot.memo, shared by the restamped copies the controller judges while
the partials do not change; docs/decisions/0067-a-look-at-nothing-new.md).

What it reuses must be what it would compute afresh: on generated windows, every
piece of evidence, every evaluation and every decision on a restamped window (once,
and twice) equals the one on an equal window built anew, whose memo is empty; and
what a look hands out is its own, so changing it changes no later look.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.collector.sharding import restamped
from controlplane.decision.breaker import (
    evaluate,
    latency_summary,
    unit_evidence,
    variant_evidence,
)
from controlplane.decision.model import RolloutState
from controlplane.decision.rollout import decide, rule_json
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import FIRST_BYTE, WindowSnapshot
from controlplane.kernel.units import UNIT_BLOCKS, UnitSummary, block_of, bottom_distinct
from tests.decision.factory import STEPS, T0, THRESHOLD_MS, rule, state

PERCENTILES = (0.5, 0.9, 0.95, 0.99, 0.999)


def _units(rt: np.ndarray, failed: np.ndarray, unit: np.ndarray) -> UnitSummary:
    rows = block_of(unit)
    logs = np.log(rt)
    size = UNIT_BLOCKS + 1
    table = np.column_stack(
        [
            np.bincount(rows, minlength=size).astype(np.float64),
            np.bincount(rows, weights=failed, minlength=size),
            np.bincount(rows, weights=rt > THRESHOLD_MS, minlength=size),
            np.bincount(rows, weights=logs, minlength=size),
            np.bincount(rows, weights=logs * logs, minlength=size),
        ]
    )
    return UnitSummary.from_arrays(table, bottom_distinct([unit[unit != 0]]))


def _window(
    rng: np.random.Generator,
    variant: str,
    n: int,
    ts: float,
    *,
    users: int,
    slow: float,
    reservoir: bool,
    units: bool,
    first_byte: bool,
    latency: str = "total",
) -> WindowSnapshot:
    """A window of `n` samples from `users` units (0: none), ending at `ts`."""
    rt = rng.lognormal(math.log(120.0 * slow), 0.6, n)
    failed = rng.random(n) < 0.02 * slow
    unit = (
        rng.integers(1, 2**32, users, dtype=np.uint64).astype(np.uint32)[rng.integers(0, users, n)]
        if users
        else np.zeros(n, dtype=np.uint32)
    )
    pcts: list[float | None] = [None] * 5
    if n:
        pcts = [float(v) for v in np.quantile(rt, PERCENTILES, method="inverted_cdf")]
    keep = slice(None, None, max(1, n // 256))
    inner = None
    if first_byte:
        cut = n * 9 // 10
        inner = _window_of(
            variant,
            ts,
            rt[:cut] * 0.4,
            failed[:cut],
            unit[:cut],
            reservoir=reservoir,
            units=units,
            latency=FIRST_BYTE,
        )
    return replace(
        _window_of(
            variant, ts, rt, failed, unit, reservoir=reservoir, units=units, latency=latency
        ),
        first_byte=inner,
        p50_ms=pcts[0],
        p90_ms=pcts[1],
        p95_ms=pcts[2],
        p99_ms=pcts[3],
        p999_ms=pcts[4],
        reservoir_ms=tuple(rt[keep].tolist()) if reservoir else (),
        reservoir_units=tuple(unit[keep].tolist()) if reservoir and users else (),
    )


def _window_of(
    variant: str,
    ts: float,
    rt: np.ndarray,
    failed: np.ndarray,
    unit: np.ndarray,
    *,
    reservoir: bool,
    units: bool,
    latency: str,
) -> WindowSnapshot:
    n = int(rt.size)
    pcts = (
        [float(v) for v in np.quantile(rt, PERCENTILES, method="inverted_cdf")] if n else [None] * 5
    )
    keep = slice(None, None, max(1, n // 256))
    return WindowSnapshot(
        experiment="e1",
        variant=variant,
        count=n,
        failures=int(failed.sum()),
        window_sec=10,
        ts=ts,
        window_start=ts - 10,
        window_end=ts,
        mean_ms=float(rt.mean()) if n else None,
        p50_ms=pcts[0],
        p90_ms=pcts[1],
        p95_ms=pcts[2],
        p99_ms=pcts[3],
        p999_ms=pcts[4],
        threshold_ms=THRESHOLD_MS,
        above_threshold=int((rt > THRESHOLD_MS).sum()),
        sample_lag_ms=120.0,
        shed=3 if variant == "baseline" and n % 7 == 0 else 0,
        reservoir_ms=tuple(rt[keep].tolist()) if reservoir else (),
        reservoir_units=tuple(unit[keep].tolist()) if reservoir else (),
        units=_units(rt, failed, unit) if units else None,
        latency=latency,
    )


def anew(snap: WindowSnapshot) -> WindowSnapshot:
    """An equal window built from its fields: nothing derived from it kept yet."""
    values = {f.name: getattr(snap, f.name) for f in fields(snap)}
    if snap.units is not None:
        values["units"] = UnitSummary(snap.units.rows.copy(), snap.units.distinct.copy())
    if snap.first_byte is not None:
        values["first_byte"] = anew(snap.first_byte)
    fresh = WindowSnapshot(**values)
    assert fresh == snap and "_memo" not in fresh.__dict__
    return fresh


def text(value: Any) -> str:
    """Equal values, key order and element types: repr tells them all apart."""
    return repr(value)


RULES = {
    "absolute": rule(min_samples=20),
    "first_byte": rule(min_samples=20, latency="first_byte"),
    "baseline_p99": rule(min_samples=20, compare="baseline", percentile=99),
    "baseline_fb_p50": rule(
        min_samples=20, compare="baseline", percentile=50, latency="first_byte", overload="judge"
    ),
}


def looks(snaps: dict[str, WindowSnapshot], r: BreakerRule) -> list[Any]:
    """Everything a look derives from a pair of windows, as values to compare."""
    canary, baseline = snaps["canary"], snaps["baseline"]
    out: list[Any] = []
    for s in (canary, baseline):
        out += [
            variant_evidence(s, r),
            latency_summary(s),
            latency_summary(s.first_byte),
            unit_evidence(s),
            unit_evidence(s, concentrated=True),
        ]
    for test in (False, True):
        ev = evaluate(canary, baseline, r, always_test=test, alpha=1e-4)
        out += [ev, json.dumps(ev.to_dict())]
    return out


@st.composite
def windows(draw: st.DrawFn) -> tuple[dict[str, WindowSnapshot], str]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = dict(
        users=draw(st.sampled_from([0, 4, 40, 100_000])),
        reservoir=draw(st.booleans()),
        units=draw(st.booleans()),
        first_byte=draw(st.booleans()),
    )
    slow = draw(st.sampled_from([1.0, 1.0, 3.0]))
    n = draw(st.sampled_from([0, 10, 60, 400]))
    base = draw(st.sampled_from([0, 50, 2000]))
    snaps = {
        "canary": _window(rng, "canary", n, T0, slow=slow, **kind),
        "baseline": _window(rng, "baseline", base, T0, slow=1.0, **kind),
    }
    return snaps, draw(st.sampled_from(sorted(RULES)))


def _restamped(snaps: dict[str, WindowSnapshot], now: float) -> dict[str, WindowSnapshot]:
    return {k: restamped(s, now, now - 0.3, now - 0.4) for k, s in snaps.items()}


@settings(max_examples=60, deadline=None)
@given(windows())
def test_a_restamped_window_looks_as_an_equal_new_one(case: Any) -> None:
    snaps, name = case
    r = RULES[name]
    looks(snaps, r)  # the first look fills the memo
    once = _restamped(snaps, T0 + 0.25)
    twice = _restamped(once, T0 + 0.5)
    for again in (once, twice):
        assert again["canary"].memo is snaps["canary"].memo  # reused, not recomputed
        fresh = {k: anew(s) for k, s in again.items()}
        assert text(looks(again, r)) == text(looks(fresh, r))
    # and every other rule's look on the same windows: the memo is keyed by what it uses
    for other in RULES.values():
        fresh = {k: anew(s) for k, s in twice.items()}
        assert text(looks(twice, other)) == text(looks(fresh, other))


def _decisions(snaps: dict[str, WindowSnapshot], r: BreakerRule, at: float) -> str:
    fast = {k: replace(s, window_start=s.window_end - 2) for k, s in snaps.items()}
    out = []
    for before in (state(), state(last_snapshot_ts=at - 1, consecutive_breaches=1)):
        d = decide(before, snaps, r, STEPS, at, fast)
        out.append((d.reason, d.new_state, d.effects, d.next_check_at, d.evidence))
    return text(out)


@settings(max_examples=30, deadline=None)
@given(windows())
def test_a_decision_on_a_restamped_window_is_the_one_on_a_new_window(case: Any) -> None:
    snaps, name = case
    r = RULES[name]
    _decisions(snaps, r, T0)
    once = _restamped(snaps, T0 + 0.25)
    twice = _restamped(once, T0 + 0.5)
    for again, at in ((once, T0 + 0.25), (twice, T0 + 0.5)):
        fresh = {k: anew(s) for k, s in again.items()}
        assert _decisions(again, r, at) == _decisions(fresh, r, at)


def test_what_a_look_hands_out_is_its_own() -> None:
    rng = np.random.default_rng(5)
    kind: dict[str, Any] = dict(users=40, reservoir=True, units=True, first_byte=True)
    snaps = {
        "canary": _window(rng, "canary", 400, T0, slow=3.0, **kind),
        "baseline": _window(rng, "baseline", 2000, T0, slow=1.0, **kind),
    }
    r = RULES["baseline_p99"]
    canary = snaps["canary"]
    first = copy.deepcopy(looks(snaps, r))
    # change everything handed out, to the bottom
    evidence = variant_evidence(canary, r)
    assert evidence is not None
    for name in ("total", "first_byte", "units"):
        evidence[name]["count" if name != "units" else "distinct_units"] = -1
    evidence["count"] = -1
    summary = latency_summary(canary)
    assert summary is not None
    summary["p95_ms"] = -1.0
    units = unit_evidence(canary, concentrated=True)
    assert units is not None
    units["top_units"].append("x")
    units["judged_on"] = "x"
    ev = evaluate(canary, snaps["baseline"], r)
    ev.variants["canary"]["total"]["count"] = -1
    decision = decide(state(), snaps, r, STEPS, T0, None)
    decision.evidence["window"]["variants"]["canary"]["units"]["judged_on"] = "x"
    decision.evidence["rule"]["direction"]["latency"] = "x"
    assert text(looks(snaps, r)) == text(first)
    again = _restamped(snaps, T0 + 0.25)
    assert text(looks(again, r)) == text(looks({k: anew(s) for k, s in again.items()}, r))
    assert (
        decide(state(), snaps, r, STEPS, T0, None).evidence
        == decide(state(), {k: anew(s) for k, s in snaps.items()}, r, STEPS, T0, None).evidence
    )


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_rule_is_dumped_once_and_each_caller_gets_a_copy(name: str) -> None:
    r = RULES[name].model_copy(update={"failure_statuses": [500, 503]})
    first = rule_json(r)
    assert first == r.model_dump(mode="json")
    assert list(first) == list(r.model_dump(mode="json"))
    first["failure_statuses"].append(404)
    first["direction"]["latency"] = "x"
    first["alpha"] = 0.3
    assert rule_json(r) == r.model_dump(mode="json")
    # a copy with changes is another rule, dumped anew
    changed = r.model_copy(update={"min_samples": 7})
    assert rule_json(changed) == changed.model_dump(mode="json")
    assert rule_json(changed)["min_samples"] == 7 and rule_json(r)["min_samples"] == 20


def test_with_changes_is_replace() -> None:
    before = state(last_snapshot_ts=T0, consecutive_breaches=1)
    changes: dict[str, Any] = {"consecutive_breaches": 2, "no_data_since": T0 + 1.0}
    after = before.with_changes(**changes)
    expected = replace(before, **changes)
    assert after == expected and repr(after) == repr(expected)
    assert list(after.__dict__) == list(expected.__dict__)
    assert before.consecutive_breaches == 1  # the original is not changed
    with pytest.raises(TypeError):
        before.with_changes(no_such_field=1)
    with pytest.raises(ValueError):
        before.with_changes(canary_bp=20_000)  # the state's own check still runs
    assert isinstance(after, RolloutState)
