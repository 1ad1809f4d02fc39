"""Small HTTP/1.1 upstreams with a latency and error profile, switchable at runtime.

Each response waits a lognormal delay around the profile's median (times its
slow-down factor) and fails with a 500 at the profile's error rate. The upstream's
own errors are plain text, never problem+json: that is how the load generator tells
them apart from the proxy's answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from dataclasses import dataclass

MAX_HEAD = 64 * 1024


@dataclass
class LatencyProfile:
    """Response time lognormal around `median_ms` (spread `sigma`), x `factor`."""

    # P95 about 130 ms healthy, about 650 ms at x5: far apart on either side of the
    # demo rule's 500 ms, so a host that stalls for a moment does not trip a healthy canary
    median_ms: float = 80.0
    sigma: float = 0.3
    error_rate: float = 0.002
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.median_ms <= 0 or self.sigma < 0 or self.factor <= 0:
            raise ValueError("median_ms and factor must be > 0, sigma ≥ 0")
        if not 0 <= self.error_rate <= 1:
            raise ValueError("error_rate must be within 0..1")

    def delay_ms(self, rng: random.Random) -> float:
        return self.median_ms * self.factor * math.exp(rng.gauss(0.0, self.sigma))

    def fails(self, rng: random.Random) -> bool:
        return rng.random() < self.error_rate

    def quantile_ms(self, q: float) -> float:
        """The profile's exact q-quantile (0 < q < 1), for tests and the demo's notes."""
        from statistics import NormalDist

        return self.median_ms * self.factor * math.exp(self.sigma * NormalDist().inv_cdf(q))

    def degrade(self, factor: float) -> None:
        self.factor = factor

    def restore(self) -> None:
        self.factor = 1.0


@dataclass
class UpstreamStats:
    requests: int = 0
    errors: int = 0
    connections: int = 0


class UpstreamServer:
    """One upstream version on 127.0.0.1; keep-alive, Content-Length or chunked bodies."""

    def __init__(
        self, name: str, profile: LatencyProfile | None = None, *, seed: int | None = None
    ) -> None:
        self.name = name
        self.profile = profile or LatencyProfile()
        self.stats = UpstreamStats()
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        self._writers.add(writer)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                keep_alive = request
                await self._respond(writer, keep_alive=keep_alive)
                if not keep_alive:
                    break
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass  # a client that went away or spoke nonsense: just close
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, writer: asyncio.StreamWriter, *, keep_alive: bool) -> None:
        self.stats.requests += 1
        await asyncio.sleep(self.profile.delay_ms(self._rng) / 1000)
        if self.profile.fails(self._rng):
            self.stats.errors += 1
            status, ctype, body = "500 Internal Server Error", "text/plain", b"upstream error\n"
        else:
            status, ctype = "200 OK", "application/json"
            body = json.dumps({"version": self.name}).encode()
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"X-Upstream: {self.name}\r\n"
            + ("" if keep_alive else "Connection: close\r\n")
            + "\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> bool | None:
    """Read one request (head and body); None at a clean end, else whether to keep alive."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise
    lines = head.decode("latin-1").split("\r\n")
    version = lines[0].rsplit(" ", 1)[-1]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        await _skip_chunked(reader)
    elif length := int(headers.get("content-length", "0") or 0):
        await reader.readexactly(length)
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


async def _skip_chunked(reader: asyncio.StreamReader) -> None:
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            # trailers, up to the empty line
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return
        await reader.readexactly(size + 2)
