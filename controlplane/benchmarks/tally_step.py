"""A long step's looks, in-process: the CPU of each look's tally work and the size of
what it stores, look after look.

Each look adds one disjoint 10 s window, as the rollout does when a round catches up:
the step's `Tally` (canary and baseline), the `SrmTally` and its unit split, the
`RampSplit`, the merged snapshots a decision reads, and the three values' JSON text.
The windows are the cold round's feed (50 requests a second, a tenth of them in the
canary at 10%), from a population of users whose hash decides their arm, with the
collector's 512-sample reservoir and the units' bottom-k sketches.

Run the file with PYTHONPATH at one checkout, then at another, in turn, to compare
their implementations: `python controlplane/benchmarks/tally_step.py --looks 200`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from typing import Any

import numpy as np

from controlplane.decision.ramp_split import RampSplit
from controlplane.decision.stats import unit_split
from controlplane.decision.tally import SrmTally, Tally
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.units import (
    BLOCK_COLUMNS,
    DISTINCT_K,
    UNIT_BLOCKS,
    UnitSummary,
    bottom_distinct,
)

WINDOW_SEC = 10.0
RATE = 50  # requests a second
CANARY_BP = 1000
USERS = 20_000
RESERVOIR = 512
T0 = 1_800_000_000.0
# a look's parts, timed in turn
PARTS = ("tally", "srm", "ramp", "snapshots", "json")


def _window(
    rng: np.random.Generator, users: np.ndarray, start: float, variant: str, canary: bool
) -> WindowSnapshot:
    arm = (users % 10_000 < CANARY_BP) == canary
    mine = users[arm]
    n = int(rng.binomial(int(RATE * WINDOW_SEC), arm.mean()))
    who = mine[rng.zipf(1.3, n) % mine.shape[0]] if n else mine[:0]
    rt = rng.lognormal(math.log(40.0), 0.5, n)
    take = rng.permutation(n)[:RESERVOIR]
    rows = np.zeros((UNIT_BLOCKS + 1, BLOCK_COLUMNS))
    np.add.at(rows[:, 0], 1 + (who >> 26).astype(np.int64), 1.0)
    units = UnitSummary.from_arrays(rows, bottom_distinct([who], DISTINCT_K))
    q = np.quantile(rt, [0.5, 0.9, 0.95, 0.99, 0.999]) if n else [None] * 5
    return WindowSnapshot(
        experiment="e",
        variant=variant,
        count=n,
        failures=0,
        window_sec=int(WINDOW_SEC),
        ts=start + WINDOW_SEC,
        window_start=start,
        window_end=start + WINDOW_SEC,
        threshold_ms=300.0,
        above_threshold=int((rt > 300.0).sum()),
        reservoir_ms=tuple(rt[take].tolist()),
        reservoir_units=tuple(who[take].astype(np.int64).tolist()),
        units=units,
        p50_ms=q[0],
        p90_ms=q[1],
        p95_ms=q[2],
        p99_ms=q[3],
        p999_ms=q[4],
    )


def run(looks: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    users = np.unique(rng.integers(1, 2**32, USERS, dtype=np.uint32))
    rng.shuffle(users)
    windows = [
        (
            _window(rng, users, T0 + i * WINDOW_SEC, "canary", True),
            _window(rng, users, T0 + i * WINDOW_SEC, "baseline", False),
        )
        for i in range(looks)
    ]
    tally = Tally.starting(T0)
    srm = SrmTally.starting(T0, T0)
    ramp = RampSplit()
    cpu: list[float] = []
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    sizes: list[int] = []
    for canary, baseline in windows:
        marks = [time.process_time()]
        tally = tally.add(canary, baseline)
        marks.append(time.process_time())
        srm = srm.add(
            baseline.count, canary.count, canary.window_end, (baseline.units, canary.units)
        )
        assert srm.baseline_units is not None and srm.canary_units is not None
        unit_split(srm.baseline_units, srm.canary_units, CANARY_BP, full=DISTINCT_K)
        marks.append(time.process_time())
        assert baseline.units is not None and canary.units is not None
        ramp = ramp.observe(
            baseline.units.distinct, canary.units.distinct, CANARY_BP, seconds=WINDOW_SEC
        )
        marks.append(time.process_time())
        tally.snapshots("e")
        marks.append(time.process_time())
        text = json.dumps([tally.to_dict(), srm.to_dict(), ramp.to_dict()])
        marks.append(time.process_time())
        for part, a, b in zip(PARTS, marks[:-1], marks[1:], strict=True):
            parts[part].append(b - a)
        cpu.append(marks[-1] - marks[0])
        sizes.append(len(text))
    blocks = {}
    for first in range(0, looks, 10):
        ten = cpu[first : first + 10]
        blocks[f"{first + 1}-{first + len(ten)}"] = {
            "median_ms": round(statistics.median(ten) * 1000, 4),
            "median_ms_without_json": round(
                statistics.median(
                    c - j for c, j in zip(ten, parts["json"][first : first + 10], strict=True)
                )
                * 1000,
                4,
            ),
            "state_bytes": sizes[first + len(ten) - 1],
        }
    return {
        "looks": looks,
        "median_ms_all": round(statistics.median(cpu) * 1000, 4),
        "total_ms": round(sum(cpu) * 1000, 2),
        "median_ms_by_part": {k: round(statistics.median(v) * 1000, 4) for k, v in parts.items()},
        "total_ms_by_part": {k: round(sum(v) * 1000, 2) for k, v in parts.items()},
        "reservoir": [len(tally.canary.reservoir_ms), len(tally.baseline.reservoir_ms)],
        "srm_units": [len(srm.baseline_units or ()), len(srm.canary_units or ())],
        "ramp_units": ramp.units,
        "by_ten_looks": blocks,
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--looks", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(run(args.looks, args.seed)))


if __name__ == "__main__":
    main()
