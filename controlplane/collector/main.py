"""`canary collector`: the collector process with its admin endpoints.

The admin endpoints (collector/admin.py) answer from a thread of their own; the main
loop beats a heartbeat there, and /healthz fails once it is older than
`liveness_bound` seconds. SIGTERM (or SIGINT) stops reading, publishes and acks what
is held, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from controlplane.collector.admin import serve_admin
from controlplane.collector.pacing import COALESCE, PUBLISH_EVERY_SEC
from controlplane.collector.service import Collector
from controlplane.kernel.admin_access import admin_token
from controlplane.kernel.admin_thread import AdminThread, Heartbeat
from controlplane.kernel.backend_access import etcd_access, redis_access
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.gc_policy import export_gc_metrics, for_long_running_process
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.logs import configure_logging
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.settings import Settings, parse_host_port
from controlplane.kernel.signals import on_stop_signals
from controlplane.kernel.streams_factory import open_streams

log = logging.getLogger("canary.collector")
LIVENESS_BOUND_SEC = 30.0


def default_name() -> str:
    # unique per process: a restarted collector must not overwrite its predecessor's
    # partial window, which still holds samples that were acked
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def run_collector(
    settings: Settings,
    *,
    name: str | None,
    admin: str | None,
    tick: float,
    claim_idle_ms: int,
    publish_every: float = PUBLISH_EVERY_SEC,
    count: int,
    sample_keys: SampleKeys | None = None,
    liveness_bound: float = LIVENESS_BOUND_SEC,
) -> None:
    clock = SystemClock()
    streams, board = open_streams(
        settings.redis_url, namespace=settings.redis_namespace, clock=clock,
        access=redis_access(settings),
    )
    kv = open_kv(settings.etcd, clock=clock, access=etcd_access(settings))
    collector = Collector(
        streams, board, kv, EtcdKeys(settings.etcd_prefix),
        consumer_name=name or default_name(), clock=clock, tick=tick,
        publish_every=publish_every, coalesce=COALESCE, claim_idle_ms=claim_idle_ms,
        count=count,
        sample_keys=sample_keys,
        partial_format=settings.partial_format,
    )  # fmt: skip
    if sample_keys is None:
        log.warning("no sample keys configured: unsigned sample batches are accepted")
    else:
        log.info("sample batches verified with keys %s", ", ".join(sample_keys.kids))
    stop = asyncio.Event()
    heartbeat = Heartbeat(clock, bound=liveness_bound)
    server: AdminThread | None = None
    if admin:
        host, port = parse_host_port(admin)
        server = serve_admin(collector, host, port, heartbeat=heartbeat,
                             token=admin_token(settings.admin_token_file))  # fmt: skip
    beating = asyncio.create_task(heartbeat.run())
    export_gc_metrics(collector.metrics.registry)
    for_long_running_process()
    log.info("collector %s started", collector.name)
    try:
        with on_stop_signals(stop.set):
            await collector.run(stop)
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        if server is not None:
            server.stop()
        await streams.close()
        with contextlib.suppress(Exception):
            await board.close()
        await kv.close()
        log.info("collector %s stopped", collector.name)


def main(
    settings: Settings,
    *,
    name: str | None = None,
    admin: str | None = None,
    tick: float = 0.1,
    claim_idle_ms: int = 30_000,
    count: int = 200,
    sample_keys: SampleKeys | None = None,
    liveness_bound: float = LIVENESS_BOUND_SEC,
    publish_every: float = PUBLISH_EVERY_SEC,
) -> None:
    configure_logging(settings.log_level, settings.log_format)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is absent on Windows only
        runner = asyncio.run  # type: ignore[assignment]
    runner(
        run_collector(
            settings,
            name=name,
            admin=admin,
            tick=tick,
            claim_idle_ms=claim_idle_ms,
            publish_every=publish_every,
            count=count,
            sample_keys=sample_keys,
            liveness_bound=liveness_bound,
        )
    )
