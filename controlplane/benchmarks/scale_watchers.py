"""One process of simulated sidecars for `canary bench scale`: route watchers on etcd.

    python -m controlplane.benchmarks.scale_watchers ETCD PREFIX SERVICE COUNT

Opens COUNT etcd clients, each with its own `RouteWatcher` on the service's route
(what a sidecar process runs: one watch of its own), prints `ready` once every one
has read the key, then `stop` on stdin ends it: it prints one JSON line, when each
watcher applied each route revision (epoch seconds) and this process's CPU seconds
from `ready` to `stop`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.routes import Route
from sidecar.routing import RouteTable, RouteWatcher

LOAD_TIMEOUT_SEC = 120.0


class TimedTable(RouteTable):
    """A route table that notes when each route revision was put in force."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: dict[int, float] = {}

    def apply(self, route: Route | None) -> None:
        super().apply(route)
        if route is not None:
            self.applied.setdefault(route.revision, time.time())


async def _watch(etcd: str, prefix: str, service: str, count: int) -> dict[str, object]:
    stores: list[KeyValueStore] = [open_kv(etcd) for _ in range(count)]
    tables = [TimedTable() for _ in range(count)]
    watchers = [
        RouteWatcher(store, table, service=service, prefix=prefix)
        for store, table in zip(stores, tables, strict=True)
    ]
    try:
        for watcher in watchers:
            watcher.start()
        loaded = await asyncio.gather(*(w.wait_loaded(LOAD_TIMEOUT_SEC) for w in watchers))
        print("ready" if all(loaded) else "not-ready", flush=True)
        cpu = time.process_time()
        await asyncio.to_thread(sys.stdin.readline)
        cpu = time.process_time() - cpu
        applied: dict[str, list[float]] = {}
        for table in tables:
            for revision, at in table.applied.items():
                applied.setdefault(str(revision), []).append(at)
        return {"applied": applied, "cpu_s": cpu, "watchers": count}
    finally:
        for watcher in watchers:
            await watcher.stop()
        for store in stores:
            await store.close()


def main() -> None:
    etcd, prefix, service, count = sys.argv[1:5]
    print(json.dumps(asyncio.run(_watch(etcd, prefix, service, int(count)))), flush=True)


if __name__ == "__main__":
    main()
