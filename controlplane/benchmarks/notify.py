"""`canary bench notify`: what the notification outbox costs, and how fast it delivers.

1. Event writes (`ExperimentStore.append_event`, one committed transaction each): the
   reference is an event of a kind that is never announced (the outbox does no work
   for it); against it, in the same run and interleaved, an announced kind with no
   subscription (one indexed read), with 1 and with 5 subscriptions (a row each).
   Reported as medians and ratios to the reference.
2. Delivery, with the dispatcher `canary serve` runs (default settings) and a local
   receiver answering 200: commit-to-receipt latency of events written one by one
   across 10 experiments, and the drain rate of a backlog written while no
   dispatcher ran (in order per experiment: one request in flight per experiment).

On SQLite (a file in a temporary folder) and on PostgreSQL (CANARY_BENCH_DATABASE_URL:
a server where the bench creates a database of its own and drops it after, default
postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from controlplane.experiments.events import EventKind

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
EXPERIMENTS = 10


WAIT_SEC = 120.0


async def _until_received(receiver: _Receiver, events: set[int], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_SEC):
            while not events <= set(receiver.arrived):
                await asyncio.sleep(0.005)
    except TimeoutError:
        missing = len(events - set(receiver.arrived))
        raise RuntimeError(f"{what}: {missing} deliveries missing after {WAIT_SEC:g}s") from None


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Receiver:
    """An ASGI app that notes when each event id arrives."""

    def __init__(self) -> None:
        self.arrived: dict[int, float] = {}
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        self.requests += 1
        for name, value in scope["headers"]:
            if name == b"x-canary-event-id":
                self.arrived.setdefault(int(value), time.perf_counter())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _experiment(backends: Any, service: str) -> Any:
    from controlplane.experiments.store import ExperimentSpec, StepSpec
    from controlplane.kernel.clock import utc_now

    spec = ExperimentSpec(
        name=f"bench {service}", service=service, baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002", steps=(StepSpec(500, 60),),
        sticky_header="x-user-id", sticky_cookie=None, rule=None,
    )  # fmt: skip
    async with backends.store.transaction() as tx:
        return await tx.create_experiment(spec=spec, salt="bench", now=utc_now(backends.clock))


async def _subscribe(backends: Any, url: str, name: str, service: str | None) -> None:
    from controlplane.db import notifications as outbox
    from controlplane.kernel.clock import utc_now
    from controlplane.notify.records import Format, SubscriptionSpec
    from controlplane.notify.signing import new_secret

    async with backends.database.transaction() as tx:
        await tx.run(
            outbox.create_subscription,
            spec=SubscriptionSpec(name, url, service, (), Format.JSON, True),
            secret=new_secret(), created_by="bench", now=utc_now(backends.clock),
        )  # fmt: skip


async def _event(backends: Any, experiment: Any, kind: EventKind) -> int:
    from controlplane.kernel.clock import utc_now

    async with backends.store.transaction() as tx:
        event = await tx.append_event(
            experiment_id=experiment.id, service=experiment.service,
            at=utc_now(backends.clock), actor="bench", kind=kind, reason="bench",
            payload={"evidence": {"trips": 1}},
        )  # fmt: skip
    return int(event.id)


async def _write_cost(settings: Any, writes: int) -> dict[str, Any]:
    from controlplane.runtime import open_backends

    backends = await open_backends(settings, streams=False)
    try:
        never = "http://127.0.0.1:9/never-contacted"  # no dispatcher runs here
        await _subscribe(backends, never, "one", "bench-one")
        for i in range(5):
            await _subscribe(backends, never, f"five-{i}", "bench-five")
        cases = {
            "reference (kind not announced)": (await _experiment(backends, "bench-none"),
                                               EventKind.UPDATED),
            "announced, no subscription": (await _experiment(backends, "bench-none2"),
                                           EventKind.TRIPPED),
            "announced, 1 subscription": (await _experiment(backends, "bench-one"),
                                          EventKind.TRIPPED),
            "announced, 5 subscriptions": (await _experiment(backends, "bench-five"),
                                           EventKind.TRIPPED),
        }  # fmt: skip
        timings: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(writes):
            for name, (experiment, kind) in cases.items():
                began = time.perf_counter()
                await _event(backends, experiment, kind)
                timings[name].append((time.perf_counter() - began) * 1000)
    finally:
        await backends.close()
    reference = statistics.median(next(iter(timings.values())))
    return {
        name: {
            "median_ms": round(statistics.median(values), 3),
            "p99_ms": round(_quantile(values, 0.99), 3),
            "ratio_to_reference": round(statistics.median(values) / reference, 3),
        }
        for name, values in timings.items()
    }


async def _delivery(settings: Any, events: int, backlog: int) -> dict[str, Any]:
    import uvicorn

    from controlplane.notify.dispatcher import dispatcher_for
    from controlplane.runtime import open_backends

    receiver = _Receiver()
    config = uvicorn.Config(receiver, host="127.0.0.1", port=0, log_level="warning",
                            lifespan="off", ws="none")  # fmt: skip
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    backends = await open_backends(settings, streams=False)
    dispatcher = dispatcher_for(settings)
    try:
        await _subscribe(backends, f"http://127.0.0.1:{port}/hook", "bench", None)
        experiments = [await _experiment(backends, f"bench-{i}") for i in range(EXPERIMENTS)]
        # 1. one by one, the dispatcher running
        await dispatcher.start(backends)
        committed: dict[int, float] = {}
        for i in range(events):
            event_id = await _event(backends, experiments[i % EXPERIMENTS], EventKind.TRIPPED)
            committed[event_id] = time.perf_counter()
            await asyncio.sleep(0.02)
        await _until_received(receiver, set(committed), "one by one")
        latency = [(receiver.arrived[e] - t) * 1000 for e, t in committed.items()]
        await dispatcher.stop()
        # 2. a backlog written with no dispatcher, then drained
        queued = [await _event(backends, experiments[i % EXPERIMENTS], EventKind.STEP_ADVANCED)
                  for i in range(backlog)]  # fmt: skip
        drainer = dispatcher_for(settings)
        began = time.perf_counter()
        await drainer.start(backends)
        await _until_received(receiver, set(queued), "backlog")
        drained = time.perf_counter() - began
        await drainer.stop()
    finally:
        await dispatcher.stop()
        await backends.close()
        server.should_exit = True
        await serving
    return {
        "commit_to_receipt": {
            "events": len(latency),
            "p50_ms": round(_quantile(latency, 0.5), 1),
            "p99_ms": round(_quantile(latency, 0.99), 1),
            "max_ms": round(max(latency), 1),
        },
        "backlog_drain": {
            "deliveries": backlog,
            "experiments": EXPERIMENTS,
            "seconds": round(drained, 3),
            "deliveries_per_sec": round(backlog / drained, 1),
        },
        "poll_sec": dispatcher.poll_sec,
        "receiver_requests": receiver.requests,
    }


async def _measure(database_url: str, writes: int, events: int, backlog: int,
                   progress: bool) -> dict[str, Any]:  # fmt: skip
    from controlplane.db import migrate
    from controlplane.kernel.settings import Settings

    migrate.upgrade(database_url)
    settings = Settings(database_url=database_url, etcd="memory://", redis_url="memory://")
    if progress:
        print(f"  event writes on {settings.database_url.split(':')[0]}", file=sys.stderr)
    cost = await _write_cost(settings, writes)
    if progress:
        print("  deliveries", file=sys.stderr)
    delivery = await _delivery(settings, events, backlog)
    return {"event_write": cost, "delivery": delivery}


def run(*, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    from controlplane.db.scratch import scratch_database

    writes, events, backlog = (30, 30, 100) if quick else (300, 200, 1000)
    results: dict[str, Any] = {"benchmark": "notify"}
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        results["sqlite"] = asyncio.run(_measure(url, writes, events, backlog, progress))
    server = os.environ.get("CANARY_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    with scratch_database(server, tag="canary_bench") as url:
        results["postgresql"] = asyncio.run(_measure(url, writes, events, backlog, progress))
    return results
