"""An open-loop load generator with client timeouts, for `canary bench overload`.

Requests leave on a fixed schedule (`rate` per second) whatever the server does, each
on a keep-alive connection that is free (a new one is opened when none is, up to
`max_connections`); latency runs from the *scheduled* send time, so a stall is charged
to every request it delays. A request unanswered `timeout` seconds after it was sent is
given up, as a client would: its connection is closed. The generator reports its own
achieved rate and how late its sends left, so a saturated generator shows.

Run: `python -m controlplane.benchmarks.open_loop PORT RATE DURATION WARMUP TIMEOUT SLO
START_AT`; one JSON object on stdout. The schedule begins at `START_AT` (wall-clock
seconds, so that whoever started it knows when it measures; at once when already
past, and `started_late_s` says by how much). Requests of the first `warmup` seconds
are sent but not counted.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from collections import deque
from typing import Any, cast

import httptools
import numpy as np

HOST = "127.0.0.1"
MAX_CONNECTIONS = 4000
_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: canary-bench\r\n\r\n"


class _Connection:
    __slots__ = ("close", "complete", "number", "parser", "scheduled", "sent", "sock", "status")

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.parser = httptools.HttpResponseParser(self)
        self.complete = False
        self.scheduled = 0.0
        self.sent = 0.0
        self.status = 0
        self.number = 0  # the request it carries (to match a timeout to it)
        self.close = False  # the answer said `Connection: close`

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"connection" and b"close" in value.lower():
            self.close = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_message_complete(self) -> None:
        self.complete = True


class _Tally:
    """What the measured requests came to."""

    def __init__(self, measure_from: float, slo: float) -> None:
        self.measure_from = measure_from
        self.slo = slo
        self.ok_latencies: list[float] = []
        self.ok_at: list[float] = []  # scheduled offsets of good answers within the SLO
        self.shed_latencies: list[float] = []  # answers 429 or 503: shed by the sidecar
        self.status: dict[str, int] = {}
        self.timeouts = 0
        self.errors = 0
        self.unsent = 0
        self.sent = 0
        self.lags: list[float] = []

    def answered(self, scheduled: float, status: int, latency: float) -> None:
        if scheduled < self.measure_from:
            return
        key = str(status)
        self.status[key] = self.status.get(key, 0) + 1
        if status == 200:
            self.ok_latencies.append(latency)
            if latency <= self.slo:
                self.ok_at.append(scheduled - self.measure_from)
        elif status in (429, 503):
            self.shed_latencies.append(latency)

    def failed(self, scheduled: float, *, timeout: bool) -> None:
        if scheduled < self.measure_from:
            return
        if timeout:
            self.timeouts += 1
        else:
            self.errors += 1


def run(
    port: int,
    *,
    rate: float,
    duration: float,
    warmup: float,
    timeout: float,
    slo: float,
    start_at: float | None = None,
) -> dict[str, Any]:
    conns: list[_Connection] = [_Connection(port) for _ in range(16)]
    late = 0.0
    if start_at is not None:
        late = time.time() - start_at
        if late < 0:
            time.sleep(-late)
    free = list(conns)
    busy: dict[socket.socket, _Connection] = {}
    deadlines: deque[tuple[float, int, _Connection]] = deque()  # in send order
    poller = selectors.DefaultSelector()
    perf = time.perf_counter
    interval = 1.0 / rate
    start = perf() + 0.01
    measure_from = start + warmup
    end = measure_from + duration
    tally = _Tally(measure_from, slo)
    next_send = start
    number = 0
    opened = len(conns)

    def drop(conn: _Connection) -> None:
        if busy.pop(conn.sock, None) is not None:
            poller.unregister(conn.sock)
        conn.sock.close()

    try:
        while True:
            now = perf()
            while next_send <= now and next_send < end:
                scheduled, next_send = next_send, next_send + interval
                if not free:
                    if len(busy) >= MAX_CONNECTIONS:
                        if scheduled >= measure_from:
                            tally.unsent += 1
                        continue
                    try:
                        free.append(_Connection(port))
                        opened += 1
                    except OSError:
                        tally.failed(scheduled, timeout=False)
                        continue
                conn = free.pop()
                number += 1
                conn.number, conn.scheduled, conn.sent = number, scheduled, perf()
                try:
                    conn.sock.send(_REQUEST)
                except OSError:
                    conn.sock.close()
                    tally.failed(scheduled, timeout=False)
                    continue
                if scheduled >= measure_from:
                    tally.sent += 1
                    tally.lags.append(conn.sent - scheduled)
                busy[conn.sock] = conn
                poller.register(conn.sock, selectors.EVENT_READ)
                deadlines.append((conn.sent + timeout, number, conn))
            now = perf()
            while deadlines and deadlines[0][0] <= now:
                _, which, conn = deadlines.popleft()
                if conn.number == which and conn.sock in busy:
                    tally.failed(conn.scheduled, timeout=True)
                    drop(conn)
            if next_send >= end and not busy:
                break
            wait = next_send - now if next_send < end else 0.05
            if deadlines:
                wait = min(wait, deadlines[0][0] - now)
            events = poller.select(max(0.0, wait))
            received = perf()
            for key, _ in events:
                sock = cast(socket.socket, key.fileobj)
                answering = busy.get(sock)
                if answering is None:
                    continue
                conn = answering
                try:
                    data = sock.recv(65536)
                    if data:
                        conn.parser.feed_data(data)
                except (OSError, httptools.HttpParserError):
                    data = b""
                if conn.complete:
                    conn.complete = False
                    busy.pop(sock)
                    poller.unregister(sock)
                    tally.answered(conn.scheduled, conn.status, received - conn.scheduled)
                    if data and not conn.close:
                        free.append(conn)
                    else:
                        sock.close()
                elif not data:  # closed before a whole answer
                    tally.failed(conn.scheduled, timeout=False)
                    drop(conn)
    finally:
        poller.close()
        for conn in [*free, *busy.values()]:
            conn.sock.close()
    summary = _summary(tally, rate=rate, duration=duration, opened=opened)
    summary["started_late_s"] = round(max(0.0, late), 3)
    return summary


def _summary(tally: _Tally, *, rate: float, duration: float, opened: int) -> dict[str, Any]:
    ok = np.asarray(tally.ok_latencies) * 1e3
    shed = np.asarray(tally.shed_latencies) * 1e3
    lags = np.asarray(tally.lags) * 1e3
    per_second = np.bincount(
        np.asarray(tally.ok_at, dtype=float).astype(int), minlength=int(np.ceil(duration))
    )
    return {
        "offered_rps": rate,
        "duration_s": duration,
        "sent": tally.sent,
        "achieved_rps": round(tally.sent / duration, 1),
        "unsent": tally.unsent,
        "send_lag_p50_ms": round(float(np.percentile(lags, 50)), 3) if lags.size else None,
        "send_lag_p99_ms": round(float(np.percentile(lags, 99)), 3) if lags.size else None,
        "status": dict(sorted(tally.status.items())),
        "timeouts": tally.timeouts,
        "errors": tally.errors,
        "ok": int(ok.size),
        "ok_within_slo": len(tally.ok_at),
        "ok_p50_ms": round(float(np.percentile(ok, 50)), 3) if ok.size else None,
        "ok_p99_ms": round(float(np.percentile(ok, 99)), 3) if ok.size else None,
        "ok_p90_ms": round(float(np.percentile(ok, 90)), 3) if ok.size else None,
        "ok_p999_ms": round(float(np.percentile(ok, 99.9)), 3) if ok.size else None,
        # a shed answer's latency: what a standing queue's wait costs those it sheds
        "shed_p50_ms": round(float(np.percentile(shed, 50)), 3) if shed.size else None,
        "shed_p99_ms": round(float(np.percentile(shed, 99)), 3) if shed.size else None,
        "goodput_per_second": [int(n) for n in per_second[: int(np.ceil(duration))]],
        "connections_opened": opened,
    }


def _main(argv: list[str]) -> None:
    if len(argv) != 7:
        sys.exit("usage: python -m controlplane.benchmarks.open_loop PORT RATE DURATION WARMUP "
                 "TIMEOUT SLO START_AT")  # fmt: skip
    from sidecar.proxy.limits import raise_fd_limit

    raise_fd_limit()  # up to MAX_CONNECTIONS sockets while the server stalls
    port, (rate, duration, warmup, timeout, slo, start_at) = int(argv[0]), map(float, argv[1:])
    result = run(
        port, rate=rate, duration=duration, warmup=warmup, timeout=timeout, slo=slo,
        start_at=start_at,
    )  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    _main(sys.argv[1:])
