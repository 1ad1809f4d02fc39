"""A TLS client from accept until its handshake is done.

Had the loop run the handshake (`create_server(ssl=…)`), the proxy would first hear
of a connection once its handshake was over: connections that never finish one would
hold descriptors outside the connection caps and the head timeout. Here a plain TCP
connection is admitted at accept (`ProxyServer.handshake_started`, refused at once
past a cap), `loop.start_tls` runs the handshake within `tls_handshake_timeout`, and
only then does a `ClientConnection` take the connection over.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, cast

from sidecar.proxy.client import ClientConnection

if TYPE_CHECKING:
    from sidecar.proxy.server import ProxyServer

TIMEOUT = "timeout"
ERROR = "error"


class TlsHandshake(asyncio.Protocol):
    """The protocol of an accepted socket on a TLS listener, until the handshake ends.

    It is also the TLS transport's protocol for the moment between the handshake's
    end and the `ClientConnection` taking over: what arrives then is kept for it."""

    def __init__(self, server: ProxyServer, context: ssl.SSLContext) -> None:
        self.server = server
        self.context = context
        self.client_ip = b"unknown"
        self.early: list[bytes] = []  # decrypted bytes that came with the handshake's end
        # bytes read before `start_tls` took the transport over (uvloop starts reading
        # right after connection_made, whatever it asked): the client hello's start
        self.hello: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # uvloop's do not derive from it
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.client_ip = str(peer[0]).encode()
        self.transport = transport
        server = self.server
        if not server.handshake_started(self.client_ip):
            transport.abort()  # nothing was sent, nothing to flush: the descriptor goes now
            return
        # the client hello waits in the socket for `start_tls`, which resumes reading
        transport.pause_reading()
        task = server.loop.create_task(self._handshake(transport))
        server.tasks.add(task)
        task.add_done_callback(server.tasks.discard)

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and transport.get_protocol() is self:  # not through TLS
            self.hello.append(data)
            transport.pause_reading()  # the rest waits for the TLS layer
            return
        self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    async def _handshake(self, transport: asyncio.Transport) -> None:
        server = self.server
        failure: str | None = ERROR  # anything unforeseen frees the slot as well
        tls: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(server.options.tls_handshake_timeout):
                tls = await self._start_tls(transport)
            failure = None
        except TimeoutError:
            failure = TIMEOUT
        except asyncio.CancelledError:  # the proxy stops
            failure = None
            raise
        except OSError:  # ssl.SSLError, a reset: the transport is closed already
            pass
        finally:
            server.handshake_ended(self.client_ip, failure)
        if tls is None or self.lost:
            return
        conn = ClientConnection(server)
        tls.set_protocol(conn)
        conn.connection_made(tls)  # takes the slot the handshake held
        if self.early and not conn.closed:
            early, self.early = b"".join(self.early), []
            # `conn` itself, or the HTTP/2 connection it handed the transport to
            cast(asyncio.Protocol, tls.get_protocol()).data_received(early)

    async def _start_tls(self, transport: asyncio.Transport) -> asyncio.Transport | None:
        """`loop.start_tls`, given the bytes read before it too.

        start_tls sets its TLS protocol on the transport at once (nothing more reaches
        this one unencrypted), then starts it and resumes reading in the loop's next
        turn. The bytes read before must reach the TLS protocol after it started and
        before anything read later: a callback queued behind start_tls's first step
        queues `_replay_hello` behind those two, in the same turn."""
        loop = self.server.loop
        starting = loop.create_task(loop.start_tls(transport, self, self.context, server_side=True))
        loop.call_soon(loop.call_soon, self._replay_hello, transport)
        return await starting

    def _replay_hello(self, transport: asyncio.Transport) -> None:
        hello, self.hello = b"".join(self.hello), []
        if not hello or transport.is_closing() or transport.get_protocol() is self:
            return
        # the TLS protocol is a buffered one (asyncio's and uvloop's alike)
        protocol = cast(asyncio.BufferedProtocol, transport.get_protocol())
        view = memoryview(hello)
        while view:
            buffer = memoryview(protocol.get_buffer(len(view)))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            protocol.buffer_updated(size)
            view = view[size:]
