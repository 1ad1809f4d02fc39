"""One experiment's look at its two windows, in-process: the controller's read of a
format 2 partial through its `PartialCache`, by what changed since the last look.

`canary bench round`'s feed (a 50-sample batch, a tenth to the canary, a 10 s window
and its 2 s fast window, one collector), a fake timeline of looks four times a second
and a publish twice a second. CPU per look (process time, the publishes not counted),
median over the seconds, for each kind of look:

- `new_second`: a new second started, nothing published yet (a second left the window);
- `published_new_second`: the collector published the new second's first batch (the
  head lists one more second, the oldest may have left);
- `published_same_second`: the collector published again within the second (one
  second field changed, the same seconds listed);
- `nothing_new`: the same fields in the same second.

Run: `python -m controlplane.benchmarks.window_look [seconds] [--no-looks]`. The
machine's load moves CPU times; instruction counts do not: under `valgrind
--tool=callgrind`, a run's count minus the same run's with `--no-looks` (the
publishes alone), divided by the seconds, is the looks' instructions per second.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

WINDOW_SEC = 10
FAST_SEC = 2
FEED = 50


def run(seconds: int = 300, *, looks: bool = True) -> dict[str, Any]:
    from controlplane.benchmarks.round import _batch
    from controlplane.collector.second_partials import (
        PartialCache,
        SlotLedger,
        export_head_and_seconds,
    )
    from controlplane.collector.sharding import parse_partials, part_field, snapshots_of_fields
    from controlplane.collector.windows import ExperimentWindow, WindowConfig

    rng = np.random.default_rng(7)
    t0 = 1_800_000_000.0
    window = ExperimentWindow("e", WindowConfig(WINDOW_SEC, 250.0), clock_now=t0 - 12, seed=1)
    ledger = SlotLedger()
    fields: dict[str, str] = {}
    cache = PartialCache()

    def publish(now: float) -> None:
        window.record(_batch(rng, FEED, now), now)
        fields.update(export_head_and_seconds(
            window, now, head=part_field("c1"), collector="c1", unacked=[], ledger=ledger
        ))  # fmt: skip
        ledger.sent()

    def look(now: float) -> float:
        if not looks:
            return 0.0
        cpu = time.process_time()
        partials = parse_partials(fields, cache=cache, experiment="e")
        snapshots_of_fields("e", fields, partials, now, window_sec=WINDOW_SEC, cache=cache)
        snapshots_of_fields("e", fields, partials, now, window_sec=FAST_SEC, cache=cache)
        return time.process_time() - cpu

    for k in range(WINDOW_SEC + 2):
        publish(t0 - WINDOW_SEC - 1 + k)
    look(t0 + 0.01)
    kinds: dict[str, list[float]] = {
        "new_second": [], "published_new_second": [], "published_same_second": [],
        "nothing_new": [],
    }  # fmt: skip
    for s in range(1, seconds + 1):
        t = t0 + s
        kinds["new_second"].append(look(t + 0.05))
        publish(t + 0.1)
        kinds["published_new_second"].append(look(t + 0.1))
        kinds["nothing_new"].append(look(t + 0.35))
        publish(t + 0.6)
        kinds["published_same_second"].append(look(t + 0.6))
    return {
        "benchmark": "window_look",
        "seconds": seconds,
        "load_avg": list(os.getloadavg()),
        "cpu_ms_per_look_median": {
            kind: round(statistics.median(cpus) * 1000, 4) for kind, cpus in kinds.items()
        },
    }


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    seconds = int(numbers[0]) if numbers else 300
    print(json.dumps(run(seconds, looks="--no-looks" not in sys.argv)))
