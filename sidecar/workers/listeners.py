"""The workers' listening port, reserved by the supervisor before any worker starts.

Two ways to share one port among processes:

- `SO_REUSEPORT` on Linux (≥ 3.9): each worker binds and listens on its own socket;
  the kernel spreads new connections over the listening ones by a hash of the
  connection, and a dead worker's share goes to the others. (macOS and the BSDs
  accept the option but hand every connection to one socket, so they take the
  other way.) The supervisor
  holds a bound socket that never listens: it reserves the port (and learns it, for
  port 0) so that a bad address fails before any worker starts, and keeps it while
  workers come and go. A socket that only binds receives no connections.
- otherwise one listening socket, made by the supervisor and inherited by every
  worker (all accept on it; the kernel wakes one per connection).
"""

from __future__ import annotations

import contextlib
import socket
import sys
from dataclasses import dataclass, field
from enum import StrEnum


class ListenMode(StrEnum):
    REUSEPORT = "reuseport"
    INHERITED = "inherited"


def platform_mode() -> ListenMode:
    """SO_REUSEPORT where it balances connections (Linux) and a socket accepts it."""
    option = getattr(socket, "SO_REUSEPORT", None)
    if option is None or not sys.platform.startswith("linux"):
        return ListenMode.INHERITED
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, option, 1)
    except OSError:  # defined but refused (e.g. an old kernel)
        return ListenMode.INHERITED
    return ListenMode.REUSEPORT


@dataclass
class Listener:
    """The reserved port: `host` and `port` for workers that bind their own socket,
    `fd` for workers that inherit one (else None)."""

    mode: ListenMode
    host: str
    port: int
    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def fd(self) -> int | None:
        return self.sockets[0].fileno() if self.mode is ListenMode.INHERITED else None

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


def reserve(host: str, port: int, mode: ListenMode, *, backlog: int = 1024) -> Listener:
    """Bind host:port as `mode` requires; OSError (address in use, not local, …) says
    why it cannot be had."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if mode is ListenMode.INHERITED:
        infos = infos[:1]  # one socket to hand down
    listener = Listener(mode, host, port)
    try:
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            listener.sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if mode is ListenMode.REUSEPORT:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                # as asyncio binds: v6 only, so a v4 address of the same name can bind
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if listener.port:  # port 0: the first bind picks it, the others follow
                address = (address[0], listener.port, *address[2:])
            sock.bind(address)
            listener.port = sock.getsockname()[1]
        if mode is ListenMode.INHERITED:
            listener.sockets[0].listen(backlog)
            listener.sockets[0].set_inheritable(True)
    except BaseException:
        with contextlib.suppress(OSError):
            listener.close()
        raise
    return listener
