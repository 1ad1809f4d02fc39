"""`canary collector`: the collector process with its admin endpoints.

/healthz answers while the process runs; /readyz once the configuration is loaded
and the loop has completed a round recently (its body adds "samples unauthenticated"
while no sample keys are configured); /metrics is Prometheus text.
SIGTERM (or SIGINT) stops reading, publishes and acks what is held, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane.collector.service import Collector
from controlplane.kernel.admin_access import admin_token, allowed, header, warn_if_exposed
from controlplane.kernel.backend_access import etcd_access, redis_access
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.logs import configure_logging
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.settings import Settings, parse_host_port
from controlplane.kernel.signals import on_stop_signals
from controlplane.kernel.streams_factory import open_streams

log = logging.getLogger("canary.collector")
READY_STALE_SEC = 10.0


def default_name() -> str:
    # unique per process: a restarted collector must not overwrite its predecessor's
    # partial window, which still holds samples that were acked
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


_MAX_HEADERS = 100


async def _serve_admin(
    collector: Collector, host: str, port: int, *, token: str | None = None
) -> asyncio.Server:
    warn_if_exposed(host, token, log, "collector")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readline()
            lines = [request.rstrip(b"\r\n")]
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                if len(lines) > _MAX_HEADERS:
                    return
                lines.append(line.rstrip(b"\r\n"))
            path = request.split(b" ")[1].decode() if request.count(b" ") >= 2 else "/"
            path = path.split("?", 1)[0]
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            extra = ""
            if not allowed(path, header(b"\r\n".join(lines), b"authorization"), token):
                collector.metrics.admin_unauthorized.inc()
                status, body = "401 Unauthorized", b"unauthorized\n"
                extra = 'WWW-Authenticate: Bearer realm="canary-admin"\r\n'
            elif path == "/healthz":
                status, body = "200 OK", b"ok\n"
            elif path == "/readyz":
                last = collector.last_loop_ok
                fresh = last is not None and collector.clock.monotonic() - last < READY_STALE_SEC
                ready = collector.config_loaded.is_set() and fresh
                status = "200 OK" if ready else "503 Service Unavailable"
                body = b"ready" if ready else b"not ready"
                body += b"\n" if collector.authenticated else b" (samples unauthenticated)\n"
            elif path == "/metrics":
                status, ctype = "200 OK", CONTENT_TYPE_LATEST
                body = generate_latest(collector.metrics.registry)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (ConnectionError, IndexError, UnicodeDecodeError, ValueError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


async def run_collector(
    settings: Settings,
    *,
    name: str | None,
    admin: str | None,
    tick: float,
    claim_idle_ms: int,
    count: int,
    sample_keys: SampleKeys | None = None,
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
        claim_idle_ms=claim_idle_ms, count=count, sample_keys=sample_keys,
        partial_format=settings.partial_format,
    )  # fmt: skip
    if sample_keys is None:
        log.warning("no sample keys configured: unsigned sample batches are accepted")
    else:
        log.info("sample batches verified with keys %s", ", ".join(sample_keys.kids))
    stop = asyncio.Event()
    server = None
    if admin:
        host, port = parse_host_port(admin)
        server = await _serve_admin(
            collector, host, port, token=admin_token(settings.admin_token_file)
        )
    log.info("collector %s started", collector.name)
    try:
        with on_stop_signals(stop.set):
            await collector.run(stop)
    finally:
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
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
            count=count,
            sample_keys=sample_keys,
        )
    )
