"""`canary bench overload-tuning`: the overload settings chosen in decision 0032 against
the ones before, on one stack, alternating, so the machine's load falls on both alike.

The stack and the runs are `canary bench overload`'s (`overload.py`). Two parts:

- **queue**: at 1x, 2x and 4x the capacity, protection with the settings before (the
  interval's median, `rtt_buffer` 0.1, a standing queue served first in, first out),
  with the mean but the queue as before, and with the defaults, alternately, `reps`
  times each: goodput, P50/P99 of the admitted, shed by reason;
- **step**: the capacity halves mid-run (as in `overload`'s step) under each limit
  variant: how the limit is spread over the values it took after the halving, and
  when it settled within 20% of 4 (the upstream's new concurrency): its mean over a
  second, and every sample.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from controlplane.benchmarks import overload
from controlplane.benchmarks.sidecar import _raise_priority, _say

MEDIAN: dict[str, Any] = {"statistic": "percentile", "percentile": 0.5, "rtt_buffer": 0.1}
BEFORE: dict[str, Any] = {**MEDIAN, "queue_standing_lifo": False}
QUEUE_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("before", BEFORE),
    ("mean, queue first in first out", {"queue_standing_lifo": False}),
    ("now", {}),
)
STEP_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("median, rtt_buffer 0.1 (before)", MEDIAN),
    ("mean, rtt_buffer 0.1", {"rtt_buffer": 0.1}),
    ("mean, rtt_buffer 0.02", {"rtt_buffer": 0.02}),
    ("mean, rtt_buffer 0.05 (now)", {}),
)
LOADS = (1.0, 2.0, 4.0)


def _queue_run(stack: overload.Stack, tmp: Path, load: float, d: overload.Durations) -> Any:
    measured, _, shed = overload._load(
        stack, tmp, rate=load * overload.CAPACITY_RPS, warmup=d.warmup_s, duration=d.measure_s
    )
    f = overload._figures(measured, shed)
    return {
        "goodput_share": f["goodput_share"],
        "admitted_p50_ms": f["admitted_p50_ms"],
        "admitted_p99_ms": f["admitted_p99_ms"],
        "shed_by_reason": f["shed_by_reason"],
        "achieved_rps": f["achieved_rps"],
        "limit_at_end": (f["sidecar_limit_at_end"] or {}).get("limit"),
        "loadavg": round(os.getloadavg()[0], 2),
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return round(float(np.mean(values)), 3) if values else None

    return {k: mean(k) for k in ("goodput_share", "admitted_p50_ms", "admitted_p99_ms")}


def _step_run(stack: overload.Stack, tmp: Path, d: overload.Durations) -> dict[str, Any]:
    step = overload._step(stack, tmp, d, False)
    half = step.get("half_of_before", {})
    return {
        "limit_before_median": step["limit_before_median"],
        "limit_after_share": step["limit_after_share"],
        "settled_mean_within_20pct_of_4_s": step["settled_mean_in_band_s"],
        "settled_within_20pct_of_4_s": step["settled_in_band_s"],
        "settled_within_20pct_of_half_before_s": half.get("settled_in_band_s"),
        "goodput_per_second": step["goodput_per_second"],
    }


def run(
    *,
    quick: bool,
    progress: bool,
    reps: int | None = None,
    durations: overload.Durations | None = None,
) -> dict[str, Any]:
    """`durations` (for tests) overrides the quick or full ones."""
    d = durations or (overload.QUICK if quick else overload.FULL)
    reps = reps or (1 if quick else 2)
    result: dict[str, Any] = {"benchmark": "overload-tuning", "quick": quick, "reps": reps}
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    _raise_priority()
    queue: dict[str, dict[str, Any]] = {}
    steps: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in STEP_VARIANTS}
    saved = dict(overload.PROTECTION)
    try:
        with tempfile.TemporaryDirectory(prefix="canary-bench-tuning-") as tmp_name:
            tmp = Path(tmp_name)
            with overload._stack(tmp) as stack:
                for load in LOADS:
                    runs: dict[str, list[dict[str, Any]]] = {n: [] for n, _ in QUEUE_VARIANTS}
                    for _ in range(reps):
                        for name, config in QUEUE_VARIANTS:
                            overload.PROTECTION.clear()
                            overload.PROTECTION.update(config)
                            overload._idle(stack)
                            overload._protection(stack, True)
                            runs[name].append(_queue_run(stack, tmp, load, d))
                            _say(progress, f"[queue {load:g}x {name}] {runs[name][-1]}")
                    queue[f"{load:g}x"] = {
                        name: {"mean": _summary(rs), "runs": rs} for name, rs in runs.items()
                    }
                for _ in range(reps):
                    for name, config in STEP_VARIANTS:
                        overload.PROTECTION.clear()
                        overload.PROTECTION.update(config)
                        overload._idle(stack)
                        steps[name].append(_step_run(stack, tmp, d))
                        _say(progress, f"[step {name}] {steps[name][-1]}")
    finally:
        overload.PROTECTION.clear()
        overload.PROTECTION.update(saved)
    with contextlib.suppress(OSError):
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["queue"] = {"variants": dict(QUEUE_VARIANTS), "by_load": queue}
    result["step"] = {"variants": dict(STEP_VARIANTS), "runs": steps}
    return result
