"""The proxy's settings: timeouts, pool and connection limits, TLS on either side, HTTP/2."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final

# the default per-client connection cap: room for an ingress's or a NAT's pool of
# connections, far below the default max_connections
DEFAULT_MAX_PER_CLIENT: Final = 512


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    connect_timeout: float = 2.0  # seconds to open an upstream connection (→ 504)
    read_timeout: float = 30.0  # seconds without a byte while a response is owed (→ 504)
    max_pool_per_upstream: int = 256  # idle keep-alive connections kept per upstream
    pool_idle_timeout: float = 60.0  # idle upstream connections older than this are closed
    client_idle_timeout: float = 75.0  # idle keep-alive client connections are closed
    shutdown_timeout: float = 10.0  # stop(): in-flight requests get this long to finish
    forwarded_proto: str = "http"  # X-Forwarded-Proto: the scheme clients used
    preserve_host: bool = False  # pass the client's Host instead of the upstream's
    ssl_context: ssl.SSLContext | None = None  # for https upstreams; default: system CAs
    backlog: int = 1024
    max_head_bytes: int = 64 * 1024  # request line + headers; larger answers 431
    # header fields in one request head, in one chunked request's trailers, in one
    # HTTP/2 header block; more answers 431 (a trailer section: the request is cut)
    max_header_count: int = 100
    # client connections held at once, TLS handshakes included; more are refused at
    # once (plain HTTP: 503)
    max_connections: int = 10_000
    # client connections one address holds at once, within max_connections: more are
    # refused like those beyond it. None: a quarter of max_connections, at most 512;
    # 0: no such cap (clients behind one NAT or one ingress)
    max_connections_per_client: int | None = None
    # IPv6 clients are counted per network of this prefix length (128: per address)
    client_ipv6_prefix: int = 128
    # seconds for a TLS client to complete its handshake, counted from accept
    tls_handshake_timeout: float = 10.0
    # seconds for a request head to arrive in full, from its first byte (from the
    # connection's opening for its first request); then 408 and close
    head_timeout: float = 10.0
    # the listener's TLS (clients speak HTTPS to the sidecar); X-Forwarded-Proto then
    # says https
    listen_tls: ssl.SSLContext | None = None
    # HTTP/2 clients: h2c with prior knowledge, and ALPN h2 on a TLS listener
    http2: bool = True
    h2_max_streams: int = 100  # concurrent streams a client may open (SETTINGS)
    # flow-control windows the proxy gives each peer: what one stream (and one
    # connection) may have in flight through the proxy
    h2_stream_window: int = 256 * 1024
    h2_connection_window: int = 1024 * 1024
    h2_max_resets: int = 200  # client stream resets per second before the connection is cut
    h2_max_streams_upstream: int = 1000  # streams opened on one upstream connection at once
    h2_max_waiting: int = 1000  # requests waiting for a stream to one HTTP/2 upstream
    # upgraded connections (WebSocket…) spliced as byte tunnels: cut after this many
    # seconds without a byte either way
    tunnel_idle_timeout: float = 300.0
    # tunnels open at once (each holds a client connection, counted within
    # max_connections); None: half of max_connections, so plain requests keep room
    max_tunnels: int | None = None
    # a tunnel's write buffer, each way: past it the other side is not read
    tunnel_buffer_bytes: int = 256 * 1024

    @property
    def client_limit(self) -> int:
        """Connections one client may hold; 0: no per-client cap."""
        if self.max_connections_per_client is not None:
            return min(self.max_connections_per_client, self.max_connections)
        return max(1, min(DEFAULT_MAX_PER_CLIENT, self.max_connections // 4))

    @property
    def tunnel_limit(self) -> int:
        if self.max_tunnels is not None:
            return min(self.max_tunnels, self.max_connections)
        return max(1, self.max_connections // 2)
