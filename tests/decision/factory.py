"""One factory for the decision tests: rules, steps, states and window snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from controlplane.decision import BreakerState, ExperimentState, RolloutState, Step
from controlplane.decision.tally import Tally
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot

T0 = 1_800_000_000.0
THRESHOLD_MS = 300.0
WINDOW_SEC = 10

STEPS = (Step(1, 60), Step(5, 60), Step(25, 60), Step(50, 60))


def rule(**overrides: Any) -> BreakerRule:
    base: dict[str, Any] = {
        "service": "payment-api",
        "threshold_ms": THRESHOLD_MS,
        "window_sec": WINDOW_SEC,
        "failure_ratio": 0.05,
        "cooldown_sec": 60,
        "percentile": 95,
        "min_samples": 100,
        "consecutive_breaches": 2,
        "alpha": 0.01,
        "max_trips": 3,
    }
    base.update(overrides)
    return BreakerRule(**base)


def state(**overrides: Any) -> RolloutState:
    """A running experiment at step 1 (index 0), closed, started at T0."""
    base: dict[str, Any] = {
        "status": ExperimentState.RUNNING,
        "breaker": BreakerState.CLOSED,
        "step_index": 0,
        "step_started_at": T0,
        "canary_bp": STEPS[0].weight_bp,
        "weight_since": T0,
        "tally": Tally.starting(T0),
    }
    base.update(overrides)
    return RolloutState(**base)


def half_open(r: BreakerRule | None = None, **overrides: Any) -> RolloutState:
    """Probing since T0 + 100 after the first trip, at the rule's half-open weight."""
    weight = (r if r is not None else rule()).half_open_weight
    return state(
        breaker=BreakerState.HALF_OPEN,
        canary_bp=weight,
        weight_since=T0 + 100,
        probe_started_at=T0 + 100,
        opened_at=T0,
        trips=1,
        **overrides,
    ).with_changes(tally=state().tally.starting(T0 + 100))


def snap(
    variant: str,
    ts: float,
    *,
    count: int = 1000,
    failures: int = 0,
    above: int = 0,
    p95_ms: float | None = 200.0,
    threshold_ms: float | None = THRESHOLD_MS,
    threshold_exact: bool = True,
    reservoir: Sequence[float] = (),
    window_sec: int = WINDOW_SEC,
) -> WindowSnapshot:
    """A hand-made window ending at `ts`."""
    return WindowSnapshot(
        experiment="e1",
        variant=variant,
        count=count,
        failures=failures,
        window_sec=window_sec,
        ts=ts,
        window_start=ts - window_sec,
        window_end=ts,
        p50_ms=p95_ms / 2 if p95_ms is not None else None,
        p90_ms=p95_ms * 0.9 if p95_ms is not None else None,
        p95_ms=p95_ms,
        p99_ms=p95_ms * 1.3 if p95_ms is not None else None,
        p999_ms=p95_ms * 1.6 if p95_ms is not None else None,
        threshold_ms=threshold_ms,
        above_threshold=above,
        threshold_exact=threshold_exact,
        reservoir_ms=tuple(reservoir),
    )


def _baseline_count(count: int, bp: int) -> int:
    # the baseline count that matches the split, so no sample ratio mismatch shows
    return round(count * (10_000 - bp) / bp)


def healthy(ts: float, count: int = 1000, *, bp: int = 100, **kw: Any) -> dict[str, WindowSnapshot]:
    """Both variants well within the rule, counts in the ratio of the weights."""
    base = _baseline_count(count, bp)
    return {
        "canary": snap("canary", ts, count=count, above=count // 100, **kw),
        "baseline": snap("baseline", ts, count=base, above=base // 100, **kw),
    }


def slow(ts: float, count: int = 1000, *, bp: int = 100, **kw: Any) -> dict[str, WindowSnapshot]:
    """The canary with a fifth of its window above the threshold."""
    base = _baseline_count(count, bp)
    return {
        "canary": snap("canary", ts, count=count, above=count // 5, p95_ms=900.0, **kw),
        "baseline": snap("baseline", ts, count=base, above=base // 100, **kw),
    }


def sampled(
    variant: str,
    rt_ms: np.ndarray,
    failed: np.ndarray,
    ts: float,
    *,
    threshold_ms: float = THRESHOLD_MS,
    window_sec: int = WINDOW_SEC,
    reservoir_size: int = 512,
) -> WindowSnapshot:
    """A window built from samples, with exact above-threshold counts."""
    count = int(rt_ms.size)
    qs = np.quantile(rt_ms, [0.5, 0.9, 0.95, 0.99, 0.999], method="inverted_cdf")
    stride = max(1, count // reservoir_size)
    return WindowSnapshot(
        experiment="e1",
        variant=variant,
        count=count,
        failures=int(failed.sum()),
        window_sec=window_sec,
        ts=ts,
        window_start=ts - window_sec,
        window_end=ts,
        mean_ms=float(rt_ms.mean()),
        p50_ms=float(qs[0]),
        p90_ms=float(qs[1]),
        p95_ms=float(qs[2]),
        p99_ms=float(qs[3]),
        p999_ms=float(qs[4]),
        threshold_ms=threshold_ms,
        above_threshold=int((rt_ms > threshold_ms).sum()),
        threshold_exact=True,
        reservoir_ms=tuple(float(v) for v in rt_ms[::stride][:reservoir_size]),
    )
