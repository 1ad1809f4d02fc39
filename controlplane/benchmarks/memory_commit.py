"""`canary bench memory`: what a round's memory commit costs the database, look by look.

N running experiments on PostgreSQL (a scratch database on `CANARY_BENCH_DATABASE_URL`'s
server, dropped after) and on SQLite, each with the rollout memory of a step: early (10
windows in its tally) and late (150 windows: the tally, the sample-ratio tally and the
ramp's ledger at their caps, ~240 KB as JSON). A window's worth of looks (40 at the
0.25 s tick over a 10 s window) is committed with the store's `save_states`, as the
controller commits a round: every look moves the look's fields (the last snapshot's
time, the breach streak, the reason), and only the first adds a window to the evidence.

Two ways, in turn on the same rows:

- **every look writes the evidence**: what every look wrote before decision 0068 (the
  whole memory; here in its two tables);
- **the evidence when it changed**: as the controller commits since 0068 (the parts'
  identity tells which looks added a window).

Per look and experiment: wall time (the database's work included: it runs on this
machine), the process's CPU, the JSON text sent, and on PostgreSQL the write-ahead log
written (`pg_current_wal_lsn`), which counts what the server wrote whoever sent it.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
N = 200
QUICK_N = 40
LOOKS = 40  # a 10 s window at the 0.25 s tick
EARLY_WINDOWS = 10
LATE_WINDOWS = 150
PAIRS = 2  # each way run this many times, in turn
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _evidence(windows: int, seed: int) -> tuple[Any, Any, Any, Any]:
    """A step's tally, sample-ratio tally and ramp ledger after `windows` windows of the
    cold round's feed (the long-step rig of decision 0066), and the tally a window
    before."""
    from controlplane.benchmarks.tally_step import CANARY_BP, T0, USERS, WINDOW_SEC, _window
    from controlplane.decision.ramp_split import RampSplit
    from controlplane.decision.tally import SrmTally, Tally

    rng = np.random.default_rng(seed)
    users = np.unique(rng.integers(1, 2**32, USERS, dtype=np.uint32))
    rng.shuffle(users)
    tally, srm, ramp = Tally.starting(T0), SrmTally.starting(T0, T0), RampSplit()
    before = tally
    for i in range(windows):
        before = tally
        canary = _window(rng, users, T0 + i * WINDOW_SEC, "canary", True)
        baseline = _window(rng, users, T0 + i * WINDOW_SEC, "baseline", False)
        tally = tally.add(canary, baseline)
        assert baseline.units is not None and canary.units is not None
        srm = srm.add(
            baseline.count, canary.count, canary.window_end, (baseline.units, canary.units)
        )
        ramp = ramp.observe(
            baseline.units.distinct, canary.units.distinct, CANARY_BP, seconds=WINDOW_SEC
        )
    return tally, srm, ramp, before


def _memories(windows: int, seed: int) -> list[dict[str, Any]]:
    """The memory of each of LOOKS looks: the evidence moves at the first (a window
    added), the look's fields at every one."""
    from controlplane.benchmarks.tally_step import T0
    from controlplane.decision.model import Step
    from controlplane.decision.rollout import start

    tally, srm, ramp, before = _evidence(windows, seed)
    state = start((Step(10.0, 600.0),), T0).new_state
    found = []
    for look in range(LOOKS):
        moved = replace(
            state,
            tally=tally,
            srm_tally=srm,
            ramp_split=ramp,
            last_snapshot_ts=T0 + 0.25 * look,
            consecutive_breaches=look % 3,
        )
        memory = {
            **moved.to_dict(),
            "next_check_at": T0 + 0.25 * (look + 1),
            "last_reason": f"look {look}: within the rule (P95 41.2 ms ≤ 250 ms)",
        }
        found.append(memory)
    # the look before the window: its own tally, so the first look writes the new one
    found.insert(0, {**found[0], "tally": before.to_dict()})
    return found


async def _commit_looks(
    url: str, n: int, memories: list[dict[str, Any]], split: bool, tag: str
) -> dict[str, Any]:
    from controlplane.db.session import Database, make_engine
    from controlplane.db.store import SqlExperimentStore
    from controlplane.experiments.lifecycle import ExperimentState
    from controlplane.experiments.memory_parts import same_evidence, split_memory
    from controlplane.experiments.store import ExperimentSpec, StepSpec
    from controlplane.kernel import json_text

    database = Database(make_engine(url))
    store = SqlExperimentStore(database)
    postgres = database.engine.dialect.name == "postgresql"
    try:
        async with store.transaction() as tx:
            records = [
                replace(
                    await tx.create_experiment(
                        spec=ExperimentSpec(
                            name="v2", service=f"svc-{tag}-{k}",
                            baseline_upstream="http://127.0.0.1:9001",
                            canary_upstream="http://127.0.0.1:9002", steps=(StepSpec(1000, 600),),
                            sticky_header="x-user-id", sticky_cookie=None, rule=None,
                        ),
                        salt="s", now=AT,
                    ),
                    state=ExperimentState.RUNNING,
                )
                for k in range(n)
            ]  # fmt: skip
        # the look before the window, written whole: the rows as a round finds them
        records = await _write(store, records, memories[0], None)
        walls: list[float] = []
        cpus: list[float] = []
        sent = 0
        wal_start = _wal(database) if postgres else None
        previous = memories[0]
        for look, memory in enumerate(memories[1:]):
            kept = split and same_evidence(previous, memory)
            look_part, evidence = split_memory(memory)
            sent += n * len(json_text.dumps(look_part))
            if not kept:
                sent += n * len(json_text.dumps(evidence))
            at = AT + timedelta(seconds=0.25 * (look + 1))
            wall, cpu = time.perf_counter(), time.process_time()
            records = await _write(store, records, memory, [kept] * n, at)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            previous = memory
        wal = _wal(database) - wal_start if wal_start is not None else None
    finally:
        database.dispose()
    looks = len(walls)
    return {
        "wall_ms_per_experiment_look": round(sum(walls) * 1000 / (n * looks), 4),
        "wall_ms_per_experiment_look_median_round": round(
            statistics.median(walls) * 1000 / n, 4
        ),
        "cpu_ms_per_experiment_look": round(sum(cpus) * 1000 / (n * looks), 4),
        "json_bytes_per_experiment_look": round(sent / (n * looks)),
        "wal_bytes_per_experiment_look": None if wal is None else round(wal / (n * looks)),
    }


async def _write(
    store: Any, records: list[Any], memory: dict[str, Any], stored: list[bool] | None,
    at: datetime = AT,
) -> list[Any]:
    decided = [replace(r, rollout_state=memory, updated_at=at) for r in records]
    async with store.transaction() as tx:
        written = await tx.save_states(experiments=decided, evidence_stored=stored)
    assert all(w is not None for w in written), "a row moved under the benchmark"
    return list(written)


def _wal(database: Any) -> int:
    with database.engine.connect() as conn:
        # the driver's own SQL: SQLAlchemy stays behind controlplane.db
        return int(conn.exec_driver_sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").scalar())


def _measure(url: str, n: int, memories: list[dict[str, Any]]) -> dict[str, Any]:
    from controlplane.db.migrate import upgrade

    upgrade(url)
    runs: dict[str, list[dict[str, Any]]] = {"every_look": [], "when_changed": []}
    for pair in range(PAIRS):
        # in turn, the order flipped each pair
        order = ("every_look", "when_changed") if pair % 2 == 0 else ("when_changed", "every_look")
        for way in order:
            runs[way].append(asyncio.run(
                _commit_looks(url, n, memories, way == "when_changed", f"{pair}{way[0]}")
            ))  # fmt: skip
    summary: dict[str, Any] = {"runs": runs}
    for key in ("wall_ms_per_experiment_look", "cpu_ms_per_experiment_look"):
        every = statistics.median(r[key] for r in runs["every_look"])
        changed = statistics.median(r[key] for r in runs["when_changed"])
        summary[key] = {"every_look": every, "when_changed": changed,
                        "ratio": round(every / changed, 2) if changed else None}  # fmt: skip
    for key in ("json_bytes_per_experiment_look", "wal_bytes_per_experiment_look"):
        every, changed = runs["every_look"][0][key], runs["when_changed"][0][key]
        summary[key] = {"every_look": every, "when_changed": changed}
    return summary


def run(*, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    from controlplane.db.scratch import scratch_database
    from controlplane.kernel import json_text

    n = QUICK_N if quick else N
    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "benchmark": "memory",
        "n": n,
        "looks_per_window": LOOKS,
        "pairs": PAIRS,
    }
    server = os.environ.get("CANARY_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    for stage, windows in (("early", EARLY_WINDOWS), ("late", LATE_WINDOWS)):
        memories = _memories(windows, seed=7)
        result[f"{stage}_memory_bytes"] = len(json_text.dumps(memories[-1]))
        with scratch_database(server, tag="canary_bench") as url:
            result[f"{stage}_postgresql"] = _measure(url, n, memories)
        if progress:
            wall = result[f"{stage}_postgresql"]["wall_ms_per_experiment_look"]
            print(f"{stage}, PostgreSQL: wall ms per experiment and look {wall}")
        with tempfile.TemporaryDirectory() as scratch:
            result[f"{stage}_sqlite"] = _measure(f"sqlite:///{scratch}/memory.db", n, memories)
        if progress:
            wall = result[f"{stage}_sqlite"]["wall_ms_per_experiment_look"]
            print(f"{stage}, SQLite: wall ms per experiment and look {wall}")
    result["load_avg"] = {"before": list(load_before), "after": list(os.getloadavg())}
    result["cpus"] = os.cpu_count()
    return result
