"""The sidecar's admin endpoints on `--admin`: /healthz, /readyz, /metrics, and JSON
views such as /overload.

A few lines of asyncio rather than an ASGI server: it is off the data path, answers
a few GETs, and keeps a sidecar's start-up free of web-framework imports. Each
connection serves one request and closes.

Metrics come from a per-sidecar `CollectorRegistry` (never the process-global one,
so several sidecars in one test process do not collide); `SidecarCollector` reads
the reporter's and the watcher's counters at scrape time, as the proxy's own
collector does, so nothing on the request path touches prometheus-client.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from controlplane.kernel.admin_access import allowed, header, warn_if_exposed
from sidecar.reporter import SampleReporter
from sidecar.routing import RouteWatcher

log = logging.getLogger("canary.sidecar.admin")

_MAX_HEAD = 16 * 1024
_READ_TIMEOUT = 5.0
_REASONS = {200: "OK", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


def reporter_metrics(prefix: str, reporter: SampleReporter) -> Iterator[Metric]:
    """A sample reporter's figures under `prefix` (a sidecar's, a router agent's): one
    set of names, so one dashboard and one loss check serve every data plane."""
    s = reporter.snapshot()
    samples = CounterMetricFamily(
        f"{prefix}_samples", "Samples by fate: sent, dropped, or not sent for want of an "
        "experiment (unattributed)", labels=["fate"]
    )
    samples.add_metric(["sent"], s.samples_sent)
    samples.add_metric(["dropped"], s.samples_dropped)
    samples.add_metric(["unattributed"], s.samples_unattributed)
    yield samples
    batches = CounterMetricFamily(f"{prefix}_sample_batches", "Sample batches by fate",
                                  labels=["fate"])
    batches.add_metric(["sent"], s.batches_sent)
    batches.add_metric(["dropped"], s.batches_dropped)
    yield batches
    yield GaugeMetricFamily(f"{prefix}_samples_buffered", "Samples waiting to be sent",
                            value=s.buffered_samples)
    yield GaugeMetricFamily(f"{prefix}_sample_batches_buffered",
                            "Sealed batches waiting to be sent", value=s.buffered_batches)
    yield CounterMetricFamily(f"{prefix}_sample_send_errors",
                              "Failed appends to the samples stream", value=s.send_errors)


class SidecarCollector(Collector):
    """Samples sent/dropped/buffered, routes applied/rejected, the revision in force."""

    def __init__(
        self, *, reporter: SampleReporter, watcher: RouteWatcher, prefix: str = "canary_sidecar"
    ) -> None:
        self._reporter = reporter
        self._watcher = watcher
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        p = self._prefix
        yield from reporter_metrics(p, self._reporter)

        w = self._watcher.stats
        rejected = CounterMetricFamily(f"{p}_routes_rejected",
                                       "Route values rejected, the route in force kept",
                                       labels=["reason"])
        rejected.add_metric(["malformed"], w.rejected_malformed)
        yield rejected
        yield CounterMetricFamily(f"{p}_routes_applied", "Route values put in force",
                                  value=w.applied)
        yield CounterMetricFamily(f"{p}_route_store_errors",
                                  "Failed reads or watches of the route store",
                                  value=w.store_errors)
        route = self._watcher.table.route
        revision = GaugeMetricFamily(f"{p}_route_revision",
                                     "Revision of the route in force (absent: none)",
                                     labels=["experiment"])
        if route is not None:
            revision.add_metric([str(route.experiment)], route.revision)
        yield revision
        yield GaugeMetricFamily(f"{p}_ready", "1 when a route or default upstream is in force",
                                value=1 if self._watcher.table.ready else 0)


View = Callable[[], Any | Awaitable[Any]]


class AdminServer:
    """GET /healthz (alive), /readyz (`ready()`), /metrics (the registry), and each of
    `views` (path -> a function returning what to answer as JSON).

    `ready` and the views may be coroutine functions, and `refresh` (awaited before
    each /metrics rendering) lets collectors read what needs I/O, e.g. a supervisor's
    workers. Views are admin paths: with a token they need it, as /metrics does."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        ready: Callable[[], bool | Awaitable[bool]],
        token: str | None = None,
        refresh: Callable[[], Awaitable[None]] | None = None,
        not_ready: bytes = b"not ready: no route in force and no default upstream\n",
        views: Mapping[str, View] | None = None,
        warnings: Sequence[str] = (),
    ) -> None:
        self._registry = registry
        # /healthz stays 200 (the process is alive) and says what is wrong beside "ok"
        self._health = b"ok\n" + b"".join(f"WARNING: {w}\n".encode() for w in warnings)
        self._views = dict(views or {})
        self._ready = ready
        self._token = token
        self._refresh = refresh
        self._not_ready = not_ready
        self.unauthorized = 0  # requests refused for a missing or wrong token
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    def metrics_collector(self) -> Collector:
        return _AdminCollector(self)

    async def start(self, host: str, port: int) -> None:
        warn_if_exposed(host, self._token, log, "sidecar")
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)

    async def start_unix(self, path: str) -> None:
        """Serve on a Unix socket (a supervisor reads its workers there); whoever may
        enter its directory may read it, so the directory is the access rule."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous worker's socket at the same path
        self._server = await asyncio.start_unix_server(self._serve, path)

    @property
    def port(self) -> int:
        assert self._server is not None, "the admin server is not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_HEAD:
                return
            method, target = _request_line(head)
            path = target.split("?", 1)[0]
            if allowed(path, header(head, b"authorization"), self._token):
                status, content_type, body = await self._answer(method, path)
                extra = ""
            else:
                self.unauthorized += 1
                status, content_type, body = 401, "text/plain; charset=utf-8", b"unauthorized\n"
                extra = 'WWW-Authenticate: Bearer realm="canary-admin"\r\n'
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                f"Content-Type: {content_type}\r\n{extra}"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass  # a broken or idle admin client: just hang up
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._handlers.discard(task)

    async def _answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, text, b"method not allowed\n"
        if path == "/healthz":
            return 200, text, self._health
        if path == "/readyz":
            ready = self._ready()
            if inspect.isawaitable(ready):
                ready = await ready
            if ready:
                return 200, text, b"ready\n"
            return 503, text, self._not_ready
        if path == "/metrics":
            if self._refresh is not None:
                await self._refresh()
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        view = self._views.get(path)
        if view is not None:
            answer = view()
            if inspect.isawaitable(answer):
                answer = await answer
            body = json.dumps(answer, sort_keys=True, allow_nan=False).encode() + b"\n"
            return 200, "application/json", body
        return 404, text, b"not found\n"


class _AdminCollector(Collector):
    def __init__(self, admin: AdminServer) -> None:
        self._admin = admin

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "canary_sidecar_admin_unauthorized",
            "Admin requests refused for a missing or wrong bearer token",
            value=self._admin.unauthorized,
        )


def _request_line(head: bytes) -> tuple[str, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    method, target, _version = line.split(" ", 2)
    return method, target
