"""A proposed breaker rule from the baseline's recent windows (architecture §6). Pure.

    decisions entries ─► baseline_windows() ─► recommend() ─► Recommendation

The history is what the collectors already publish: one `canary:decisions` entry per
snapshot, each carrying every variant's numbers over its window. Consecutive entries
overlap almost entirely (a collector writes one every few seconds per experiment),
so only entries at least one window apart are kept: each kept value then describes
samples no other kept value saw, and the count of windows is a count of independent looks.

The proposal:
    threshold_ms  = P95 over the windows of the baseline's per-window percentile
                    (the rule's percentile) * 1.25
    failure_ratio = max(P95 over the windows of the baseline's failure ratio * 2, 0.01),
                    at most 1
so a canary as good as the baseline trips on no more than ~5% of windows even before
the margin, and the margin leaves room for ordinary day-to-day drift.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.kernel.errors import Conflict
from controlplane.kernel.routes import BASELINE
from controlplane.kernel.snapshots import PERCENTILE_FIELDS

MIN_WINDOWS = 10  # fewer windows say too little about the baseline's spread
MAX_WINDOWS = 200  # the most recent ones: older behaviour matters less
LATENCY_QUANTILE = 95.0
LATENCY_MULTIPLIER = 1.25
FAILURE_QUANTILE = 95.0
FAILURE_MULTIPLIER = 2.0
# a baseline that never fails would otherwise propose 0, which every canary breaks
FAILURE_FLOOR = 0.01
FAILURE_CAP = 1.0


class NotEnoughHistory(Conflict):
    """Too few baseline windows to propose a rule from."""

    def __init__(self, service: str, found: int, needed: int, why: str = "") -> None:
        self.service = service
        self.found = found
        self.needed = needed
        detail = (
            f"not enough history for {service!r}: found {found} non-overlapping baseline "
            f"window{'s' if found != 1 else ''}, a recommendation needs at least {needed}"
        )
        super().__init__(f"{detail} ({why})" if why else detail)

    @property
    def problem_extensions(self) -> dict[str, Any]:
        return {"service": self.service, "windows_found": self.found, "windows_needed": self.needed}


@dataclass(frozen=True)
class BaselineWindow:
    """The baseline's numbers over one window, from one decisions entry."""

    experiment: str
    ts: float
    window_sec: int
    window_start: float  # the span the collector's window actually held
    window_end: float
    count: int
    failures: int
    latency_ms: float  # the percentile the recommendation is for

    @property
    def failure_ratio(self) -> float:
        return self.failures / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "ts": self.ts,
            "window_sec": self.window_sec,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "count": self.count,
            "failures": self.failures,
            "failure_ratio": self.failure_ratio,
            "latency_ms": self.latency_ms,
        }


def _parse(
    entry: Mapping[str, str], experiments: Collection[str], field: str, min_samples: int
) -> BaselineWindow | None:
    """The entry's baseline window, or None when it is not one to learn from."""
    if entry.get("kind") != "snapshot" or entry.get("experiment") not in experiments:
        return None
    try:
        baseline = json.loads(entry["variants"])[BASELINE]
        ts = float(entry["ts"])
        window = BaselineWindow(
            experiment=entry["experiment"],
            ts=ts,
            window_sec=int(entry["window_sec"]),
            window_start=float(entry.get("window_start") or ts - int(entry["window_sec"])),
            window_end=float(entry.get("window_end") or ts),
            count=int(baseline["count"]),
            failures=int(baseline["failures"]),
            latency_ms=float(baseline[field]),
        )
    except (KeyError, TypeError, ValueError):
        return None  # malformed, or no baseline percentile (an empty window)
    if window.count < min_samples or window.window_sec <= 0 or not math.isfinite(window.ts):
        return None  # a percentile from a handful of samples is noise
    return window


def baseline_windows(
    entries: Iterable[Mapping[str, str]],
    experiments: Collection[str],
    *,
    percentile: float,
    min_samples: int,
    limit: int = MAX_WINDOWS,
) -> list[BaselineWindow]:
    """Non-overlapping baseline windows of `experiments`, oldest first, the newest `limit`.

    Walks back from the newest entry and keeps one only if it ended before the last
    kept window began (ts <= kept.ts - kept.window_sec).
    """
    field = PERCENTILE_FIELDS[percentile]
    parsed = (_parse(e, experiments, field, min_samples) for e in entries)
    candidates = sorted((w for w in parsed if w is not None), key=lambda w: w.ts, reverse=True)
    kept: list[BaselineWindow] = []
    for window in candidates:
        if len(kept) >= limit:
            break
        if not kept or window.ts <= kept[-1].ts - kept[-1].window_sec:
            kept.append(window)
    kept.reverse()
    return kept


def quantile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 to 100) by linear interpolation between order statistics.

    The same definition as numpy's default ("linear"), so the numbers can be checked
    with a one-liner.
    """
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    count: int
    min: float
    median: float
    p95: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        return cls(
            count=len(values),
            min=min(values),
            median=quantile(values, 50),
            p95=quantile(values, 95),
            max=max(values),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "min": self.min,
            "median": self.median,
            "p95": self.p95,
            "max": self.max,
        }


@dataclass(frozen=True)
class Recommendation:
    service: str
    threshold_ms: float
    failure_ratio: float
    percentile: float
    min_samples: int
    windows: tuple[BaselineWindow, ...]
    latency: Summary
    failures: Summary

    def to_dict(self, *, with_windows: bool = False) -> dict[str, Any]:
        """JSON-ready: the proposal first, then the numbers it came from."""
        data: dict[str, Any] = {
            "service": self.service,
            "threshold_ms": self.threshold_ms,
            "failure_ratio": self.failure_ratio,
            "percentile": self.percentile,
            "windows": len(self.windows),
            "window_sec": sorted({w.window_sec for w in self.windows}),
            "experiments": sorted({w.experiment for w in self.windows}, key=_numeric_first),
            "from_ts": self.windows[0].ts,
            "to_ts": self.windows[-1].ts,
            "min_samples": self.min_samples,
            "latency": {
                "metric": f"baseline {PERCENTILE_FIELDS[self.percentile]} per window",
                "summary": self.latency.to_dict(),
                "quantile": LATENCY_QUANTILE,
                "multiplier": LATENCY_MULTIPLIER,
            },
            "failures": {
                "metric": "baseline failure_ratio per window",
                "summary": self.failures.to_dict(),
                "quantile": FAILURE_QUANTILE,
                "multiplier": FAILURE_MULTIPLIER,
                "floor": FAILURE_FLOOR,
                "cap": FAILURE_CAP,
            },
        }
        if with_windows:
            data["per_window"] = [w.to_dict() for w in self.windows]
        return data


def _numeric_first(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (2**63, name)


def _round_up(value: float, digits: int) -> float:
    """Rounded up, so rounding never tightens the proposed bound below the computed one."""
    scale = 10.0**digits
    return math.ceil(round(value * scale, 9)) / scale


def recommend(
    service: str,
    windows: Sequence[BaselineWindow],
    *,
    percentile: float,
    min_samples: int,
    min_windows: int = MIN_WINDOWS,
) -> Recommendation:
    """Propose threshold_ms and failure_ratio; NotEnoughHistory below `min_windows`."""
    if len(windows) < min_windows:
        raise NotEnoughHistory(service, len(windows), min_windows)
    latencies = [w.latency_ms for w in windows]
    ratios = [w.failure_ratio for w in windows]
    threshold = quantile(latencies, LATENCY_QUANTILE) * LATENCY_MULTIPLIER
    failure = min(
        max(quantile(ratios, FAILURE_QUANTILE) * FAILURE_MULTIPLIER, FAILURE_FLOOR), FAILURE_CAP
    )
    return Recommendation(
        service=service,
        threshold_ms=_round_up(threshold, 1),
        failure_ratio=min(_round_up(failure, 4), FAILURE_CAP),
        percentile=percentile,
        min_samples=min_samples,
        windows=tuple(windows),
        latency=Summary.of(latencies),
        failures=Summary.of(ratios),
    )
