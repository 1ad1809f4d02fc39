"""An open-loop load generator that tells the sidecar's failures from the upstream's.

Requests leave on a fixed schedule (`rate` per second) whatever the responses do, as
real users would, each from one of many users (`x-user-id`), over pooled keep-alive
connections to the sidecar. Every response is attributed:

- ok: anything below 500;
- upstream: a 5xx the upstream sent (the proxy passes it through unchanged);
- sidecar: a connection error, a reset or a truncated response, or a 5xx the proxy
  generated itself (its 502/503/504 carry `application/problem+json`).

Only the sidecar's count says something about the sidecar; a canary's own errors are
what the breaker is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

PROBLEM_JSON = "application/problem+json"
VARIANT_HEADER = "x-canary-variant"


class Attribution(StrEnum):
    OK = "ok"
    UPSTREAM = "upstream"
    SIDECAR = "sidecar"


def attribute(status: int | None, content_type: str | None) -> Attribution:
    """Who a response (or its absence: status None) is to be blamed on."""
    if status is None:
        return Attribution.SIDECAR  # the client only ever talks to the sidecar
    if status < 500:
        return Attribution.OK
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return Attribution.SIDECAR if media == PROBLEM_JSON else Attribution.UPSTREAM


@dataclass
class LoadStats:
    """Totals since start; `mark()`/`since()` give a scenario its own share."""

    sent: int = 0
    completed: int = 0
    ok: int = 0
    upstream_failed: int = 0
    sidecar_failed: int = 0
    skipped: int = 0  # not sent: too many requests already in flight
    by_variant: Counter[str] = field(default_factory=Counter)
    sidecar_reasons: Counter[str] = field(default_factory=Counter)
    # sent again on a new connection: a kept-alive one was closed by the proxy before
    # any byte of the answer (RFC 9112 §9.3.1; what browsers and HTTP libraries do)
    stale_retries: int = 0

    def copy(self) -> LoadStats:
        return LoadStats(
            self.sent, self.completed, self.ok, self.upstream_failed, self.sidecar_failed,
            self.skipped, Counter(self.by_variant), Counter(self.sidecar_reasons),
            self.stale_retries,
        )  # fmt: skip

    def minus(self, before: LoadStats) -> LoadStats:
        return LoadStats(
            self.sent - before.sent,
            self.completed - before.completed,
            self.ok - before.ok,
            self.upstream_failed - before.upstream_failed,
            self.sidecar_failed - before.sidecar_failed,
            self.skipped - before.skipped,
            self.by_variant - before.by_variant,
            self.sidecar_reasons - before.sidecar_reasons,
            self.stale_retries - before.stale_retries,
        )


class _Response:
    __slots__ = ("content_type", "keep_alive", "status", "variant")

    def __init__(
        self, status: int, content_type: str | None, variant: str | None, keep_alive: bool
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.variant = variant
        self.keep_alive = keep_alive


class _Connection:
    __slots__ = ("idle_since", "reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()
        self.reused = False

    def close(self) -> None:
        self.writer.close()


def _nothing_received(exc: BaseException) -> bool:
    """No byte of a response arrived before the connection failed."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return not exc.partial
    return True


class LoadGenerator:
    """`rate` requests per second to http://host:port`path`, from `users` distinct users.

    idle_timeout: pooled connections idle longer are closed by the client. It is well
        below the proxy's own idle timeout so the client never reuses a connection the
        proxy is closing (a race any client would lose, and not the sidecar's fault).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        rate: float = 200.0,
        users: int = 5_000,
        path: str = "/shop/items",
        timeout: float = 10.0,
        # one address's connections: below the sidecar's default per-client cap (512),
        # so a slow machine makes the generator skip sends, never the sidecar refuse them
        max_in_flight: int = 400,
        idle_timeout: float = 20.0,
        seed: int | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.host = host
        self.port = port
        self.rate = rate
        self.users = users
        self.path = path
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.idle_timeout = idle_timeout
        self.stats = LoadStats()
        # wall-clock send time of the latest request each variant answered
        self.last_sent_to: dict[str, float] = {}
        self.started_at: float | None = None  # wall clock
        self._rng = random.Random(seed)
        self._idle: list[_Connection] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def start(self) -> None:
        if self._task is None:
            self.started_at = time.time()
            self._task = asyncio.create_task(self._schedule(), name="demo-load")

    async def stop(self, drain: float = 5.0) -> None:
        """Stop sending; give requests in flight `drain` seconds, then close everything."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=drain)
        for pending in list(self._in_flight):
            pending.cancel()
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def _schedule(self) -> None:
        # open loop: request i leaves at start + i / rate, however long the others take
        interval = 1.0 / self.rate
        start = time.monotonic()
        i = 0
        while True:
            now = time.monotonic()
            due = start + i * interval
            if due > now:
                await asyncio.sleep(due - now)
                continue
            # catch up after a stall; max_in_flight bounds the burst
            while start + i * interval <= now:
                i += 1
                self._send_one()
            self._expire_idle(now)

    def _send_one(self) -> None:
        if len(self._in_flight) >= self.max_in_flight:
            self.stats.skipped += 1
            return
        user = f"user-{self._rng.randrange(self.users)}"
        task = asyncio.create_task(self._request(user))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def _expire_idle(self, now: float) -> None:
        if self._idle and now - self._idle[0].idle_since > self.idle_timeout:
            keep = []
            for conn in self._idle:
                if now - conn.idle_since > self.idle_timeout:
                    conn.close()
                else:
                    keep.append(conn)
            self._idle = keep

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()  # most recently used first: the rest age out
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn.reused = True
                return conn
            conn.close()
        return await self._connection_new()

    async def _connection_new(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Connection(reader, writer)

    async def _request(self, user: str) -> None:
        self.stats.sent += 1
        sent_at = time.time()
        conn: _Connection | None = None
        response: _Response | None = None
        reason = ""
        try:
            async with asyncio.timeout(self.timeout):
                conn = await self._connection()
                try:
                    response = await self._exchange(conn, user)
                except (ConnectionError, asyncio.IncompleteReadError) as exc:
                    if not conn.reused or not _nothing_received(exc):
                        raise
                    # the proxy closed the idle connection as the request went out
                    # (a reload, an idle timeout): once more, on a new one
                    conn.close()
                    self.stats.stale_retries += 1
                    conn = await self._connection_new()
                    response = await self._exchange(conn, user)
        except TimeoutError:
            reason = "timeout"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            reason = type(exc).__name__
        self.stats.completed += 1
        if response is None:
            if conn is not None:
                conn.close()
            self._count(Attribution.SIDECAR, reason)
            return
        if response.keep_alive and conn is not None:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        elif conn is not None:
            conn.close()
        verdict = attribute(response.status, response.content_type)
        self._count(verdict, f"HTTP {response.status}")
        if response.variant:
            self.stats.by_variant[response.variant] += 1
            previous = self.last_sent_to.get(response.variant, 0.0)
            self.last_sent_to[response.variant] = max(previous, sent_at)

    def _count(self, verdict: Attribution, reason: str) -> None:
        if verdict is Attribution.OK:
            self.stats.ok += 1
        elif verdict is Attribution.UPSTREAM:
            self.stats.upstream_failed += 1
        else:
            self.stats.sidecar_failed += 1
            self.stats.sidecar_reasons[reason] += 1

    async def _exchange(self, conn: _Connection, user: str) -> _Response:
        conn.writer.write(
            (
                f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"x-user-id: {user}\r\nAccept: application/json\r\n\r\n"
            ).encode("latin-1")
        )
        await conn.writer.drain()
        return await read_response(conn.reader)


async def read_response(reader: asyncio.StreamReader) -> _Response:
    """One HTTP/1.1 response: head, then a Content-Length, chunked or close-delimited body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    keep_alive = "close" not in headers.get("connection", "").lower()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            await reader.readexactly(size + 2)
    elif "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif status >= 200 and status not in (204, 304):
        await reader.read()  # delimited by the close
        keep_alive = False
    return _Response(status, headers.get("content-type"), headers.get(VARIANT_HEADER), keep_alive)
