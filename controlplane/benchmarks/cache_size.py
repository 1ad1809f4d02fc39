"""What a controller's partial cache holds in arrays: the bytes of every distinct
numpy buffer reachable from its assembled partials (the runs' running sums, the
decoded seconds they were made of), per experiment."""

from __future__ import annotations

from typing import Any

import numpy as np

from controlplane.collector.second_partials import LatencyRun, PartialCache, SecondSums

_RUN_ARRAYS = (
    "seconds", "tallies", "sum_us", "hist", "stale_hist", "unit_counts", "unit_sums",
    "res_keys", "res_us", "res_seconds", "res_units", "distinct",
)  # fmt: skip
_SECOND_ARRAYS = (
    "hist", "unit_counts", "unit_sums", "res_keys", "res_us", "res_units", "distinct", "tally",
)  # fmt: skip


def _base(array: np.ndarray[Any, Any]) -> Any:
    """The buffer a view was taken from (a decoded field's rows share one: an array,
    or the bytes `np.frombuffer` read)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array if array.base is None else array.base


def cache_bytes(cache: PartialCache) -> dict[str, float]:
    seen: set[int] = set()
    total = 0

    def add(value: object) -> None:
        nonlocal total
        if not isinstance(value, np.ndarray):
            return
        base = _base(value)
        if id(base) in seen:
            return
        seen.add(id(base))
        total += int(getattr(base, "nbytes", len(base) if isinstance(base, bytes) else 0))

    runs: list[LatencyRun] = []
    for parts in cache.partials.values():
        for _, assembled in parts.values():
            for pair in assembled.runs.values():
                runs.extend(pair)
    for run in runs:
        for name in _RUN_ARRAYS:
            add(getattr(run, name))
        for second in run.rows:
            assert isinstance(second, SecondSums)
            for name in _SECOND_ARRAYS:
                add(getattr(second, name))
    experiments = max(1, len(cache.partials))
    return {"mb": round(total / 1e6, 1), "kb_per_experiment": round(total / 1e3 / experiments, 1)}
