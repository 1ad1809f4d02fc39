"""A byte tunnel between a client and an upstream after `101 Switching Protocols`.

Once an upgrade is accepted both connections stop speaking HTTP: each transport is
handed a `TunnelEnd` protocol (`transport.set_protocol`), and what one end reads is
written to the other as it comes, with no parser and no copy in between.

- Flow control: a transport whose write buffer passes its high-water mark
  (`tunnel_buffer_bytes`) pauses reading on the other end until it drains, so a slow
  reader holds at most that buffer and one read in the proxy, whatever the other
  side sends.
- Half-close: an end's EOF is passed on as EOF (`write_eof`) and the other
  direction keeps flowing; when both have ended, or one connection is lost, both
  close (what is buffered is still sent).
- The tunnel ends when both connections are gone; it is cut (both aborted) when
  idle for `tunnel_idle_timeout` (the server's sweep) or at the shutdown deadline.

The tunnel's client connection stays counted among the server's connections until
the tunnel ends, so tunnels count within `max_connections`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.proxy.client import ClientConnection
    from sidecar.proxy.server import ProxyServer

# why a tunnel ended, as counted
CLOSED = "closed"  # a side closed its connection (or both half-closed)
LOST = "lost"  # a connection broke (reset, error)
IDLE = "idle"  # no byte either way for tunnel_idle_timeout
SHUTDOWN = "shutdown"  # still open at the shutdown deadline


class TunnelEnd(asyncio.Protocol):
    """One side of a tunnel: what its transport reads goes to the other side."""

    __slots__ = ("eof", "lost", "other", "reading_paused", "to_upstream", "transport", "tunnel")

    def __init__(self, tunnel: Tunnel, transport: asyncio.Transport, *, to_upstream: bool) -> None:
        self.tunnel = tunnel
        self.transport = transport
        self.to_upstream = to_upstream  # what this end reads travels to the upstream
        self.other: TunnelEnd = self
        self.eof = False  # this end's peer will send nothing more
        self.lost = False
        self.reading_paused = False

    def data_received(self, data: bytes) -> None:
        tunnel = self.tunnel
        tunnel.last_activity = tunnel.server.time()
        metrics = tunnel.server.metrics
        if self.to_upstream:
            metrics.tunnel_bytes_upstream += len(data)
        else:
            metrics.tunnel_bytes_downstream += len(data)
        other = self.other
        if not other.lost:
            other.transport.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        self.tunnel.last_activity = self.tunnel.server.time()
        other = self.other
        if other.eof or other.lost:
            self.tunnel.close()
            return False
        if self.transport.can_write_eof() and other.transport.can_write_eof():
            other.transport.write_eof()
            return True  # keep this end open: the other direction still flows
        self.tunnel.close()  # TLS cannot half-close: the whole tunnel ends
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.tunnel.end_lost(self, exc)

    def pause_writing(self) -> None:
        self.other.pause_reading()

    def resume_writing(self) -> None:
        self.other.resume_reading()

    def pause_reading(self) -> None:
        if not self.reading_paused and not self.lost:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and not self.lost:
            self.reading_paused = False
            self.transport.resume_reading()


class Tunnel:
    """The two ends of one upgraded connection, from the 101 until both are gone."""

    __slots__ = (
        "client",
        "client_end",
        "ended",
        "last_activity",
        "opened",
        "reason",
        "server",
        "upstream_end",
    )

    def __init__(
        self,
        server: ProxyServer,
        client: ClientConnection,
        client_transport: asyncio.Transport,
        upstream_transport: asyncio.Transport,
    ) -> None:
        self.server = server
        self.client = client
        self.client_end = TunnelEnd(self, client_transport, to_upstream=True)
        self.upstream_end = TunnelEnd(self, upstream_transport, to_upstream=False)
        self.client_end.other = self.upstream_end
        self.upstream_end.other = self.client_end
        self.opened = self.last_activity = server.time()
        self.reason: str | None = None  # why it ends, once known
        self.ended = False

    def splice(self, *, from_client: bytes, from_upstream: bytes, client_paused: bool) -> None:
        """Hand both transports to the tunnel's ends and send what each side sent
        before the switch (bytes read past the request's head and the 101's).
        `client_paused`: the client is not to be read until the upstream drains."""
        limit = self.server.options.tunnel_buffer_bytes
        for end in (self.client_end, self.upstream_end):
            end.transport.set_protocol(end)
            end.transport.set_write_buffer_limits(high=limit)
        if from_upstream:
            self.upstream_end.data_received(from_upstream)
        if from_client:
            self.client_end.data_received(from_client)
        # the client was not read while the upgrade was pending; the upstream's reading
        # follows the client's write buffer as before
        self.client_end.reading_paused = True
        if not client_paused:
            self.client_end.resume_reading()
        transport = self.client_end.transport
        if transport.get_write_buffer_size() > limit:
            self.upstream_end.pause_reading()
        else:
            self.upstream_end.reading_paused = True
            self.upstream_end.resume_reading()

    @property
    def paused(self) -> tuple[bool, bool]:
        """(reading from the client paused, reading from the upstream paused)."""
        return self.client_end.reading_paused, self.upstream_end.reading_paused

    def close(self) -> None:
        """End both directions; what is buffered is still sent."""
        if self.reason is None:
            self.reason = CLOSED
        for end in (self.client_end, self.upstream_end):
            if not end.lost:
                end.transport.close()

    def cut(self, reason: str) -> None:
        """End both connections at once (idle, shutdown)."""
        if self.reason is None:
            self.reason = reason
        for end in (self.client_end, self.upstream_end):
            if not end.lost:
                end.transport.abort()

    def end_lost(self, end: TunnelEnd, exc: Exception | None) -> None:
        if self.reason is None:
            self.reason = CLOSED if exc is None else LOST
        other = end.other
        if not other.lost:
            # what this end sent before it went still reaches the other side
            other.transport.close()
            return
        if not self.ended:
            self.ended = True
            self.server.tunnel_ended(self)
