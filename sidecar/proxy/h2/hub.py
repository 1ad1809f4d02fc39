"""What the HTTP/2 side of one `ProxyServer` shares: client connections, upstream pools,
and the connections with bytes to send.

An event on one connection often makes another one's state machine owe bytes (a DATA
frame from an upstream is a DATA frame for a client); such connections are marked
`dirty` and each entry point (a read, a connect, a timer) ends with `flush()`, so the
bytes of one read leave in one write per connection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from sidecar.choice import Choice, Upstream
from sidecar.proxy.h2.bridge import H1Leg
from sidecar.proxy.h2.connection import H2ClientConnection
from sidecar.proxy.h2.fields import Forwarding, Request, h2_request
from sidecar.proxy.h2.relay import H2Relay
from sidecar.proxy.h2.stream import H2Stream, UpstreamLeg
from sidecar.proxy.h2.upstream import H2UpstreamPool
from sidecar.proxy.limits import RateLimitedLog

if TYPE_CHECKING:
    from sidecar.proxy.client import ClientConnection
    from sidecar.proxy.exchange import Exchange
    from sidecar.proxy.server import ProxyServer

log = logging.getLogger(__name__)


class Flushable(Protocol):
    def flush(self) -> None: ...


class H2Hub:
    """The HTTP/2 connections and pools of one proxy."""

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.connections: set[H2ClientConnection] = set()
        self.pools: dict[Upstream, H2UpstreamPool] = {}
        self.dirty: set[Flushable] = set()
        self.refusals = RateLimitedLog(log, lambda: server.time())

    def take_over(self, old: ClientConnection, initial: bytes) -> None:
        """An HTTP/1.1 connection turned out to be HTTP/2: its transport is ours now."""
        transport = old.transport
        assert transport is not None
        conn = H2ClientConnection(self.server, transport, old.client_ip)
        transport.set_protocol(conn)
        self.server.connection_moved(old)
        self.connections.add(conn)
        if self.server.draining:
            conn.going_away = True
        conn.start(initial)
        self.flush()

    def connection_closed(self, conn: H2ClientConnection) -> None:
        self.connections.discard(conn)
        self.server.connection_closed(conn)

    def flush(self) -> None:
        dirty = self.dirty
        while dirty:
            dirty.pop().flush()

    def open_leg(
        self, stream: H2Stream, upstream: Upstream, request: Request, fwd: Forwarding
    ) -> UpstreamLeg:
        if upstream.http2:
            return self.pool_for(upstream).open(stream, h2_request(request, fwd), checked=True)
        leg = H1Leg(self.server, stream, request, fwd)
        leg.start(self.server.pool_for(upstream))
        return leg

    def relay(self, exchange: Exchange, choice: Choice, *, degrade: bool = False) -> H2Relay:
        """An HTTP/1.1 exchange's request as a stream on its HTTP/2 upstream
        (`degrade`: admitted under heavy overload)."""
        relay = H2Relay(self, exchange)
        try:
            relay.start(choice, degrade=degrade)
        except Exception as exc:  # e.g. an Upstream built by hand with a bad host name
            log.exception("no HTTP/2 stream to %s", choice.upstream)
            relay.upstream_failed(502, 502, f"unusable upstream {choice.upstream}: {exc}")
            self.flush()
        return relay

    def pool_for(self, upstream: Upstream) -> H2UpstreamPool:
        pool = self.pools.get(upstream)
        if pool is None:
            opts = self.server.options
            pool = self.pools[upstream] = H2UpstreamPool(
                self,
                upstream,
                connect_timeout=opts.connect_timeout,
                ssl_context=opts.ssl_context,
                max_streams=opts.h2_max_streams_upstream,
                max_waiting=opts.h2_max_waiting,
                stream_window=opts.h2_stream_window,
                connection_window=opts.h2_connection_window,
            )
        return pool

    def sweep(self, now: float) -> None:
        opts = self.server.options
        for conn in list(self.connections):
            conn.sweep(now, opts.client_idle_timeout)
        for pool in self.pools.values():
            pool.sweep(now, opts.read_timeout, opts.pool_idle_timeout)
        self.flush()

    def drain(self) -> None:
        for conn in list(self.connections):
            conn.drain()
        self.flush()

    def abort(self) -> None:
        for conn in list(self.connections):
            conn.abort()

    def close_pools(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        self.flush()
