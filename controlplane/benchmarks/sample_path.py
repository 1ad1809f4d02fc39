"""`canary bench sample-path`: what recording a sample costs the sidecar, per sample.

The proxy hands its finished requests to the `SampleReporter` every 256 of them
(`SAMPLE_FLUSH_COUNT`), and the reporter turns them into batches
(`BatchBuilder.add_columns`). This measures that step alone, in flushes of 256
samples of one experiment and two variants, as a proxy's are:

- `reporter`: the reporter's whole step (`record_columns`, or `record_many` with
  tuples in a revision that has no columns), batches sealed and encoded every 512;
- `add_columns`: the builder's conversion of the columns alone;
- `add`: the builder's per-sample path, for comparison.

Each as CPU µs per sample (best of 5), and as instructions per sample under
callgrind when valgrind is installed (a run of N flushes minus a run of none). With
`CANARY_BENCH_BEFORE=<git revision>` the same driver runs that revision's code too.
The driver runs as a script (`python sample_path.py WHAT FLUSHES`), so that a
revision unpacked elsewhere is imported in its place through PYTHONPATH.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FLUSH = 256
SCRIPT = Path(__file__).resolve()
WHATS = ("reporter", "add_columns", "add")


def _columns() -> tuple[list[float], list[str], list[int], list[int], list[int], list[int]]:
    """One flush's samples, column by column: two variants, mostly 200, no unit."""
    rng = random.Random(1)
    ts = [1_800_000_000.0 + i * 2e-5 for i in range(FLUSH)]
    variants = ["canary" if rng.random() < 0.1 else "baseline" for _ in range(FLUSH)]
    rt_us = [rng.randrange(200, 50_000) for _ in range(FLUSH)]
    outcomes = [503 if rng.random() < 0.01 else 200 for _ in range(FLUSH)]
    units = [0] * FLUSH
    first = [rt // 2 for rt in rt_us]
    return ts, variants, rt_us, outcomes, units, first


def _step(what: str) -> Callable[[], None]:
    """One flush's worth of the step `what`, as this tree's code does it."""
    from controlplane.kernel.clock import FakeClock
    from controlplane.kernel.codec import BatchBuilder
    from sidecar.reporter import SampleReporter

    ts, variants, rt_us, outcomes, units, first = _columns()
    if what == "add":

        def add() -> None:
            builder = BatchBuilder()
            for sample in zip(ts, variants, rt_us, outcomes, units, first, strict=True):
                builder.add(*sample)

        return add
    if what == "add_columns":
        return lambda: BatchBuilder().add_columns(ts, variants, rt_us, outcomes, units, first)
    # never started: batches are sealed and wait in its buffer, which drops the oldest
    reporter = SampleReporter(None, "svc", clock=FakeClock(), buffer_batches=4)  # type: ignore[arg-type]
    experiments: list[str | None] = ["1"] * FLUSH
    record_columns = getattr(reporter, "record_columns", None)
    if record_columns is None:  # a revision before columns: tuples
        rows = list(zip(ts, experiments, variants, rt_us, outcomes, units, first, strict=True))
        return lambda: reporter.record_many(rows)
    from sidecar.choice import SampleColumns

    # the proxy hands over new lists each flush; copies stand for them
    return lambda: record_columns(
        SampleColumns(ts[:], experiments[:], variants[:], rt_us[:], outcomes[:], units[:],
                      first[:])
    )  # fmt: skip


def _drive(what: str, flushes: int, repeats: int) -> float:
    """Best CPU µs per sample over `repeats` runs of `flushes` flushes."""
    step = _step(what)
    step()  # imports, first batch
    # what the imports left is not this step's garbage: a full collection of it
    # falling into a short run would count thousands of instructions per sample
    gc.collect()
    gc.freeze()
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(flushes):
            step()
        best = min(best, (time.process_time() - started) / max(flushes * FLUSH, 1) * 1e6)
    return best


def _main(argv: list[str]) -> None:
    what, flushes = argv[0], int(argv[1])
    print(f"{_drive(what, flushes, 1 if 'once' in argv else 5):.4f}")


# --- the benchmark -------------------------------------------------------------


def _script(tree: Path | None, args: list[str], valgrind: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree if tree is not None else SCRIPT.parents[2])}
    command = [sys.executable, str(SCRIPT), *args]
    if valgrind is not None:
        command = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return done.stdout + done.stderr


def _instructions(tree: Path | None, valgrind: str, what: str, flushes: int) -> int:
    from controlplane.benchmarks.callgrind import instructions_per

    per_flush = instructions_per(flushes, lambda n: _script(tree, [what, str(n), "once"], valgrind))
    return round(per_flush / FLUSH)


def _measure(tree: Path | None, *, flushes: int, valgrind: str | None) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for what in WHATS:
        out = _script(tree, [what, str(flushes)])
        figures[f"{what}_cpu_us_per_sample"] = float(out.split()[-1])
        if valgrind is not None:
            count = max(flushes // 20, 10)
            figures[f"{what}_instructions_per_sample"] = _instructions(tree, valgrind, what, count)
    return figures


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    # here, not at the top: the driver runs with another revision's tree on the path
    from controlplane.benchmarks.revision import measure_before

    flushes = 200 if quick else 2_000
    valgrind = shutil.which("valgrind")
    result: dict[str, Any] = {
        "benchmark": "sample-path",
        "quick": quick,
        "samples_per_flush": FLUSH,
        "flushes": flushes,
    }
    if progress:
        print("[now] sample path ...", file=sys.stderr, flush=True)
    result["now"] = _measure(None, flushes=flushes, valgrind=valgrind)

    def before(tree: Path) -> dict[str, Any]:
        if progress:
            print("[before] sample path ...", file=sys.stderr, flush=True)
        return _measure(tree, flushes=flushes, valgrind=valgrind)

    measure_before(result, before)
    return result


if __name__ == "__main__":
    # run as a script, this file's folder comes first on sys.path, and its
    # `sidecar.py` would hide the `sidecar` package: PYTHONPATH says which one
    if sys.path and Path(sys.path[0]).resolve() == SCRIPT.parent:
        sys.path.pop(0)
    _main(sys.argv[1:])
