"""`canary bench round`: the CPU of one controller round per experiment, in-process.

N running experiments (1,000; 200 with `--quick`) in SQLite, their stats hashes on the
in-process board, written the way one collector writes them under the scale
benchmark's feed: a batch of 50 samples a second to each experiment (a tenth to the
canary), a full 10 s window. The clock is a fake one: rounds follow each other 0.25 s
apart (the controller's tick), and every fourth round each experiment's partial is
published again with a new second, so a round sees what a round of a leader keeping
its tick sees. With a batch every tick instead (`format_2_batch_every_tick`: a quarter
of the second's samples at each 0.25 s, as a collector publishing at its 0.1 s tick
under steady traffic leaves it), every look finds its current second changed.
Measured per partial format (1: the whole window in one field; 2: the
seconds that changed, decision 0058; 3: the same, a paired first byte without what it
shares with its total, decision 0072): the median CPU of a round per experiment, and
where it goes (cProfile over as many more rounds, cumulative time of the round's parts
per experiment and round: the profiler's overhead inflates them all). cProfile sees
the event loop's thread only; the round's CPU is also reported split into that thread's
and the other threads' (the SQL, run in worker threads).

No Redis, etcd or second process: the machine's load moves these figures less than
`canary bench scale`'s, and the breakdown is of the round alone.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import math
import os
import pstats
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from controlplane.benchmarks.cache_size import cache_bytes
from controlplane.benchmarks.gc_pauses import GcPauses

N = 1000
QUICK_N = 200
# the rounds run in this process: `canary bench` sets the garbage collector's policy
# `canary serve` runs them with (decision 0071)
HOSTS_LONG_RUNNING_PARTS = True
ROUNDS = 16
WINDOW_SEC = 10
FEED = 50
# the round's parts, by the function that does each (cumulative time)
PARTS = {
    "read, decode and merge the windows": "_read_windows",
    "of which: merging and snapshots": "merge_snapshots",
    "of which: decoding format 2 or 3 seconds": "assemble",
    "decide()": "decide",
    "commit the round's memory (SQL)": "_commit_memory",
    "history points": "observe",
}


def _batch(rng: np.random.Generator, n: int, now: float) -> Any:
    from controlplane.kernel.codec import BatchBuilder, decode_raw

    canary = np.arange(n) % 10 == 0
    rt = rng.lognormal(math.log(40_000), 0.5, n).astype(np.int64)
    builder = BatchBuilder()
    builder.add_columns(
        (now - 0.5 + 0.5 * np.arange(n) / n).tolist(),
        ["canary" if c else "baseline" for c in canary.tolist()],
        rt.tolist(), [200] * n, rng.integers(1, 2**32, n).tolist(), (rt // 4).tolist(),
    )  # fmt: skip
    return decode_raw(builder.encode())


async def _rounds(
    n: int, partial_format: int, rounds: int, every_tick: bool = False
) -> dict[str, Any]:
    from controlplane.benchmarks.scale import _create
    from controlplane.collector.second_partials import SlotLedger, export_head_and_seconds
    from controlplane.collector.sharding import export_partial, part_field
    from controlplane.collector.windows import ExperimentWindow, WindowConfig
    from controlplane.controller.runner import Controller
    from controlplane.db.migrate import upgrade
    from controlplane.kernel.clock import FakeClock
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/round.db"
        upgrade(url)
        clock = FakeClock()
        backends = await open_backends(
            Settings(database_url=url, etcd="memory://", redis_url="memory://"), clock=clock
        )
        try:
            assert backends.board is not None
            board = backends.board
            experiments = [e for e, _ in await _create(backends, n, False)]
            rng = np.random.default_rng(7)
            t0 = clock.now()
            windows = {
                e: ExperimentWindow(e, WindowConfig(WINDOW_SEC, 250.0), clock_now=t0 - 12, seed=1)
                for e in experiments
            }
            ledgers = {e: SlotLedger() for e in experiments}

            async def publish(now: float) -> None:
                fields: dict[str, dict[str, str]] = {}
                for e, window in windows.items():
                    window.record(_batch(rng, FEED // 4 if every_tick else FEED, now), now)
                    if partial_format == 1:
                        partial = export_partial(window, now, collector="c1", unacked=[])
                        fields[e] = {part_field("c1"): json.dumps(partial)}
                    else:
                        fields[e] = export_head_and_seconds(
                            window, now, head=part_field("c1"), collector="c1", unacked=[],
                            ledger=ledgers[e], version=partial_format,
                        )  # fmt: skip
                        ledgers[e].sent()
                await board.write_many(fields)

            for k in range(WINDOW_SEC + 1):
                if every_tick:
                    for quarter in range(4):
                        await publish(t0 - WINDOW_SEC + k - 0.75 + quarter / 4)
                else:
                    await publish(t0 - WINDOW_SEC + k)
            controller = Controller(identity="bench-round")
            await controller.open(backends)
            await controller.evaluate_all(backends, None)  # warm: rule book, caches
            profile = cProfile.Profile()
            cpus: list[float] = []
            mains: list[float] = []
            pauses = GcPauses()
            pauses.start()
            # the figure from rounds without the profiler, the breakdown from as many
            # more with it (its overhead inflates every part, not their shares)
            for r in range(2 * rounds):
                if r == rounds:
                    pauses.stop()
                clock.advance(0.25)
                if every_tick or r % 4 == 3:
                    await publish(clock.now())
                cpu = time.process_time()
                main = time.thread_time()
                if r >= rounds:
                    profile.enable()
                await controller.evaluate_all(backends, None)
                if r >= rounds:
                    profile.disable()
                else:
                    cpus.append(time.process_time() - cpu)
                    mains.append(time.thread_time() - main)
            cached = cache_bytes(controller.partial_cache)
            await controller.stop()
        finally:
            await backends.close()
    stats = pstats.Stats(profile)
    per = 1000.0 / (n * rounds)
    every = sum(entry[3] for key, entry in stats.stats.items()  # type: ignore[attr-defined]
                if key[2] == "evaluate_all")  # fmt: skip
    parts: dict[str, float] = {}
    for label, function in PARTS.items():
        total = sum(
            entry[3] for key, entry in stats.stats.items()  # type: ignore[attr-defined]
            if key[2] == function
        )
        parts[label] = round(total * per, 4)
    parts["the whole round (profiled)"] = round(every * per, 4)
    others = [c - m for c, m in zip(cpus, mains, strict=True)]
    return {
        "cpu_ms_per_experiment_round": round(statistics.median(cpus) * 1000 / n, 4),
        # the median is a look at nothing new when three rounds in four are: the mean
        # weighs the fresh looks as a leader's CPU does
        "cpu_ms_per_experiment_round_mean": round(statistics.fmean(cpus) * 1000 / n, 4),
        # the process's CPU split: the event loop's thread, and the rest (the SQL done
        # in the worker threads, which the profile below never sees)
        "main_thread_ms_per_experiment_round": round(statistics.median(mains) * 1000 / n, 4),
        "other_threads_ms_per_experiment_round": round(
            statistics.median(others) * 1000 / n, 4
        ),
        "cpu_ms_per_experiment_round_each": [round(c * 1000 / n, 4) for c in cpus],
        "profiled_ms_per_experiment_round": parts,
        # the garbage collector's pauses during the unprofiled rounds
        "gc_pauses": pauses.figures(),
        # the arrays the controller keeps between looks (decoded seconds, running sums)
        "partial_cache": cached,
    }


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    n = QUICK_N if quick else N
    load_before = os.getloadavg()
    result: dict[str, Any] = {}
    for partial_format in (1, 2, 3, 4):
        result[f"format_{partial_format}"] = asyncio.run(_rounds(n, partial_format, ROUNDS))
        if progress:
            print(f"format {partial_format}: {result[f'format_{partial_format}']}")
    result["format_2_batch_every_tick"] = asyncio.run(_rounds(n, 2, ROUNDS, every_tick=True))
    if progress:
        print(f"format 2, a batch every tick: {result['format_2_batch_every_tick']}")
    return {
        "benchmark": "round",
        "n": n,
        "rounds": ROUNDS,
        "feed_samples_per_experiment_s": FEED,
        "window_sec": WINDOW_SEC,
        "load_avg": {"before": list(load_before), "after": list(os.getloadavg())},
        "cpus": os.cpu_count(),
        **result,
    }
