"""An admin listener on a thread of its own, and the main loop's heartbeat it reports.

A process whose event loop runs long slices of work (the collector's ingest and
export) would answer its probes only between slices. Served from another thread with
its own event loop, /healthz and /metrics get their turn every GIL switch interval
instead. Answering from elsewhere, "alive" would no longer mean the main loop runs:
the main loop stamps a `Heartbeat`, and `liveness` fails once it is older than a
bound, so a busy process is kept and a wedged one restarted.

The listener is a network edge: a request head is bounded in size and in time, only
GET and HEAD are answered, connections beyond a limit are closed at once, and every
request refused for any of these is counted by reason (`refused`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.kernel.clock import Clock

log = logging.getLogger("canary.admin")

TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 503: "Service Unavailable"}
REFUSALS = ("timeout", "oversize", "malformed", "busy")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: str = ""  # extra header lines, each ending in CRLF


# (path, raw request head) -> the answer; called on the admin thread
Respond = Callable[[str, bytes], Answer]


@dataclass(frozen=True)
class Limits:
    max_head: int = 16 * 1024
    read_timeout: float = 5.0  # the whole head, not per byte: a slow client is cut off
    write_timeout: float = 5.0
    max_connections: int = 64


class Heartbeat:
    """The main loop's last sign of life. `beat` runs on the main loop; `age` is read
    from the admin thread (one float attribute: a read is atomic)."""

    def __init__(self, clock: Clock, *, every: float = 0.1, bound: float = 30.0) -> None:
        if every <= 0 or bound <= 0:
            raise ValueError("heartbeat period and bound must be positive")
        self.clock = clock
        self.every = every
        self.bound = bound
        self.last = clock.monotonic()

    def beat(self) -> None:
        self.last = self.clock.monotonic()

    def age(self) -> float:
        return max(0.0, self.clock.monotonic() - self.last)

    async def run(self) -> None:
        while True:
            self.beat()
            await asyncio.sleep(self.every)


def liveness(age: float, bound: float) -> Answer:
    """200 while the main loop's heartbeat is within `bound` seconds, else 503 saying
    how old it is."""
    if age <= bound:
        return Answer(200, b"ok\n")
    return Answer(503, f"main loop stalled: last heartbeat {age:.1f} s ago "
                       f"(bound {bound:g} s)\n".encode())


def request_line(head: bytes) -> tuple[str, str]:
    """Method and path (query dropped) of a request head; ValueError unless it is
    `METHOD /target HTTP/1.x` in ASCII."""
    line = head.split(b"\r\n", 1)[0].decode("ascii")
    method, target, version = line.split(" ")
    if not (method.isalpha() and method.isupper() and target.startswith("/")
            and version in ("HTTP/1.0", "HTTP/1.1")):
        raise ValueError(f"not an HTTP/1 request line: {line[:80]!r}")
    return method, target.split("?", 1)[0]


class AdminThread:
    """Serves `respond` on host:port from a daemon thread running its own event loop.

    `start` binds in the caller's thread, so a port in use raises OSError there;
    `stop` closes the listener and every open connection and joins the thread."""

    def __init__(self, respond: Respond, *, limits: Limits | None = None,
                 name: str = "canary-admin") -> None:
        self._respond = respond
        self.limits = limits or Limits()
        self._name = name
        self.refused = dict.fromkeys(REFUSALS, 0)  # written on the admin thread only
        self._open = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None

    def start(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=128)
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            self.stop()
            self._sock.close()
            raise self._failure

    @property
    def port(self) -> int:
        assert self._sock is not None, "the admin server is not started"
        port: int = self._sock.getsockname()[1]
        return port

    def stop(self, timeout: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the admin thread did not stop within %g s", timeout)

    def metrics_collector(self, prefix: str) -> Collector:
        return _RefusedCollector(self, prefix)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by start(), or logged once running
            if not self._started.is_set():
                self._failure = exc
            else:
                log.exception("the admin thread failed")
        finally:
            self._started.set()
            loop.close()

    async def _serve(self) -> None:
        assert self._sock is not None
        self._stopping = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await self._connection(reader, writer)
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(handle, sock=self._sock, limit=self.limits.max_head)
        self._started.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for task in list(handlers):
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > self.limits.max_connections:
                self.refused["busy"] += 1
                return
            answer, method = await self._read_and_answer(reader)
            if answer is None:
                return
            head = (f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, '')}\r\n"
                    f"Content-Type: {answer.content_type}\r\n{answer.headers}"
                    f"Content-Length: {len(answer.body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + (b"" if method == "HEAD" else answer.body))
            async with asyncio.timeout(self.limits.write_timeout):
                await writer.drain()
        except TimeoutError:
            self.refused["timeout"] += 1  # a client that does not read its answer
        except ConnectionError:
            pass
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_and_answer(
        self, reader: asyncio.StreamReader
    ) -> tuple[Answer | None, str]:
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            self.refused["timeout"] += 1
            return None, ""
        except asyncio.LimitOverrunError:
            self.refused["oversize"] += 1
            return Answer(400, b"request head too large\n"), "GET"
        except asyncio.IncompleteReadError:
            self.refused["malformed"] += 1  # closed before the head ended
            return None, ""
        try:
            method, path = request_line(head)
        except (UnicodeDecodeError, ValueError):
            self.refused["malformed"] += 1
            return Answer(400, b"bad request\n"), "GET"
        if method not in ("GET", "HEAD"):
            return Answer(405, b"method not allowed\n"), method
        return self._respond(path, head), method


class _RefusedCollector(Collector):
    def __init__(self, admin: AdminThread, prefix: str) -> None:
        self._admin = admin
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            f"{self._prefix}_admin_refused",
            "Admin connections refused or cut off: timeout (slow client), oversize head, "
            "malformed request, busy (too many open)", labels=["reason"],
        )
        for reason, count in list(self._admin.refused.items()):
            refused.add_metric([reason], count)
        yield refused
