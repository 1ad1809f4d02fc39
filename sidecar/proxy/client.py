"""The client side of the proxy: one `ClientConnection` per client socket.

It parses requests with httptools, applies the checks of `conformance` and the head
size and time limits, refuses what fails them (then closes: the framing is in doubt),
and runs its requests' exchanges in order, pipelined ones queued behind the current.
Writes collected while one read is processed leave in one send (`CorkedWriter`).

Flow control: a full upstream write buffer pauses reading from the client, a full
client write buffer pauses reading from the upstream, so a body of any size streams
through with at most a few transport buffers in memory.

Upgrades: a request that asks to upgrade (`upgrades.mode`) stops the parser after
its head; nothing more is read until the upstream answers. A 101 hands both
connections to a `Tunnel` with the bytes read past the head; any other answer and the
connection goes on as HTTP, from those same bytes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Final, cast

import httptools

from sidecar.proxy import conformance, errors, upgrades
from sidecar.proxy.conformance import Rejected
from sidecar.proxy.corking import CorkedWriter
from sidecar.proxy.exchange import Exchange
from sidecar.proxy.h2.preface import negotiated_h2, preface_state
from sidecar.proxy.headers import PLAIN_CONNECTION, Header, connection_options
from sidecar.proxy.pausing import PIPELINED, STOPPED, UPGRADING, UPSTREAM_FULL
from sidecar.proxy.tunnel import Tunnel
from sidecar.proxy.upstream import UpstreamConnection

if TYPE_CHECKING:
    from sidecar.proxy.server import ProxyServer

# after an upstream answered before the request body was all in, the rest of the body
# is read and dropped for at most this long, so the close does not reset the answer
_LINGER: Final = 2.0


class ClientConnection(CorkedWriter, asyncio.Protocol):
    """One client socket: parses requests, runs their exchanges in order."""

    __slots__ = (
        "_after_flush",
        "_chunked",
        "_connection_field",
        "_corked_upstreams",
        "_fields_left",
        "_first_bytes",
        "_has_length",
        "_head_budget",
        "_headers",
        "_held",
        "_host",
        "_named",
        "_rejection",
        "_upgrade_asked",
        "_url",
        "client_ip",
        "closed",
        "current",
        "head_since",
        "idle_since",
        "parser",
        "parsing",
        "queue",
        "read_block",
        "refused",
        "server",
        "tags",
        "transport",
        "tunnel",
        "write_paused",
    )

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client_ip = b"unknown"
        # per variant name, as the exchange sends them: the experiment, the variant's
        # and the experiment's bytes and `headers.request_tail`. A connection's
        # requests share its address and meet few variants: joined once each
        self.tags: dict[str, tuple[str | None, bytes, bytes | None, bytes]] = {}
        self.closed = False
        self.current: Exchange | None = None
        self.parsing: Exchange | None = None
        self.queue: deque[Exchange] = deque()
        self.read_block = 0
        self.write_paused = False
        self.idle_since = 0.0
        # when the request head being received began (0.0: none is), see on_message_begin
        self.head_since = 0.0
        self.refused = False  # closed at once: the connection cap was reached
        self._rejection: bytes | None = None  # sent once the requests before it are answered
        self._url = b""
        self._headers: list[Header] = []
        self._host: bytes | None = None
        self._chunked = False
        self._has_length = False
        self._named: frozenset[bytes] | None = None
        self._upgrade_asked = False  # the head's Connection lists `upgrade`
        # the head has a Connection or Proxy-Connection field (see on_headers_complete)
        self._connection_field = False
        # bytes read past the head of a request asking to upgrade, until it is answered
        self._held: bytes | None = None
        self.tunnel: Tunnel | None = None  # the connection's tunnel after a 101
        self._head_budget = server.options.max_head_bytes
        self._fields_left = server.options.max_header_count  # and of its fields
        # Writes collected while one read is processed leave in one send: syscalls,
        # not Python, are most of a small request's cost.
        self._out: list[bytes] | None = None
        self._after_flush: list[tuple[Exchange, int]] = []
        self._corked_upstreams: list[UpstreamConnection] | None = None
        # the bytes read before it is known whether the client speaks HTTP/2 (its
        # preface may come in pieces); None once that is known
        self._first_bytes: bytes | None = b"" if server.options.http2 else None

    # --- asyncio.Protocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.client_ip = str(peer[0]).encode()
        self.idle_since = self.head_since = self.server.time()
        self.server.connection_opened(self)
        if (
            self._first_bytes is not None
            and not self.closed
            and not self.refused
            and negotiated_h2(transport.get_extra_info("ssl_object"))
        ):
            self._first_bytes = None
            self.server.h2.take_over(self, b"")

    def data_received(self, data: bytes) -> None:
        if self._first_bytes is not None:
            data = self._first_bytes + data
            state = preface_state(data)
            if state == "more":
                self._first_bytes = data
                return
            self._first_bytes = None
            if state == "h2":
                self.server.h2.take_over(self, data)
                return
        corked: list[UpstreamConnection] = []
        self._corked_upstreams = corked
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            last = self.parsing or (self.queue[-1] if self.queue else self.current)
            if last is not None and last.upgrade is not None:
                # what follows is the new protocol's if the upstream switches, the next
                # request's if it does not: held, and nothing more read, until it answers
                self._held = data[exc.args[0] :]
                self.block(UPGRADING)
            else:
                # the request went on as a plain one (Upgrade is hop-by-hop and dropped);
                # what follows is another protocol, so the connection ends after it
                if last is not None:
                    last.close_after = True
                self.block(STOPPED)
        except httptools.HttpParserError as exc:
            self.refuse(exc)
        finally:
            if self.head_since < 0:  # a head began in this read and goes on in the next
                self.head_since = self.server.time()
            self._corked_upstreams = None
            for upstream in corked:
                upstream.uncork()

    def refuse(self, exc: httptools.HttpParserError) -> None:
        """A request was refused, by httptools or by the checks in `conformance`.

        Nothing after it on this connection is read: its framing is in doubt. A
        request whose body was being read when it broke has its upstream connection
        cut. Complete requests before it are answered first, then the error, then
        the connection closes."""
        self.block(STOPPED)
        cause = exc.__context__
        if isinstance(cause, Rejected):
            status, reason, detail = cause.status, cause.reason, cause.detail
        else:
            status, reason = 400, conformance.parser_error_reason(exc)
            detail = f"malformed request: {exc}"
        self.server.metrics.reject(reason)
        response = errors.rejected(status, detail)
        broken = self.parsing
        self.parsing = None
        if broken is not None:
            broken.request_broken()
            if broken is self.current:
                self.current = None
                if broken.resp_started:
                    self.abort()  # part of its response is out: all that is left is to cut
                    return
            else:  # queued behind the current request and never started
                self.queue.remove(broken)
        if self.current is None:
            self.write(response)
            self.close()
        else:
            self._rejection = response  # after the responses still owed

    def linger(self) -> None:
        """The response went out before its request was all in: the rest of the
        request is read and dropped, then the connection closes (at the latest after
        `_LINGER` seconds; closing with unread data would reset the response)."""
        if not self.closed:
            self.server.loop.call_later(_LINGER, self.close)

    def cork_upstream(self, upstream: UpstreamConnection) -> None:
        """While this read is processed, hold what goes to `upstream` for one send."""
        corked = self._corked_upstreams
        if corked is not None and upstream.cork():
            corked.append(upstream)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        current = self.current
        self.current = None
        self.queue.clear()
        if current is not None:
            current.client_lost()
        if not self.refused:
            self.server.connection_closed(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.pause_reading()
        # a relay to an HTTP/2 upstream reads `write_paused` itself (h2/relay.py)

    def resume_writing(self) -> None:
        self.write_paused = False
        current = self.current
        if current is not None:
            if current.upstream is not None:
                current.upstream.resume_reading()
            elif current.relay is not None:
                current.relay.client_resumed()

    # --- httptools callbacks ----------------------------------------------------

    # httptools sets no limit on a request head: without one a client could make the
    # proxy hold any amount of memory. `_head_budget` is what is left of the limit,
    # `_fields_left` of the field count's.

    def on_message_begin(self) -> None:
        if not self.head_since:  # a new connection's head is timed from its opening
            # timed once this read is parsed, and only if the head is still incomplete
            # then: most heads end in the read that starts them
            self.head_since = -1.0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_budget -= len(url)
        if self._head_budget < 0:
            raise self._too_large()

    def _too_large(self) -> Rejected:
        limit = self.server.options.max_head_bytes
        return Rejected(431, "head_too_large", f"request line and headers exceed {limit} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        budget = self._head_budget = self._head_budget - len(name) - len(value) - 4
        if budget < 0:
            raise self._too_large()
        fields_left = self._fields_left = self._fields_left - 1
        if fields_left < 0:
            # after the head, httptools reports a chunked body's trailers here
            raise conformance.too_many_fields(
                self.server.options.max_header_count, trailers=self.parsing is not None
            )
        lower = name.lower()
        if lower == b"host":
            if self._host is not None:
                raise conformance.duplicate_host()
            self._host = value
        elif lower == b"content-length":
            # httptools has checked it is one decimal number, at most surrounded by OWS
            self._has_length = value.strip().lstrip(b"0") != b""
        elif lower == b"transfer-encoding":
            if self._chunked:
                raise conformance.duplicate_transfer_encoding()
            conformance.check_transfer_coding(value)
            self._chunked = True
        elif lower == b"connection":
            self._connection_field = True
            if value not in PLAIN_CONNECTION:
                conformance.check_connection(value)
                options = connection_options(value)
                if options is not None:
                    self._named = options if self._named is None else self._named | options
                if upgrades.connection_lists_upgrade(value):
                    self._upgrade_asked = True
        elif lower == b"proxy-connection":
            self._connection_field = True  # llhttp reads it as Connection
        self._headers.append((lower, name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        keep_alive = parser.should_keep_alive()
        # llhttp takes the request lines of HTTP/0.9, 1.0, 1.1 and 2.0 and keeps only
        # 1.1 alive unless a Connection or Proxy-Connection field asks for it: without
        # one, keep-alive means 1.1, and get_http_version(), which formats a string
        # on every call (the costliest call here), is left out
        version = (
            "1.1" if keep_alive and not self._connection_field else parser.get_http_version()
        )
        method = parser.get_method()
        if version != "1.1":
            if version != "1.0":
                raise conformance.unsupported_version(version)
            if self._chunked:  # RFC 9112 §6.1: an HTTP/1.0 message's framing is faulty
                raise Rejected(400, "framing", "Transfer-Encoding in an HTTP/1.0 request")
        elif self._host is None:
            raise conformance.missing_host()
        if method == b"CONNECT":
            raise conformance.connect_refused()
        asked = self._upgrade() if self._upgrade_asked else None
        target = self._url
        if not target.startswith(b"/"):
            target = conformance.request_target(method, target, self._host)
        self.head_since = 0.0
        exchange = Exchange(
            self,
            method,
            target,
            self._headers,
            keep_alive,
            version == "1.0",  # http_1_0
            self._chunked,
            self._named,
            self._chunked or self._has_length,  # has_body
        )
        exchange.upgrade = asked
        self._next_head()
        self.parsing = exchange
        if self.current is None:
            self.current = exchange
            exchange.start()
        else:
            self.queue.append(exchange)
            self.block(PIPELINED)

    def _next_head(self) -> None:
        """Reset what the next request's head (or this one's trailers) is gathered into."""
        self._url = b""
        self._headers = []
        self._host = None
        self._chunked = self._has_length = False
        self._named = None
        self._upgrade_asked = self._connection_field = False
        self._head_budget = self.server.options.max_head_bytes
        self._fields_left = self.server.options.max_header_count

    def _upgrade(self) -> tuple[bytes, ...] | None:
        """The protocols to tunnel for a request whose Connection lists `upgrade`, or
        None when it is forwarded as a plain request (see `upgrades.mode`)."""
        values = [value for lower, _, value in self._headers if lower == b"upgrade"]
        if not values:
            return None  # not an upgrade for httptools either
        asked = upgrades.protocols(values)
        mode = upgrades.mode(
            http_1_0=self.parser.get_http_version() == "1.0",
            asked=asked,
            has_body=self._chunked or self._has_length,
        )
        return asked if mode is upgrades.UpgradeMode.TUNNEL else None

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None:
            exchange.request_body(body)

    def on_message_complete(self) -> None:
        exchange = self.parsing
        self.parsing = None
        if self._headers:
            # httptools reports a chunked body's trailer fields as headers after it
            trailers = self._headers
            self._next_head()
            if exchange is not None:
                exchange.request_trailers(trailers)
        if exchange is not None:
            if exchange.upgrade is not None and not self.parser.should_upgrade():
                exchange.cancel_upgrade()  # httptools reads on as HTTP: no tunnel then
            exchange.request_complete()

    # --- used by exchanges ------------------------------------------------------

    def exchange_finished(self, exchange: Exchange) -> None:
        if exchange is not self.current:
            return
        self.current = None
        if exchange.close_after or self.server.draining:
            self.close()
            return
        if self.queue:
            following = self.queue.popleft()
            if not self.queue:
                self.unblock(PIPELINED)
            self.current = following
            following.start()
        elif self._rejection is not None:
            self.write(self._rejection)
            self.close()
        else:
            self.idle_since = self.server.time()
            if self._held is not None:
                # an upgrade the upstream refused: the connection goes on as HTTP, from
                # the bytes read past its head (fed once this callback has returned)
                self.server.loop.call_soon(self._resume_after_upgrade)

    def _resume_after_upgrade(self) -> None:
        held, self._held = self._held, None
        if self.closed or self.tunnel is not None:
            return
        # reading resumes no earlier than the next turn of the loop, after the held
        # bytes; they may hold another upgrade, which blocks reading again
        self.unblock(UPGRADING)
        if held:
            self.data_received(held)

    def start_tunnel(self, upstream: UpstreamConnection, from_upstream: bytes) -> None:
        """The upstream switched protocols: from now on both connections are one tunnel."""
        assert self.transport is not None
        server = self.server
        tunnel = self.tunnel = Tunnel(server, self, self.transport, upstream.detach())
        self.current = None
        held, self._held = self._held or b"", None
        client_paused = bool(self.read_block & UPSTREAM_FULL)
        self.read_block = 0  # reading is the tunnel's business now
        server.tunnel_opened(tunnel)
        tunnel.splice(from_client=held, from_upstream=from_upstream, client_paused=client_paused)

    def tunnel_ended(self) -> None:
        """Both connections of this connection's tunnel are gone."""
        self.tunnel = None
        self.closed = True
        self.server.connection_closed(self)

    @property
    def idle(self) -> bool:
        return self.current is None and self.parsing is None and self.tunnel is None

    def uncork(self) -> None:
        """Send what was collected in one go, then record what finished meanwhile."""
        self.send_held()
        if self._after_flush:
            finished, self._after_flush = self._after_flush, []
            self.server.finished(finished)

    def record_after_flush(self, exchange: Exchange, outcome: int) -> bool:
        """Defer a record until the response bytes are handed to the transport."""
        if self._out is None:
            return False
        self._after_flush.append((exchange, outcome))
        return True

    def block(self, reason: int) -> None:
        if not self.read_block and not self.closed and self.transport is not None:
            self.transport.pause_reading()
        self.read_block |= reason

    def unblock(self, reasons: int) -> None:
        if self.read_block & reasons:
            self.read_block &= ~reasons
            if not self.read_block and not self.closed and self.transport is not None:
                self.transport.resume_reading()

    def close(self) -> None:
        if self._out is not None:
            self.uncork()  # what was collected goes out before the close
        if not self.closed and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self._out is not None:
            self._out = []
            self.uncork()  # nothing to send, but deferred records still run
        if not self.closed and self.transport is not None:
            self.transport.abort()
