"""The proxies' access-log lines, received as datagrams on a loopback UDP socket.

Why UDP datagrams (decision 0045): NGINX (`access_log syslog:`) and HAProxy (`log`)
both send one datagram per request without touching a disk, so the raw sticky id in
a line lives only in this process's memory, long enough to be hashed. A unix
datagram socket would be the same to the proxies, but Linux queues at most
`net.unix.max_dgram_qlen` (10 by default) datagrams on one: a pause of a millisecond
drops lines. A UDP socket queues up to its receive buffer (asked for 8 MiB, granted
up to twice `net.core.rmem_max`), tens of thousands of lines.

Nothing is dropped silently: the kernel's count of datagrams it dropped because the
buffer was full becomes `dropped_kernel`. It arrives with the next datagram read
after a drop (`SO_RXQ_OVFL`), and is read again from /proc/net/udp (the socket's
`drops` column) whenever the figures are asked for, so a drop with nothing after it
is counted too; a datagram longer than `MAX_LINE` is read truncated and counted
`too_long` instead of being parsed.

The socket is drained in bursts from the event loop's reader callback (asyncio's
datagram transport reads one datagram per wake-up; a burst of up to 512 per wake-up
is what lets one Python process keep up with tens of thousands of lines a second).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from routers.samples.lines import MAX_LINE

log = logging.getLogger("canary.routers.samples")

# Linux's value; `socket` does not export it
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)
_OVFL_SPACE = socket.CMSG_SPACE(4)
RECEIVE_BUFFER = 8 << 20
BURST = 512


@dataclass
class ReceiverStats:
    datagrams: int = 0
    bytes: int = 0
    too_long: int = 0
    dropped_kernel: int = 0  # the kernel's count: buffer full, never read
    read_errors: int = 0


class LogReceiver:
    """Binds a UDP socket and hands every datagram to `handle`, in bursts."""

    def __init__(
        self,
        handle: Callable[[bytes], None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        receive_buffer: int = RECEIVE_BUFFER,
    ) -> None:
        self._handle = handle
        self._host = host
        self._port = port
        self._receive_buffer = receive_buffer
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = ReceiverStats()

    @property
    def address(self) -> tuple[str, int]:
        """Where the proxies send their lines (the port is known once started)."""
        if self._sock is None:
            raise RuntimeError("the receiver is not started")
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def granted_buffer(self) -> int:
        return self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) if self._sock else 0

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer)
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
            except OSError:  # not Linux: drops go uncounted by the kernel, said at start
                log.warning("this kernel does not count dropped log datagrams (SO_RXQ_OVFL)")
            sock.bind((self._host, self._port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._drain)
        if self.granted_buffer < self._receive_buffer:
            log.info(
                "log receiver buffer is %d bytes (asked %d; net.core.rmem_max bounds it)",
                self.granted_buffer,
                self._receive_buffer,
            )

    def _drain(self) -> None:
        sock = self._sock
        if sock is None:
            return
        stats = self.stats
        handle = self._handle
        for _ in range(BURST):
            try:
                data, ancdata, flags, _ = sock.recvmsg(MAX_LINE, _OVFL_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                stats.read_errors += 1
                log.warning("log receiver read failed: %s", exc)
                return
            stats.datagrams += 1
            stats.bytes += len(data)
            if ancdata:
                self._overflow(ancdata)
            if flags & socket.MSG_TRUNC:
                stats.too_long += 1
                continue
            try:
                handle(data)
            except Exception:  # a parser bug must not stop the receiver
                stats.read_errors += 1
                log.exception("a log line could not be handled")

    def _overflow(self, ancdata: list[tuple[int, int, bytes]]) -> None:
        for level, kind, value in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(value) >= 4:
                (total,) = struct.unpack("=I", value[:4])
                # the socket's own count since it was created (it wraps at 2^32)
                self.stats.dropped_kernel = total

    def refresh_drops(self) -> None:
        """Take the kernel's drop count from /proc (Linux); kept as is elsewhere."""
        if self._sock is None:
            return
        drops = socket_drops(self._sock)
        if drops is not None and drops > self.stats.dropped_kernel:
            self.stats.dropped_kernel = drops

    def drain(self) -> None:
        """Read what the socket holds now (before a shutdown's last flush)."""
        for _ in range(64):
            before = self.stats.datagrams
            self._drain()
            if self.stats.datagrams - before < BURST:
                return

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()


def socket_drops(sock: socket.socket) -> int | None:
    """The `drops` column of /proc/net/udp{,6} for this socket (matched by inode)."""
    import os

    inode = str(os.fstat(sock.fileno()).st_ino)
    table = "/proc/net/udp6" if sock.family == socket.AF_INET6 else "/proc/net/udp"
    try:
        with open(table, encoding="ascii") as rows:
            next(rows, None)
            for row in rows:
                fields = row.split()
                if len(fields) >= 13 and fields[9] == inode:
                    return int(fields[12])
    except (OSError, ValueError):
        return None
    return None


__all__ = ["LogReceiver", "ReceiverStats", "socket_drops"]
