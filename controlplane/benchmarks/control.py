"""`canary bench control`: API action → route in etcd → applied by a sidecar, end to end.

The API answers once the action's state and desired route are committed; the leader's
reconciler, woken by the commit, writes the route to etcd; a sidecar's route watcher
applies it. Measured in one process with the real parts, on real PostgreSQL and etcd:
the API app with its controller (leading, so reconciling) under default settings, a
`RouteWatcher` as `canary sidecar` runs it, and an HTTP client on the app.

For each action (pause and resume, alternating): the time to the API's answer, and
the time until the sidecar's table holds the route revision the answer names.

URLs: CANARY_BENCH_DATABASE_URL (a PostgreSQL server; the bench creates a database
of its own there and drops it after, default postgresql://postgres@127.0.0.1:5432/postgres)
and CANARY_BENCH_ETCD (default http://127.0.0.1:2379; a prefix of its own).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.kernel.routes import Route

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_ETCD = "http://127.0.0.1:2379"
TARGET_P99_MS = 300.0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(_quantile(values, 0.50), 2),
        "p90_ms": round(_quantile(values, 0.90), 2),
        "p99_ms": round(_quantile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
        "mean_ms": round(statistics.fmean(values), 2),
    }


def _holds(revision: int) -> Callable[[Route | None], bool]:
    return lambda route: route is not None and route.revision >= revision


async def _measure(database_url: str, etcd: str, actions: int, progress: bool) -> dict[str, Any]:
    import httpx

    from controlplane.api.app import create_app
    from controlplane.controller.runner import Controller
    from controlplane.db import migrate
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends
    from sidecar.routing import RouteTable, RouteWatcher

    prefix = f"/canary-bench-{secrets.token_hex(4)}"
    settings = Settings(database_url=database_url, etcd=etcd, etcd_prefix=prefix)
    migrate.upgrade(database_url)
    backends = await open_backends(settings, streams=False)
    controller = Controller(identity="bench")
    app = create_app(settings, backends=backends, services=[controller], insecure=True)
    watcher = RouteWatcher(backends.kv, RouteTable(), service="bench-api", prefix=prefix)
    answer_ms: list[float] = []
    applied_ms: list[float] = []
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as api:
                while not controller.stats.leader:
                    await asyncio.sleep(0.01)
                created = await api.post("/v1/experiments", json={
                    "name": "bench", "service": "bench-api",
                    "variants": {"baseline": {"upstream": "http://127.0.0.1:9001"},
                                 "canary": {"upstream": "http://127.0.0.1:9002"}},
                    "steps": [{"weight_pct": 5, "hold_sec": 3600}],
                })
                created.raise_for_status()
                eid = created.json()["id"]
                watcher.start()
                for i in range(actions + 1):
                    action = "start" if i == 0 else ("pause" if i % 2 else "resume")
                    began = time.perf_counter()
                    answer = await api.post(f"/v1/experiments/{eid}/{action}", json={})
                    answered = time.perf_counter()
                    answer.raise_for_status()
                    revision = answer.json()["route_revision"]
                    ok = await watcher.wait_for(_holds(revision), 10.0)
                    done = time.perf_counter()
                    if not ok:
                        raise RuntimeError(f"route revision {revision} never reached the sidecar")
                    if i == 0:
                        continue  # the start also loads the watcher: not a steady figure
                    answer_ms.append((answered - began) * 1000)
                    applied_ms.append((done - began) * 1000)
                    if progress and i % 50 == 0:
                        print(f"  {i}/{actions} actions", file=sys.stderr)
    finally:
        await watcher.stop()
        await backends.close()
    applied = _summary(applied_ms)
    return {
        "benchmark": "control",
        "actions": len(applied_ms),
        "api_answer": _summary(answer_ms),
        "action_to_sidecar": applied,
        "target_p99_ms": TARGET_P99_MS,
        "meets_target": applied["p99_ms"] <= TARGET_P99_MS,
        "settings": {"full_pass_sec": controller.reconciler.full_pass_sec,
                     "tick": controller.tick},
        "backends": {"database": "postgresql", "etcd": etcd},
    }


def run(*, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    server = os.environ.get("CANARY_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    etcd = os.environ.get("CANARY_BENCH_ETCD", DEFAULT_ETCD)
    actions = 40 if quick else 400
    from controlplane.db.scratch import scratch_database

    with scratch_database(server, tag="canary_bench") as url:
        return asyncio.run(_measure(url, etcd, actions, progress))
