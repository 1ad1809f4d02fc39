"""One sidecar process: the proxy, its routes, its samples and its admin endpoints.

`Sidecar` composes the parts in one place:

    KeyValueStore ─► RouteWatcher ─► RouteTable ─┐ (Chooser)
                                                 ├─► ProxyServer ─► upstreams
    SampleStream ◄── SampleReporter ◄────────────┘ (Recorder)
    AdminServer: /healthz, /readyz, /metrics over all of them

`run_sidecar` starts one and stops it on SIGTERM/SIGINT: stop accepting, let
in-flight requests finish, flush the samples within a deadline, close the stores.

Only the shared kernel and the sidecar are imported here: never the API or the SQL
layer.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import ssl
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.registry import CollectorRegistry

from controlplane.kernel.admin_access import admin_token
from controlplane.kernel.backend_access import etcd_access, redis_access
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.dev_join import in_process_backends, in_process_warning
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.route_reports import RouteReports
from controlplane.kernel.sample_auth import SampleSigner
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.settings import Settings
from controlplane.kernel.signals import on_stop_signals
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.tracing_config import tracing_config
from sidecar import compiled
from sidecar.admin import AdminServer, SidecarCollector
from sidecar.choice import Upstream
from sidecar.overload.metrics import OverloadMetricsCollector
from sidecar.overload.view import disabled_view
from sidecar.overload.watcher import OverloadWatcher
from sidecar.proxy import ProxyMetricsCollector, ProxyOptions, ProxyServer
from sidecar.proxy.limits import connection_capacity, default_max_connections, raise_fd_limit
from sidecar.proxy.tracing import RequestTracing
from sidecar.reporter import SampleReporter
from sidecar.route_report import RouteReporter
from sidecar.routing import RouteTable, RouteWatcher

log = logging.getLogger("canary.sidecar")

HostPort = tuple[str, int]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 2.0  # seconds to open an upstream connection (then 504)
    read: float = 30.0  # seconds of upstream silence while a response is owed (then 504)
    drain: float = 10.0  # in-flight requests get this long at shutdown
    flush: float = 5.0  # the sample buffer gets this long at shutdown
    first_route: float = 2.0  # start-up waits this long for the first route read
    head: float = 10.0  # seconds for a client's request head to arrive (then 408)
    tunnel_idle: float = 300.0  # seconds without a byte either way before a tunnel is cut
    tls_handshake: float = 10.0  # seconds for a TLS client's handshake, from accept


@dataclass(frozen=True, slots=True)
class ClientBounds:
    """What one client may hold: connections, counted per address (see
    sidecar.proxy.admission), and header fields per head."""

    # None: a quarter of max_connections, at most 512; 0: no per-client cap
    max_connections_per_client: int | None = None
    ipv6_prefix: int = 128  # IPv6 clients are counted per network of this length
    max_headers: int = 100  # header fields per head, trailer section, HTTP/2 block


class Sidecar:
    """Build, start and stop the parts of one sidecar."""

    def __init__(
        self,
        *,
        service: str,
        kv: KeyValueStore,
        stream: SampleStream,
        etcd_prefix: str = "/canary",
        default_upstream: Upstream | None = None,
        force_header_enabled: bool = False,
        timeouts: Timeouts | None = None,
        max_connections: int = 10_000,
        max_tunnels: int | None = None,
        bounds: ClientBounds | None = None,
        proxy_options: ProxyOptions | None = None,
        reporter: SampleReporter | None = None,
        clock: Clock | None = None,
        sample_keys: SampleKeys | None = None,
        admin_token: str | None = None,
        listen_tls: ssl.SSLContext | None = None,
        reporter_source: str | None = None,
        tracing: RequestTracing | None = None,
        warnings: Sequence[str] = (),
    ) -> None:
        self.service = service
        self.tracing = tracing
        self.timeouts = timeouts or Timeouts()
        self.clock: Clock = clock or SystemClock()
        self.kv = kv
        self.stream = stream
        self.table = RouteTable(
            default_upstream=default_upstream, force_enabled=force_header_enabled
        )
        self.watcher = RouteWatcher(kv, self.table, service=service, prefix=etcd_prefix)
        signer = SampleSigner(sample_keys) if sample_keys is not None else None
        self.reporter = reporter or SampleReporter(
            stream, service, clock=self.clock, signer=signer, source=reporter_source
        )
        bounds = bounds or ClientBounds()
        options = proxy_options or ProxyOptions(
            connect_timeout=self.timeouts.connect,
            read_timeout=self.timeouts.read,
            shutdown_timeout=self.timeouts.drain,
            head_timeout=self.timeouts.head,
            max_connections=max_connections,
            listen_tls=listen_tls,
            tunnel_idle_timeout=self.timeouts.tunnel_idle,
            max_tunnels=max_tunnels,
            max_connections_per_client=bounds.max_connections_per_client,
            client_ipv6_prefix=bounds.ipv6_prefix,
            max_header_count=bounds.max_headers,
            tls_handshake_timeout=self.timeouts.tls_handshake,
        )
        self.proxy = ProxyServer(
            self.table, self.reporter, options=options, clock=self.clock, tracing=tracing
        )
        # the route in force, told to the control plane (decision 0053)
        self.route_reporter = (
            RouteReporter(stream, service=service, instance=self.reporter.source,
                          held=self._held_revision, clock=self.clock)
            if isinstance(stream, RouteReports) else None
        )  # fmt: skip
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            ProxyMetricsCollector(
                self.proxy.metrics, before_collect=self.proxy.flush_samples, service=service
            )
        )
        self.registry.register(SidecarCollector(reporter=self.reporter, watcher=self.watcher))
        self.overload = OverloadWatcher(kv, self.proxy, service=service, prefix=etcd_prefix)
        self.registry.register(OverloadMetricsCollector(self.overload))
        self.admin = AdminServer(
            registry=self.registry,
            ready=self.ready,
            token=admin_token,
            views={"/overload": self.overload_view},
            warnings=warnings,
        )
        self.registry.register(self.admin.metrics_collector())
        self._draining = False
        self._admin_started = False

    def _held_revision(self) -> int:
        route = self.table.route
        return 0 if route is None else route.revision

    def ready(self) -> bool:
        """Ready for traffic: listening, a route or a default upstream, and not shutting
        down."""
        return self.table.ready and self.proxy.listening and not self._draining

    def overload_view(self) -> dict[str, Any]:
        """What /overload answers: the guard's state, or that protection is off."""
        guard = self.proxy.overload
        return disabled_view() if guard is None else guard.state()

    async def start(
        self,
        listen: HostPort | socket.socket,
        admin: HostPort | str | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        """Serve on `listen` (host and port, or a listening socket to share) and the
        admin endpoints on `admin` (host and port, or a Unix socket path)."""
        # admin first, so /healthz answers while the first route is read
        if isinstance(admin, str):
            await self.admin.start_unix(admin)
            self._admin_started = True
        elif admin is not None:
            await self.admin.start(*admin)
            self._admin_started = True
        self.reporter.start()
        self.watcher.start()
        self.overload.start()
        if not await self.watcher.wait_loaded(self.timeouts.first_route):
            log.warning(
                "route store not answering yet: serving %s meanwhile",
                "the default upstream" if self.table.ready else "503",
            )
        if isinstance(listen, socket.socket):
            await self.proxy.start_on(listen)
        else:
            await self.proxy.start(*listen, reuse_port=reuse_port)
        if self.route_reporter is not None:
            self.route_reporter.start()
        log.info(
            "sidecar for %s on port %d (proxy: %s)",
            self.service,
            self.proxy.port,
            compiled.IN_USE[1],
        )

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, flush samples.

        The stores stay open: whoever opened them closes them (`run_sidecar`, or the
        process that shares them among its parts).
        """
        self._draining = True
        await self.proxy.stop(self.timeouts.drain)
        if self.tracing is not None:
            tracing, self.tracing = self.tracing, None
            try:  # the exporter sends what it holds: blocking, so off the loop
                await asyncio.to_thread(tracing.close)
            except Exception as exc:
                log.warning("closing the span exporter failed: %s", exc)
        if self.route_reporter is not None:
            await self.route_reporter.stop()
        await self.watcher.stop()
        await self.overload.stop()
        await self.reporter.close(self.timeouts.flush)
        if self._admin_started:
            await self.admin.stop()


async def run_sidecar(
    settings: Settings,
    *,
    service: str,
    listen: HostPort | socket.socket,
    admin: HostPort | str | None = None,
    reuse_port: bool = False,
    reporter_source: str | None = None,
    default_upstream: str | None = None,
    force_header_enabled: bool = False,
    timeouts: Timeouts | None = None,
    max_connections: int | None = None,
    max_tunnels: int | None = None,
    bounds: ClientBounds | None = None,
    stop: asyncio.Event | None = None,
    sample_keys: SampleKeys | None = None,
    listen_tls: ssl.SSLContext | None = None,
) -> None:
    """Run a sidecar until SIGTERM/SIGINT (or `stop` is set), then shut down cleanly.

    `listen` and `admin` are as for `Sidecar.start`. The soft descriptor limit is
    raised to the hard one first; `max_connections` defaults to what that limit
    carries (see `sidecar.proxy.limits`)."""
    fd_limit = raise_fd_limit()
    if max_connections is None:
        max_connections = default_max_connections(fd_limit)
    elif max_connections > connection_capacity(fd_limit):
        log.warning(
            "max_connections %d is more than the descriptor limit %d carries (%d): a flood "
            "can exhaust the descriptors, the admin endpoints' included",
            max_connections,
            fd_limit,
            connection_capacity(fd_limit),
        )
    log.info("descriptor limit %d: at most %d client connections", fd_limit, max_connections)
    upstream = Upstream.parse(default_upstream) if default_upstream else None
    token = admin_token(settings.admin_token_file)
    warnings = backend_warnings(settings)
    kv = open_kv(settings.etcd, access=etcd_access(settings))
    try:
        stream, _ = open_streams(
            settings.redis_url,
            namespace=settings.redis_namespace,
            access=redis_access(settings),
        )
    except BaseException:
        await kv.close()
        raise
    try:
        tracing = open_tracing(settings, service)
    except BaseException:
        await kv.close()
        await stream.close()
        raise
    sidecar = Sidecar(
        service=service,
        kv=kv,
        stream=stream,
        etcd_prefix=settings.etcd_prefix,
        default_upstream=upstream,
        force_header_enabled=force_header_enabled,
        timeouts=timeouts,
        max_connections=max_connections,
        max_tunnels=max_tunnels,
        bounds=bounds,
        sample_keys=sample_keys,
        admin_token=token,
        listen_tls=listen_tls,
        reporter_source=reporter_source,
        tracing=tracing,
        warnings=warnings,
    )
    _report_accept_errors(sidecar.proxy)
    if sample_keys is None:
        log.warning("no sample keys configured: samples are sent unsigned")
    stop = stop or asyncio.Event()
    try:
        with on_stop_signals(stop.set):
            try:
                await sidecar.start(listen, admin, reuse_port=reuse_port)
            except BaseException:
                await sidecar.stop()
                raise
            await stop.wait()
            log.info("sidecar for %s stopping", service)
            await sidecar.stop()
    finally:
        for close in (kv.close, stream.close):
            try:
                await close()
            except Exception as exc:  # the process is going away; say so and go on
                log.warning("closing a store failed: %s", exc)


def backend_warnings(settings: Settings, kind: str = "sidecar") -> list[str]:
    """The loud line for in-process backends, logged now and shown by /healthz: such a
    data plane is alone (decision 0053)."""
    backends = in_process_backends(settings.etcd, settings.redis_url)
    if not backends:
        return []
    warning = in_process_warning(kind, backends)
    log.warning("%s", warning)
    return [warning]


def open_tracing(settings: Settings, service: str) -> RequestTracing | None:
    """The proxy's tracing when an OTLP endpoint is configured, else None: then no
    OpenTelemetry module is ever imported."""
    config = tracing_config(settings.otel_endpoint, settings.otel_sample_ratio, os.environ)
    if config is None:
        return None
    from sidecar.otel_spans import otlp_sink

    where = config.traces_url or "the OTEL_EXPORTER_OTLP_* endpoint"
    log.info("tracing to %s, sampling %g of new traces", where, config.sample_ratio)
    return RequestTracing(otlp_sink(config, service=service), config.sample_ratio)


_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _report_accept_errors(proxy: ProxyServer) -> None:
    """asyncio reports a failed accept() (out of descriptors) to the loop's exception
    handler once a second; route it to the proxy's rate-limited warning instead."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES:
            proxy.accept_failed(exc)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def listen_tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The listener's TLS context, or None for plain HTTP; both files or neither."""
    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.tls import server_context

    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("--tls-cert and --tls-key go together")
    return server_context(cert_file=cert, key_file=key, what="sidecar TLS")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed: the proxy is faster on it."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
