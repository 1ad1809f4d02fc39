"""The reverse proxy: listening, the connection cap, timeouts, pools, samples, shutdown.

`ProxyServer` accepts client connections (`client.ClientConnection`), each of which
runs its requests as `exchange.Exchange`s. No task and no queue sits on the data
path; a task exists only while a fresh upstream connection is being opened. The
server holds what the connections share: the chooser, the upstream pools, the
counters, and the finished requests waiting to be handed to the recorder in bulk. A
timer sweeps idle client and upstream connections and answers 408 to overdue heads.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.kernel.clock import Clock, SystemClock
from sidecar.choice import Choice, Chooser, Recorder, Upstream, columns_recorder
from sidecar.proxy import errors
from sidecar.proxy.admission import MAX_CONNECTIONS, Admission
from sidecar.proxy.client import ClientConnection
from sidecar.proxy.exchange import Exchange
from sidecar.proxy.h2.connection import H2ClientConnection
from sidecar.proxy.h2.hub import H2Hub
from sidecar.proxy.h2.preface import offer_h2
from sidecar.proxy.limits import RateLimitedLog
from sidecar.proxy.metrics import ProxyMetrics
from sidecar.proxy.options import ProxyOptions
from sidecar.proxy.pausing import STOPPED
from sidecar.proxy.samples import PendingSamples
from sidecar.proxy.tls_accept import TlsHandshake
from sidecar.proxy.tracing import RequestTrace, RequestTracing
from sidecar.proxy.tunnel import IDLE, SHUTDOWN, Tunnel
from sidecar.proxy.upstream import UpstreamPool

if TYPE_CHECKING:
    from sidecar.overload.guard import OverloadGuard

log = logging.getLogger(__name__)

# finished requests are handed to the recorder when this many wait, or this long after
# the first of them: bulk is cheaper, and a few milliseconds do not matter to windows
# of seconds
SAMPLE_FLUSH_COUNT = 256
SAMPLE_FLUSH_DELAY = 0.005


class Finished(Protocol):
    """A request whose response went out: an HTTP/1.1 `Exchange` or an HTTP/2 stream."""

    choice: Choice | None
    t0: float  # clock.monotonic() when its head arrived
    ts: float  # clock.now() then
    t_sent: float | None  # clock.monotonic() when its head went upstream
    t_first: float | None  # clock.monotonic() when the response head went out, if it did
    trace: RequestTrace | None  # set when tracing records this request


class ProxyServer:
    """The reverse proxy: `await start(host, port)`, `await stop()`.

    `chooser` says where each request goes, `recorder` hears how it went (after the
    response is out). Counters are in `metrics`; export them with
    `ProxyMetricsCollector`.
    """

    def __init__(
        self,
        chooser: Chooser,
        recorder: Recorder,
        *,
        options: ProxyOptions | None = None,
        clock: Clock | None = None,
        metrics: ProxyMetrics | None = None,
        tracing: RequestTracing | None = None,
    ) -> None:
        self.chooser = chooser
        self.recorder = recorder
        self.options = options if options is not None else ProxyOptions()
        self.clock: Clock = clock if clock is not None else SystemClock()
        # the clock's two readings as plain callables: a request reads them a few
        # times, and a call through them skips a method lookup on the clock each time
        self.monotonic: Callable[[], float] = self.clock.monotonic
        self.wall: Callable[[], float] = self.clock.now
        self.metrics = metrics if metrics is not None else ProxyMetrics()
        # None: tracing off, and nothing of it on the data path but this attribute
        self.tracing = tracing
        proto = "https" if self.options.listen_tls is not None else self.options.forwarded_proto
        self.forwarded_proto = proto.encode()
        self.draining = False
        # the loop's clock once started (idle times are measured on it)
        self.time: Callable[[], float] = time.monotonic
        self.tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._pools: dict[Upstream, UpstreamPool] = {}
        self._pools_by_id: dict[int, tuple[Upstream, UpstreamPool]] = {}
        self._connections: set[ClientConnection] = set()
        opts = self.options
        self.admission = Admission(
            opts.max_connections, opts.client_limit, opts.client_ipv6_prefix
        )
        self.handshaking = 0  # TLS connections accepted, their handshake not yet done
        self.tunnels: set[Tunnel] = set()
        self._tunnels_pending = 0  # upgrade requests forwarded, their answer not yet in
        self._all_closed: asyncio.Event | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        # finished requests wait here for `flush_samples`: the recorder and the
        # metrics take them in bulk, a C loop per column instead of calls per request
        self._pending = PendingSamples()
        self._record_columns = columns_recorder(recorder)
        # requests the overload gates answered since the last flush, per (experiment,
        # variant): handed over as one tally each, never as samples (decision 0025)
        self._shed: dict[tuple[str, str], int] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        self._refusals = RateLimitedLog(log, lambda: self.time())
        self._accept_errors = RateLimitedLog(log, lambda: self.time())
        self.h2 = H2Hub(self)
        # adaptive overload protection (sidecar.overload), None while it is off
        self.overload: OverloadGuard | None = None
        if self.options.listen_tls is not None and self.options.http2:
            offer_h2(self.options.listen_tls)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the proxy is not started"
        return self._loop

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen on host:port (port 0: any free port, see `port`).

        `reuse_port` joins the port's SO_REUSEPORT group: the kernel then spreads new
        connections over every process listening on it (one per worker)."""
        loop = self._starting()
        self._server = await loop.create_server(
            self._accepted,
            host,
            port,
            backlog=self.options.backlog,
            reuse_address=True,
            reuse_port=reuse_port or None,
        )
        self._started()

    async def start_on(self, sock: socket.socket) -> None:
        """Accept on a socket already bound and listening (one inherited from a
        supervisor, shared with the other workers)."""
        loop = self._starting()
        self._server = await loop.create_server(
            self._accepted, sock=sock, backlog=self.options.backlog
        )
        self._started()

    def _accepted(self) -> asyncio.Protocol:
        """The protocol of an accepted socket. TLS is started by `TlsHandshake`, not
        by the loop, so the handshake counts against the caps and is timed."""
        if self.options.listen_tls is not None:
            return TlsHandshake(self, self.options.listen_tls)
        return ClientConnection(self)

    @property
    def listening(self) -> bool:
        return self._server is not None and not self.draining

    def _starting(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        self.time = self._loop.time
        self._all_closed = asyncio.Event()
        return self._loop

    def _started(self) -> None:
        self._sweeper = self.loop.call_later(self._sweep_interval(), self._sweep)

    @property
    def port(self) -> int:
        """The port actually bound."""
        assert self._server is not None, "the proxy is not started"
        # uvloop's `sockets` is a list where asyncio's (and its stub) is a tuple, which
        # the compiled module would check it is: read untyped
        server: Any = self._server
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within `timeout` (default
        `options.shutdown_timeout`), then cut what is left and close the pools."""
        if self._server is None:
            return
        self.draining = True
        self._server.close()
        for conn in list(self._connections):
            if conn.idle:
                conn.close()
        self.h2.drain()
        assert self._all_closed is not None
        if self._connections or self.h2.connections:
            self._all_closed.clear()  # it may be set from an earlier moment without clients
            deadline = self.options.shutdown_timeout if timeout is None else timeout
            try:
                async with asyncio.timeout(deadline):
                    await self._all_closed.wait()
            except TimeoutError:
                busy = len(self._connections) + len(self.h2.connections)
                log.warning(
                    "%d connections still busy at shutdown (%d tunnels): cut",
                    busy,
                    len(self.tunnels),
                )
                for tunnel in list(self.tunnels):
                    tunnel.cut(SHUTDOWN)
                for conn in list(self._connections):
                    conn.abort()
                self.h2.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._server.wait_closed()
        self.flush_samples()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._pools_by_id.clear()
        self.h2.close_pools()
        # let the transports' close callbacks run before the loop may be closed
        await asyncio.sleep(0)
        self._server = None

    # --- samples ----------------------------------------------------------------

    def finished(self, done: Sequence[tuple[Exchange, int]]) -> None:
        """HTTP/1.1 exchanges whose response went out (outcome: status or failure
        kind). Typed as the compiled `Exchange`: its times are read natively."""
        end = self.monotonic()
        pending = self._pending
        for exchange, outcome in done:
            choice = exchange.choice
            if choice is not None:
                pending.add(
                    choice, exchange.ts, exchange.t0, exchange.t_sent, exchange.t_first,
                    outcome, end,
                )  # fmt: skip
        self._after_finished(done, end)

    def streams_finished(self, done: Sequence[tuple[Finished, int]]) -> None:
        """`finished` for HTTP/2 streams."""
        end = self.monotonic()
        pending = self._pending
        for stream, outcome in done:
            choice = stream.choice
            if choice is not None:
                pending.add(
                    choice, stream.ts, stream.t0, stream.t_sent, stream.t_first, outcome, end
                )
        self._after_finished(done, end)

    def _after_finished(self, done: Sequence[tuple[Finished, int]], end: float) -> None:
        if self.tracing is not None:
            self.tracing.finished(done, end)
        if len(self._pending) >= SAMPLE_FLUSH_COUNT:
            self.flush_samples()
        elif self._flush_timer is None and self._loop is not None:
            self._flush_timer = self._loop.call_later(SAMPLE_FLUSH_DELAY, self.flush_samples)

    def shed(self, choice: Choice) -> None:
        """An overload gate answered a request of `choice` itself (or its client left
        the gate's queue): a tally for the collector, with the next flush."""
        experiment = choice.experiment
        if experiment is None:  # nothing to compare it with, as for samples
            return
        key = (experiment, choice.variant)
        self._shed[key] = self._shed.get(key, 0) + 1
        if self._flush_timer is None and self._loop is not None:
            self._flush_timer = self._loop.call_later(SAMPLE_FLUSH_DELAY, self.flush_samples)

    def flush_samples(self) -> None:
        """Hand what finished since the last flush to the metrics and the recorder,
        and the shed tallies to the recorder."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self.tracing is not None:
            self.tracing.flush()
        pending = self._pending
        shed = self._shed
        if not len(pending) and not shed:
            return
        self._pending = PendingSamples()
        if len(pending):
            self.metrics.observe_many(pending.variants, pending.outcomes, pending.overheads)
        if shed:
            self._shed = {}
            now = self.clock.now()
            for (experiment, variant), count in shed.items():
                pending.add_shed(now, experiment, variant, count)
        try:
            self._record_columns(pending.columns())
        except Exception:  # a recorder must not raise; if one does, the requests are done
            log.exception("the sample recorder raised")

    # --- used by connections ----------------------------------------------------

    def pool_for(self, upstream: Upstream) -> UpstreamPool:
        # A chooser hands out the same Upstream objects until its routes change: look
        # them up by identity first, which spares hashing a dataclass per request. The
        # entry holds the object, so its id cannot be reused while the entry lives.
        cached = self._pools_by_id.get(id(upstream))
        if cached is not None and cached[0] is upstream:
            return cached[1]
        pool = self._pools.get(upstream)
        if pool is None:
            if upstream.http2:  # exchanges reach these through `H2Hub.relay`
                raise ValueError("it speaks HTTP/2 only: no HTTP/1.1 pool")
            opts = self.options
            pool = self._pools[upstream] = UpstreamPool(
                self.loop,
                upstream,
                connect_timeout=opts.connect_timeout,
                read_timeout=opts.read_timeout,
                max_idle=opts.max_pool_per_upstream,
                ssl_context=opts.ssl_context,
                metrics=self.metrics,
            )
        if len(self._pools_by_id) >= 1024:
            self._pools_by_id.clear()  # routes changed many times: start the cache afresh
        self._pools_by_id[id(upstream)] = (upstream, pool)
        return pool

    def reserve_tunnel(self) -> bool:
        """Room for one more tunnel? Taken until `tunnel_refused` or `tunnel_opened`."""
        if self.draining or self._tunnels_pending + len(self.tunnels) >= self.options.tunnel_limit:
            self.metrics.tunnels_refused += 1
            return False
        self._tunnels_pending += 1
        return True

    def tunnel_refused(self) -> None:
        """A reserved upgrade did not happen (refused by the upstream, failed)."""
        self._tunnels_pending -= 1

    def tunnel_opened(self, tunnel: Tunnel) -> None:
        self._tunnels_pending -= 1
        self.tunnels.add(tunnel)
        self.metrics.tunnels_open += 1

    def tunnel_ended(self, tunnel: Tunnel) -> None:
        self.tunnels.discard(tunnel)
        self.metrics.tunnel_ended(tunnel.reason or "closed", self.time() - tunnel.opened)
        tunnel.client.tunnel_ended()

    def _open_count(self) -> int:
        return len(self._connections) + len(self.h2.connections) + self.handshaking

    def _refused(self, reason: str) -> None:
        refused = self.metrics.connections_refused
        refused[reason] = refused.get(reason, 0) + 1
        if reason == MAX_CONNECTIONS:
            self._refusals.warning(
                "refusing client connections: %d open, the maximum (--max-connections)",
                self.options.max_connections,
            )
        else:
            self._refusals.warning(
                "refusing client connections: one client holds %d, the maximum "
                "(--max-connections-per-client)",
                self.admission.client_limit,
            )

    def connection_opened(self, conn: ClientConnection) -> None:
        reason = self.admission.refusal(conn.client_ip, self._open_count())
        if reason is not None:
            # answered and closed at once: the descriptor is free again right away
            conn.refused = True
            conn.write(
                errors.too_many_connections(self.options.max_connections, retry_after=1)
                if reason == MAX_CONNECTIONS
                else errors.too_many_client_connections(self.admission.client_limit)
            )
            conn.block(STOPPED)
            conn.close()
            self._refused(reason)
            return
        self._connections.add(conn)
        self.metrics.connections += 1
        if self.draining:
            conn.close()

    def handshake_started(self, client_ip: bytes) -> bool:
        """A TLS client was accepted: admitted (counted until `handshake_ended`)?"""
        reason = self.admission.refusal(client_ip, self._open_count())
        if reason is not None:
            self._refused(reason)
            return False
        self.handshaking += 1
        self.metrics.tls_handshaking += 1
        return True

    def handshake_ended(self, client_ip: bytes, failure: str | None) -> None:
        """Its slot is free again; on success the connection takes one at once (see
        `TlsHandshake`), so a slot freed here cannot go to another client meanwhile."""
        self.handshaking -= 1
        self.metrics.tls_handshaking -= 1
        self.admission.release(client_ip)
        if failure is not None:
            failed = self.metrics.tls_handshakes_failed
            failed[failure] = failed.get(failure, 0) + 1

    def connection_closed(self, conn: ClientConnection | H2ClientConnection) -> None:
        self._connections.discard(conn)
        self.metrics.connections -= 1
        self.admission.release(conn.client_ip)
        if not self._connections and not self.h2.connections and self._all_closed is not None:
            self._all_closed.set()

    def connection_moved(self, conn: ClientConnection) -> None:
        """`conn` turned into an HTTP/2 connection (counted on, see H2Hub.take_over)."""
        self._connections.discard(conn)

    def accept_failed(self, exc: BaseException | None) -> None:
        """accept() failed (e.g. EMFILE: out of descriptors): say so, not too often."""
        self._accept_errors.warning(
            "accepting a client connection failed (%s) with %d open", exc, len(self._connections)
        )

    def _sweep_interval(self) -> float:
        opts = self.options
        return max(
            0.05,
            min(
                1.0,
                opts.client_idle_timeout / 4,
                opts.pool_idle_timeout / 4,
                opts.head_timeout / 4,
                opts.tunnel_idle_timeout / 4,
            ),
        )

    def _sweep(self) -> None:
        """Close idle client connections and idle upstream connections past their time,
        and answer 408 to connections whose request head is overdue."""
        loop = self.loop
        now = loop.time()
        cutoff = now - self.options.client_idle_timeout
        head_cutoff = now - self.options.head_timeout
        overdue, idle = [], []
        for conn in self._connections:
            if conn.current is not None or conn.tunnel is not None:
                continue  # a response is owed: the head after it is timed once it is out
            if conn.head_since:
                if conn.head_since < head_cutoff:
                    overdue.append(conn)
            elif conn.parsing is None and conn.idle_since < cutoff:
                idle.append(conn)
        for conn in idle:
            conn.close()
        for conn in overdue:
            self.metrics.reject("head_timeout")
            conn.block(STOPPED)
            conn.write(errors.head_timeout(self.options.head_timeout))
            conn.close()
        tunnel_cutoff = now - self.options.tunnel_idle_timeout
        for tunnel in [t for t in self.tunnels if t.last_activity < tunnel_cutoff]:
            tunnel.cut(IDLE)
        for pool in self._pools.values():
            pool.sweep(self.options.pool_idle_timeout)
        self.h2.sweep(now)
        self._sweeper = loop.call_later(self._sweep_interval(), self._sweep)
