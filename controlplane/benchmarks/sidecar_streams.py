"""`canary bench sidecar`, streaming sections: WebSocket, SSE and large bodies.

Each section runs the sidecar's proxy alone (`sidecar serve-proxy`, one process,
uvloop, a fixed choice) in front of an upstream process of its own, and measures the
same thing direct and through the proxy in the same run, alternating:

- `websocket`: echo round trips of 64-byte messages, one at a time (P50/P99, and
  what the proxy adds), and messages/s with many in flight (a sender and a reader);
- `sse`: time to first event from the request (what the proxy adds, target <= 1 ms),
  and each event's arrival against its send time (the upstream stamps each event
  with CLOCK_MONOTONIC, shared by the processes): a proxy that buffers shows it here;
- `large_bodies`: a generated body (1 GiB, 256 MiB quick) uploaded and downloaded
  through the proxy, never stored; the proxy's resident memory sampled every 20 ms,
  peak against idle.

Run alone: `canary bench sidecar --only websocket,sse,large_bodies [--quick]`. The
upstreams: `python -m controlplane.benchmarks.sidecar_streams serve-ws|serve-http PORT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from controlplane.benchmarks.sidecar import HOST, _free_port, _process, _run_async, _say

SECTIONS = ("websocket", "sse", "large_bodies")
TARGET_SSE_FIRST_EVENT_ADDED_MS = 1.0
MESSAGE = b"m" * 64
GIB = 1024 * 1024 * 1024
PIECE = 256 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class Sizes:
    round_trips: int
    flood_messages: int
    sse_requests: int
    sse_events: int
    sse_gap_s: float
    body_bytes: int
    rounds: int


QUICK = Sizes(
    round_trips=500,
    flood_messages=20_000,
    sse_requests=20,
    sse_events=20,
    sse_gap_s=0.005,
    body_bytes=GIB // 4,
    rounds=1,
)
FULL = Sizes(
    round_trips=3_000,
    flood_messages=100_000,
    sse_requests=60,
    sse_events=50,
    sse_gap_s=0.01,
    body_bytes=GIB,
    rounds=3,
)


def parse_only(only: str) -> list[str]:
    """The sections named in `--only` (comma-separated); raises ValueError on others."""
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise ValueError(f"--only takes some of {', '.join(SECTIONS)}; got {only!r}")
    return names


def run(*, quick: bool, progress: bool, sections: list[str] | None = None) -> dict[str, Any]:
    """The streaming sections' figures, one key each."""
    sizes = QUICK if quick else FULL
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="canary-bench-streams-") as tmp_name:
        tmp = Path(tmp_name)
        for name in sections or SECTIONS:
            _say(progress, f"[{name}] ...")
            section = {"websocket": _websocket, "sse": _sse, "large_bodies": _large_bodies}[name]
            try:
                result[name] = section(sizes, tmp)
            except Exception as exc:  # one section failing leaves the others' figures
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            _say(progress, f"[{name}] {result[name]}")
    return result


# --- processes -----------------------------------------------------------------


@contextlib.contextmanager
def _upstream_and_proxy(kind: str, tmp: Path) -> Iterator[tuple[int, int, int]]:
    """An upstream (`serve-ws` or `serve-http`) and the proxy in front of it:
    (upstream port, proxy port, proxy pid)."""
    python = sys.executable
    up_port, proxy_port = _free_port(), _free_port()
    with (
        _process(
            [python, "-m", __name__, kind, str(up_port)],
            cpu=None,
            port=up_port,
            log=tmp / f"{kind}.log",
        ),
        _process(
            [
                python,
                "-m",
                "controlplane.benchmarks.sidecar",
                "serve-proxy",
                f"{HOST}:{proxy_port}",
                f"http://{HOST}:{up_port}",
            ],
            cpu=None,
            port=proxy_port,
            log=tmp / f"proxy-{kind}.log",
        ) as proxy,
    ):
        yield up_port, proxy_port, proxy.pid


def _loop_run(main: Callable[[], Awaitable[T]]) -> T:
    async def wrapper() -> T:
        return await main()

    try:
        import uvloop

        return uvloop.run(wrapper())
    except ImportError:
        return asyncio.run(wrapper())


def _ms(seconds: list[float], q: float) -> float:
    ordered = sorted(seconds)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)


# --- WebSocket -----------------------------------------------------------------


async def _serve_ws(port: int) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    from controlplane.benchmarks.sidecar import _until_sigterm

    async with serve(echo, HOST, port, compression=None, max_size=None):
        await _until_sigterm()


async def _ws_figures(port: int, sizes: Sizes) -> dict[str, float]:
    from websockets.asyncio.client import connect

    url = f"ws://{HOST}:{port}/echo"
    async with connect(url, compression=None, proxy=None, ping_interval=None) as ws:
        for _ in range(50):  # warm-up
            await ws.send(MESSAGE)
            await ws.recv()
        times = []
        for _ in range(sizes.round_trips):
            start = time.perf_counter()
            await ws.send(MESSAGE)
            await ws.recv()
            times.append(time.perf_counter() - start)
    count = sizes.flood_messages
    async with connect(url, compression=None, proxy=None, ping_interval=None, max_queue=None) as ws:

        async def send_all() -> None:
            for _ in range(count):
                await ws.send(MESSAGE)

        start = time.perf_counter()
        sender = asyncio.create_task(send_all())
        for _ in range(count):
            await ws.recv()
        elapsed = time.perf_counter() - start
        await sender
    return {
        "p50_ms": _ms(times, 0.5),
        "p99_ms": _ms(times, 0.99),
        "messages_per_s": round(count / elapsed),
    }


def _websocket(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, float]]] = {"direct": [], "sidecar": []}
    with _upstream_and_proxy("serve-ws", tmp) as (up_port, proxy_port, _):
        for _ in range(sizes.rounds):
            for name, port in (("direct", up_port), ("sidecar", proxy_port)):
                figures = _loop_run(lambda port=port: _ws_figures(port, sizes))  # type: ignore[misc]
                rounds[name].append(figures)
    direct, sidecar = (_median_of(rounds[name]) for name in ("direct", "sidecar"))
    return {
        "message_bytes": len(MESSAGE),
        "round_trips": sizes.round_trips,
        "direct": direct,
        "sidecar": sidecar,
        "added_p50_ms": round(sidecar["p50_ms"] - direct["p50_ms"], 3),
        "added_p99_ms": round(sidecar["p99_ms"] - direct["p99_ms"], 3),
        "messages_per_s_vs_direct": round(sidecar["messages_per_s"] / direct["messages_per_s"], 3),
    }


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


# --- an HTTP upstream for SSE and bodies ------------------------------------------


def _now_ns() -> int:
    # CLOCK_MONOTONIC is one clock for every process on the host: send and arrival
    # times taken in two processes compare
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


async def _serve_http(port: int) -> None:
    """GET /sse/<events>/<gap_us>: text/event-stream, chunked, each event's data its
    send time in ns; GET /download/<bytes>: a generated body with its length;
    POST /upload: reads the body (Content-Length) and answers its length."""
    from controlplane.benchmarks.sidecar import _until_sigterm

    piece = b"d" * PIECE

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                _, target, _ = line.split(" ", 2)
                parts = target.strip("/").split("/")
                if parts[0] == "sse":
                    events, gap = int(parts[1]), int(parts[2]) / 1e6
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
                    )
                    for index in range(events):
                        if index:
                            await asyncio.sleep(gap)
                        event = b"data: %d\n\n" % _now_ns()
                        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                elif parts[0] == "download":
                    size = int(parts[1])
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                    sent = 0
                    while sent < size:
                        chunk = piece[: min(PIECE, size - sent)]
                        writer.write(chunk)
                        sent += len(chunk)
                        await writer.drain()
                else:
                    length = next(
                        int(f.split(":", 1)[1])
                        for f in fields
                        if f.lower().startswith("content-length:")
                    )
                    left = length
                    while left:
                        data = await reader.read(min(left, 1 << 20))
                        if not data:
                            return
                        left -= len(data)
                    body = b"%d" % length
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, HOST, port, limit=1 << 20)
    await _until_sigterm()
    server.close()


# --- SSE -----------------------------------------------------------------------


async def _sse_figures(port: int, sizes: Sizes) -> dict[str, Any]:
    """Time to first event, and each event's delay from its send time."""
    firsts, delays = [], []
    target = b"/sse/%d/%d" % (sizes.sse_events, int(sizes.sse_gap_s * 1e6))
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        for _ in range(sizes.sse_requests):
            start = _now_ns()
            writer.write(b"GET %s HTTP/1.1\r\nHost: bench\r\n\r\n" % target)
            await reader.readuntil(b"\r\n\r\n")
            seen = 0
            buffer = b""
            while seen < sizes.sse_events:
                data = await reader.read(65536)
                arrived = _now_ns()
                if not data:
                    raise ConnectionError("the event stream ended early")
                buffer += data
                while (end := buffer.find(b"\n\n")) >= 0:
                    at = buffer.rfind(b"data: ", 0, end)
                    sent = int(buffer[at + 6 : end])
                    buffer = buffer[end + 2 :]
                    if seen == 0:
                        firsts.append((arrived - start) / 1e9)
                    delays.append((arrived - sent) / 1e9)
                    seen += 1
            while not buffer.endswith(b"0\r\n\r\n"):
                buffer += await reader.read(65536)
    finally:
        writer.close()
    return {
        "first_event_p50_ms": _ms(firsts, 0.5),
        "first_event_p99_ms": _ms(firsts, 0.99),
        "event_delay_p50_ms": _ms(delays, 0.5),
        "event_delay_p99_ms": _ms(delays, 0.99),
        "event_delay_max_ms": _ms(delays, 1.0),
    }


def _sse(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, float]]] = {"direct": [], "sidecar": []}
    with _upstream_and_proxy("serve-http", tmp) as (up_port, proxy_port, _):
        for _ in range(sizes.rounds):
            for name, port in (("direct", up_port), ("sidecar", proxy_port)):
                figures = _loop_run(lambda port=port: _sse_figures(port, sizes))  # type: ignore[misc]
                rounds[name].append(figures)
    direct, sidecar = (_median_of(rounds[name]) for name in ("direct", "sidecar"))
    added_first = round(sidecar["first_event_p50_ms"] - direct["first_event_p50_ms"], 3)
    return {
        "requests": sizes.sse_requests,
        "events_per_request": sizes.sse_events,
        "event_gap_ms": sizes.sse_gap_s * 1e3,
        "direct": direct,
        "sidecar": sidecar,
        "first_event_added_p50_ms": added_first,
        "first_event_added_p99_ms": round(
            sidecar["first_event_p99_ms"] - direct["first_event_p99_ms"], 3
        ),
        "event_delay_added_p99_ms": round(
            sidecar["event_delay_p99_ms"] - direct["event_delay_p99_ms"], 3
        ),
        "target_first_event_added_ms": TARGET_SSE_FIRST_EVENT_ADDED_MS,
        "target_ok": added_first <= TARGET_SSE_FIRST_EVENT_ADDED_MS,
    }


# --- large bodies ----------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class _RssSampler:
    """The highest resident size of a process, sampled every 20 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = _rss_bytes(pid)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_bytes(self.pid))
            self.samples += 1

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes(self.pid))


async def _download(port: int, size: int) -> float:
    reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 20)
    start = time.perf_counter()
    writer.write(b"GET /download/%d HTTP/1.1\r\nHost: bench\r\n\r\n" % size)
    await reader.readuntil(b"\r\n\r\n")
    left = size
    while left:
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("the download ended early")
        left -= len(data)
    elapsed = time.perf_counter() - start
    writer.close()
    return elapsed


async def _upload(port: int, size: int) -> float:
    reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 20)
    piece = b"u" * PIECE
    start = time.perf_counter()
    writer.write(b"POST /upload HTTP/1.1\r\nHost: bench\r\nContent-Length: %d\r\n\r\n" % size)
    sent = 0
    while sent < size:
        chunk = piece[: min(PIECE, size - sent)]
        writer.write(chunk)
        sent += len(chunk)
        await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"upload refused: {head[:40]!r}")
    elapsed = time.perf_counter() - start
    writer.close()
    return elapsed


def _large_bodies(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    size = sizes.body_bytes
    mib = 1024 * 1024
    with _upstream_and_proxy("serve-http", tmp) as (up_port, proxy_port, pid):
        _loop_run(lambda: _download(proxy_port, mib))  # the proxy's pools and buffers warm
        idle = _rss_bytes(pid)
        figures: dict[str, Any] = {"body_bytes": size, "idle_rss_mb": round(idle / mib, 1)}
        for name, transfer in (("upload", _upload), ("download", _download)):
            direct = _loop_run(lambda transfer=transfer: transfer(up_port, size))  # type: ignore[misc]
            with _RssSampler(pid) as rss:
                elapsed = _loop_run(lambda transfer=transfer: transfer(proxy_port, size))  # type: ignore[misc]
            figures[name] = {
                "peak_rss_mb": round(rss.peak / mib, 1),
                "peak_over_idle_mb": round((rss.peak - idle) / mib, 1),
                "peak_vs_idle": round(rss.peak / idle, 3),
                "mb_per_s": round(size / mib / elapsed),
                "direct_mb_per_s": round(size / mib / direct),
                "mb_per_s_vs_direct": round(direct / elapsed, 3),
                "rss_samples": rss.samples,
            }
    return figures


def _main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "serve-ws":
        _run_async(_serve_ws(int(argv[1])))
    elif len(argv) == 2 and argv[0] == "serve-http":
        _run_async(_serve_http(int(argv[1])))
    else:
        sys.exit(
            "usage: python -m controlplane.benchmarks.sidecar_streams serve-ws|serve-http PORT"
        )


if __name__ == "__main__":
    _main(sys.argv[1:])
