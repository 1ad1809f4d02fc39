"""`canary bench sidecar`: what the proxy costs over going direct, next to nginx.

One run, one upstream (nginx returning a fixed 200), one load generator, the paths:

- direct: the load generator talks to the upstream;
- sidecar: through the sidecar's proxy alone (one process, uvloop), with a fixed
  choice and a recorder that batches samples as the reporter does;
- sidecar_command: through `canary sidecar` itself (route from etcd, sticky
  assignment, sample reporter on `memory://`), when etcd and the command are there;
- nginx: through nginx `proxy_pass` with upstream keepalive, one worker;
- sidecar_before: with `CANARY_BENCH_BEFORE=<git revision>`, the proxy of that
  revision run as `sidecar` is, for a before/after in the same run
  (`cpu_vs_before`: its CPU per request over this code's, median of the rounds).

And every core (`workers`): max requests/s through `canary sidecar --workers N` and
nginx `worker_processes N`, N = 1 and 2, with nothing pinned (the proxies, the
upstream and a two-thread wrk share every CPU), as ratios to nginx and as scaling
(N = 2 over N = 1); CPU time per request sums the proxy's processes.

For each: the maximum requests/s (wrk, 50 connections) and P50/P99 latency at a fixed
1,000 requests/s, open loop. CPU time per request (user + system, from /proc, over the
requests wrk counted) is reported beside requests/s, and its ratio to nginx's
(`cpu_vs_nginx`, the median over rounds): requests/s move with whatever else loads the
machine, CPU per request much less. wrk2 is not at hand, so the open-loop generator is here:
requests leave on a fixed schedule over keep-alive sockets, and latency runs from the
*scheduled* send time, so a stall is charged to every request it delayed (no
coordinated omission). With two CPUs the server under test gets one, the load
generator the other; the upstream sits with the load, except for `direct`, where it
is the server under test. Full runs alternate the paths over three rounds.

Then the route reload time through `canary sidecar`: an etcd write flipping the canary
weight 0 <-> 10000, to the first response carrying the new variant. Last, gRPC unary
calls through the proxy (`sidecar_grpc`, under the `grpc` key).

Run a proxy alone: `python -m controlplane.benchmarks.sidecar serve-proxy HOST:PORT URL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import select
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httptools
import numpy as np

from controlplane.benchmarks.children import stop_child
from controlplane.kernel.codec import BatchBuilder
from controlplane.kernel.signals import on_stop_signals

RATE = 1_000  # requests/s for the latency runs
WRK_CONNECTIONS = 50
OPEN_LOOP_CONNECTIONS = 16  # more are opened if all are busy when a request is due
TARGET_ADDED_P99_MS = 1.0
TARGET_RPS_VS_NGINX = 0.7
RELOAD_CHANGES = 60
HOST = "127.0.0.1"  # this benchmark only ever talks to the local host


@dataclass(frozen=True)
class Durations:
    rounds: int
    max_rps_s: float
    latency_s: float
    warmup_s: float
    reload_changes: int


QUICK = Durations(rounds=1, max_rps_s=1.0, latency_s=1.5, warmup_s=0.3, reload_changes=20)
FULL = Durations(
    rounds=3, max_rps_s=3.0, latency_s=5.0, warmup_s=0.5, reload_changes=RELOAD_CHANGES
)


def cpu_vs_reference(
    ours: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]], name: str = "nginx"
) -> dict[str, Any]:
    """The reference's CPU time per request over ours: the requests/s ratio the two
    reach when each has a CPU to itself, whatever else loads the machine. Rounds run
    in turn, so round i of each met the same load: the per-round ratios, their median
    (the figure), and the ratio of the best rounds."""
    pairs = [
        (r["cpu_us_per_request"], o["cpu_us_per_request"])
        for o, r in zip(ours, reference, strict=False)
        if o.get("cpu_us_per_request") and r.get("cpu_us_per_request")
    ]
    key = f"cpu_vs_{name}"
    if not pairs:
        return {key: None, f"{key}_rounds": [], f"{key}_best": None}
    rounds = [round(ref / own, 3) for ref, own in pairs]
    best = min(ref for ref, _ in pairs) / min(own for _, own in pairs)
    return {
        key: round(float(np.median(rounds)), 3),
        f"{key}_rounds": rounds,
        f"{key}_best": round(best, 3),
    }


def requests_served(peak: dict[str, Any], seconds: float) -> int:
    """Requests of a max-throughput run: counted by wrk, else from its rate."""
    counted = peak.get("wrk_requests")
    if counted:
        return int(counted)
    return int(peak["max_rps"] * max(1, round(seconds)))


def _combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Best throughput, median latency over the rounds; each round kept as measured."""
    combined: dict[str, Any] = {
        "max_rps": max(r["max_rps"] for r in rounds),
        "p50_ms": round(float(np.median([r["p50_ms"] for r in rounds])), 3),
        "p99_ms": round(float(np.median([r["p99_ms"] for r in rounds])), 3),
        "cpu_us_per_request": min(
            (r["cpu_us_per_request"] for r in rounds if r["cpu_us_per_request"]), default=None
        ),
        "errors": sum(r["errors"] for r in rounds),
    }
    if len(rounds) > 1:
        combined["rounds"] = rounds
    return combined


# --- processes ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {HOST}:{port} after {timeout} s")


def _wait_ready(admin_port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the admin endpoint answers /readyz with 200 (every worker listening)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before ready")
        conn = http.client.HTTPConnection(HOST, admin_port, timeout=2)
        try:
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.05)
    raise TimeoutError(f"not ready after {timeout} s")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (nginx's worker), in seconds."""
    user, system = _cpu_split(pid)
    return user + system


def _cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its children."""
    user = system = 0.0
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    tick = os.sysconf("SC_CLK_TCK")
    for each in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11]) / tick
            system += int(fields[12]) / tick
    return user, system


# a server under test gets one CPU: no idle BLAS worker threads beside it
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PRIORITY = -10  # nice value for every process of the run, when permitted


def _raise_priority(pid: int = 0) -> bool:
    """Put this process (or `pid`) ahead of unrelated work on a shared machine; every
    path of the run gets the same treatment, so the comparison stays fair."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, PRIORITY)
    except (OSError, AttributeError):
        return False
    return True


def _pin(cpu: int | None) -> Callable[[], None]:
    def setup() -> None:
        _raise_priority()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return setup


def _repin(pid: int, cpu: int | None) -> None:
    """Move a process and its children (nginx's worker) to one CPU."""
    if cpu is None:
        return
    pids = [pid]
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(child) for child in children]
    for each in pids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(each, {cpu})


@contextlib.contextmanager
def _process(
    args: list[str], *, cpu: int | None, port: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        # placed from here rather than in a preexec_fn, which forks this process: a
        # caller whose etcd client runs gRPC threads can break gRPC's poller in the
        # fork before the exec
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**(os.environ if env is None else env), **_ONE_THREAD},
        )
    _raise_priority(proc.pid)
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    try:
        try:
            _wait_port(port, proc)
        except (RuntimeError, TimeoutError) as exc:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{args[0]} did not start: {exc}\n{tail}") from exc
        yield proc
    finally:
        stop_child(proc)


_NGINX_COMMON = """
worker_processes {workers};
daemon off;
master_process on;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}-error.log warn;
events {{ worker_connections 4096; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/{name}-body;
    proxy_temp_path {tmp}/{name}-proxy;
    fastcgi_temp_path {tmp}/{name}-fastcgi;
    uwsgi_temp_path {tmp}/{name}-uwsgi;
    scgi_temp_path {tmp}/{name}-scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    default_type text/plain;
    {body}
}}
"""

_NGINX_UPSTREAM = """
    server {{
        listen {host}:{port} backlog=4096;
        location / {{ return 200 "ok\\n"; }}
    }}
"""

# keepalive 128: every one of wrk's 50 connections keeps its upstream connection, as
# the sidecar's pool does (MEASURED: 32 instead costs nginx about a third)
_NGINX_PROXY = """
    upstream app {{
        server {host}:{upstream_port};
        keepalive 128;
    }}
    server {{
        listen {host}:{port} backlog=4096;
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""


def _nginx_conf(tmp: Path, name: str, body: str, *, workers: int = 1) -> Path:
    conf = tmp / f"{name}.conf"
    conf.write_text(_NGINX_COMMON.format(tmp=tmp, name=name, body=body, workers=workers))
    return conf


def _nginx_args(nginx: str, tmp: Path, conf: Path) -> list[str]:
    return [nginx, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "nginx-stderr.log")]


# --- the fallbacks and the proxy, as subprocesses ----------------------------

_FIXED_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"


async def _serve_fixed(port: int) -> None:
    """The upstream when nginx is absent: a fixed 200 for every request."""

    class Fixed(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # uvloop's transports do not derive from asyncio.Transport
            self.transport = cast(asyncio.Transport, transport)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            assert self.transport is not None
            self.transport.write(_FIXED_RESPONSE)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Fixed, HOST, port, backlog=4096)
    await _until_sigterm()
    server.close()


async def _until_sigterm() -> None:
    stop = asyncio.Event()
    with on_stop_signals(stop.set):
        await stop.wait()


async def _serve_proxy(listen: str, upstream_url: str, tracing: Any = None) -> None:
    """`tracing`: a `sidecar.proxy.tracing.RequestTracing`, or None (off)."""
    from sidecar.choice import Choice, Sample, SampleColumns, Upstream
    from sidecar.proxy import ProxyServer

    choice = Choice(
        experiment="bench", variant="baseline", upstream=Upstream.parse(upstream_url), unit_hash=0
    )

    class FixedChooser:
        def choose(self, headers: Any) -> Choice:
            return choice

    class BatchingRecorder:
        """Costs what the sample reporter costs on the proxy's side: columns into a
        batch, encoded every 512 samples."""

        def __init__(self) -> None:
            self.batch = BatchBuilder()

        def record(
            self,
            ts: float,
            experiment: str | None,
            variant: str,
            rt_us: int,
            outcome: int,
            unit_hash: int,
            first_byte_us: int | None = None,
        ) -> None:
            first = rt_us if first_byte_us is None else first_byte_us
            self.record_many([(ts, experiment, variant, rt_us, outcome, unit_hash, first)])

        def record_many(self, samples: Sequence[Sample]) -> None:
            self.record_columns(SampleColumns.of(samples))

        def record_columns(self, columns: SampleColumns) -> None:
            self.batch.add_columns(
                columns.ts, columns.variants, columns.rt_us, columns.outcomes,
                columns.units, columns.first_byte_us,
            )  # fmt: skip
            if len(self.batch) >= 512:
                self.batch.encode()
                self.batch = BatchBuilder()

    host, _, port = listen.rpartition(":")
    proxy = ProxyServer(FixedChooser(), BatchingRecorder(), tracing=tracing)
    await proxy.start(host, int(port))
    await _until_sigterm()
    await proxy.stop(timeout=2)
    if tracing is not None:
        await asyncio.to_thread(tracing.close)


def _run_async(main: Any) -> None:
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:
        asyncio.run(main)


# --- load --------------------------------------------------------------------

_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: canary-bench\r\n\r\n"


class _Connection:
    __slots__ = ("complete", "parser", "scheduled", "sock", "status")

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.parser = httptools.HttpResponseParser(self)
        self.complete = False
        self.scheduled = 0.0
        self.status = 0

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_message_complete(self) -> None:
        self.complete = True


def open_loop(port: int, *, rate: float, duration: float, warmup: float) -> dict[str, Any]:
    """Fixed-schedule load; latency from each request's scheduled send time."""
    conns = [_Connection(port) for _ in range(OPEN_LOOP_CONNECTIONS)]
    free = list(conns)
    busy: dict[socket.socket, _Connection] = {}
    poller = selectors.DefaultSelector()
    interval = 1.0 / rate
    start = time.perf_counter() + 0.01
    measure_from = start + warmup
    end = measure_from + duration
    next_send = start
    due: deque[float] = deque()
    latencies: list[float] = []
    errors = 0
    perf = time.perf_counter
    try:
        while True:
            now = perf()
            while next_send <= now and next_send < end:
                due.append(next_send)
                next_send += interval
            while due:
                if not free:
                    extra = _Connection(port)
                    conns.append(extra)
                    free.append(extra)
                conn = free.pop()
                conn.scheduled = due.popleft()
                conn.sock.send(_REQUEST)
                busy[conn.sock] = conn
                poller.register(conn.sock, selectors.EVENT_READ)
            if next_send >= end and not busy:
                break
            timeout = max(0.0, next_send - perf()) if next_send < end else 1.0
            # epoll, not select(): on a loaded machine the open loop may need more
            # connections than select() can watch
            readable = [cast(socket.socket, key.fileobj) for key, _ in poller.select(timeout)]
            received = perf()
            for sock in readable:
                conn = busy[sock]
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed a keep-alive connection")
                conn.parser.feed_data(data)
                if conn.complete:
                    conn.complete = False
                    del busy[sock]
                    poller.unregister(sock)
                    free.append(conn)
                    if conn.status != 200:
                        errors += 1
                    if conn.scheduled >= measure_from:
                        latencies.append(received - conn.scheduled)
    finally:
        poller.close()
        for conn in conns:
            conn.sock.close()
    ms = np.asarray(latencies) * 1e3
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "max_ms": round(float(ms.max()), 3),
        "requests": len(latencies),
        "errors": errors,
        "connections": len(conns),
    }


def closed_loop(port: int, *, connections: int, duration: float) -> dict[str, Any]:
    """The max-throughput load when wrk is absent: each connection sends its next
    request as soon as the previous answer is in."""
    conns = {c.sock: c for c in (_Connection(port) for _ in range(connections))}
    done = errors = 0
    end = time.perf_counter() + duration
    try:
        for conn in conns.values():
            conn.sock.send(_REQUEST)
        started = time.perf_counter()
        while time.perf_counter() < end:
            readable, _, _ = select.select(list(conns), [], [], 0.5)
            for sock in readable:
                conn = conns[sock]
                conn.parser.feed_data(sock.recv(65536))
                if conn.complete:
                    conn.complete = False
                    done += 1
                    errors += conn.status != 200
                    sock.send(_REQUEST)
        elapsed = time.perf_counter() - started
    finally:
        for conn in conns.values():
            conn.sock.close()
    return {"max_rps": round(done / elapsed), "errors": errors}


def _wrk(
    wrk: str, port: int, *, duration: float, cpu: int | None, threads: int = 1
) -> dict[str, Any]:
    out = subprocess.run(
        [
            wrk,
            f"-t{threads}",
            f"-c{WRK_CONNECTIONS}",
            f"-d{max(1, round(duration))}s",
            f"http://{HOST}:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=_pin(cpu),
    ).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    result: dict[str, Any] = {"max_rps": round(float(match.group(1)))}
    served = re.search(r"(\d+) requests in", out)
    if served:
        result["wrk_requests"] = int(served.group(1))
    result["errors"] = int(errors.group(1)) if errors else 0
    if socket_errors:
        result["socket_errors"] = socket_errors.group(1).strip()
    return result


# --- the run -----------------------------------------------------------------


def _cpus() -> tuple[int | None, int | None]:
    """(server CPU, load CPU): two different ones when there are two."""
    try:
        available = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None, None
    if len(available) < 2:
        return None, None
    return available[0], available[1]


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def run(*, quick: bool, progress: bool, only: str | None = None) -> dict[str, Any]:
    """The HTTP/1.1 figures, then the streaming sections (`sidecar_streams`); `only`
    runs just the streaming sections it names (websocket, sse, large_bodies)."""
    from controlplane.benchmarks import sidecar_streams

    if only is not None:
        sections = sidecar_streams.parse_only(only)
        streams: dict[str, Any] = {"benchmark": "sidecar", "quick": quick, "only": sections}
        with contextlib.suppress(OSError):
            streams["loadavg_at_start"] = round(os.getloadavg()[0], 2)
        streams.update(sidecar_streams.run(quick=quick, progress=progress, sections=sections))
        return streams
    result = _run_http(quick=quick, progress=progress)
    result.update(sidecar_streams.run(quick=quick, progress=progress))
    return result


def _run_http(*, quick: bool, progress: bool) -> dict[str, Any]:
    from sidecar.proxy.limits import raise_fd_limit

    durations = QUICK if quick else FULL
    raise_fd_limit()  # the open loop opens connections as a stalled server needs them
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    wrk = shutil.which("wrk")
    server_cpu, load_cpu = _cpus()
    notes: list[str] = []
    result: dict[str, Any] = {
        "benchmark": "sidecar",
        "quick": quick,
        "rate_rps": RATE,
        "cpus": {"server": server_cpu, "load": load_cpu},
        "load_generator": {
            "max_rps": f"wrk -t1 -c{WRK_CONNECTIONS}" if wrk else "python closed loop, 50 conns",
            "latency": "python open loop (fixed schedule, keep-alive, latency from the "
            "scheduled send time)",
        },
        "upstream": "nginx return 200, 1 worker" if nginx else "python asyncio fixed 200",
        "rounds": durations.rounds,
        "combined_as": "max_rps: best round; p50/p99: median of rounds",
        "notes": notes,
    }
    if server_cpu is None:
        notes.append("fewer than two CPUs: nothing pinned")
    from sidecar import compiled

    # the proxies run from this tree decide the same way (sidecar/compiled.py); a
    # revision unpacked for CANARY_BENCH_BEFORE is never compiled
    result["proxy_build"] = compiled.select()[1]
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = round(os.getloadavg()[0], 2)
    if nginx is None:
        notes.append("nginx not installed: no nginx reference, rps_vs_nginx null")
    own_affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    own_priority = os.getpriority(os.PRIO_PROCESS, 0)
    result["nice"] = PRIORITY if _raise_priority() else own_priority
    python = sys.executable
    module = "controlplane.benchmarks.sidecar"

    def measure(name: str, port: int, pid: int) -> dict[str, Any]:
        _say(progress, f"[{name}] max requests/s ...")
        user_before, system_before = _cpu_split(pid)
        if wrk:
            peak = _wrk(wrk, port, duration=durations.max_rps_s, cpu=load_cpu)
        else:
            peak = closed_loop(port, connections=WRK_CONNECTIONS, duration=durations.max_rps_s)
        user_after, system_after = _cpu_split(pid)
        user, system = user_after - user_before, system_after - system_before
        served = requests_served(peak, durations.max_rps_s)
        # CPU time per request holds up better than requests/s on a shared machine;
        # user time is where the proxy's own work shows, system time the kernel's
        peak["cpu_us_per_request"] = round((user + system) / served * 1e6, 1) if served else None
        peak["user_us_per_request"] = round(user / served * 1e6, 1) if served else None
        _say(progress, f"[{name}] latency at {RATE} req/s ...")
        latency = open_loop(
            port, rate=RATE, duration=durations.latency_s, warmup=durations.warmup_s
        )
        figures = {**peak, **latency}
        _say(progress, f"[{name}] {json.dumps(figures)}")
        return figures

    with tempfile.TemporaryDirectory(prefix="canary-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if load_cpu is not None:
            os.sched_setaffinity(0, {load_cpu})  # the open-loop generator runs in here
        try:
            with contextlib.ExitStack() as stack:
                up_port, proxy_port, nginx_port = _free_port(), _free_port(), _free_port()
                if nginx:
                    conf = _nginx_conf(
                        tmp, "upstream", _NGINX_UPSTREAM.format(host=HOST, port=up_port)
                    )
                    up_args = _nginx_args(nginx, tmp, conf)
                else:
                    up_args = [python, "-m", module, "serve-fixed", str(up_port)]
                upstream = stack.enter_context(
                    _process(up_args, cpu=load_cpu, port=up_port, log=tmp / "upstream.log")
                )
                proxy = stack.enter_context(
                    _process(
                        [python, "-m", module, "serve-proxy", f"{HOST}:{proxy_port}",
                         f"http://{HOST}:{up_port}"],
                        cpu=server_cpu,
                        port=proxy_port,
                        log=tmp / "sidecar.log",
                    )
                )  # fmt: skip
                paths: list[tuple[str, int, int]] = [
                    ("direct", up_port, upstream.pid),
                    ("sidecar", proxy_port, proxy.pid),
                ]
                before = _start_before(stack, tmp, up_port, server_cpu)
                if isinstance(before, tuple):
                    before_port, before_pid, result["before_commit"] = before
                    paths.append(("sidecar_before", before_port, before_pid))
                elif before is not None:
                    notes.append(f"no sidecar_before: {before}")
                if nginx:
                    conf = _nginx_conf(
                        tmp,
                        "proxy",
                        _NGINX_PROXY.format(host=HOST, port=nginx_port, upstream_port=up_port),
                    )
                    proxy_nginx = stack.enter_context(
                        _process(
                            _nginx_args(nginx, tmp, conf),
                            cpu=server_cpu,
                            port=nginx_port,
                            log=tmp / "nginx-proxy.log",
                        )
                    )
                    _repin(proxy_nginx.pid, server_cpu)
                    paths.append(("nginx", nginx_port, proxy_nginx.pid))
                else:
                    result["nginx"] = None
                try:
                    command = _start_command(stack, tmp, up_port, server_cpu)
                except Exception as exc:  # the command is another part's: report, go on
                    command = f"`canary sidecar` failed: {type(exc).__name__}: {exc}"
                if isinstance(command, _Command):
                    # the whole sidecar: routing table, assignment, sample reporter
                    paths.append(("sidecar_command", command.port, command.pid))
                else:
                    notes.append(f"no sidecar_command figures or reload time: {command}")
                    result["sidecar_command"] = None
                    result["reload_p99_ms"] = None

                # Rounds alternate the paths, so that a burst of load from elsewhere on
                # a shared machine hits one round of each rather than one path.
                rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in paths}
                for index in range(durations.rounds):
                    for name, port, pid in paths:
                        # direct: the upstream is the server under test, on its CPU;
                        # otherwise the proxy has that CPU and the upstream joins the load
                        _repin(upstream.pid, server_cpu if name == "direct" else load_cpu)
                        rounds[name].append(measure(f"{name} {index + 1}", port, pid))
                for name, figures in rounds.items():
                    result[name] = _combine(figures)

                if nginx and wrk and isinstance(command, _Command):
                    try:
                        result["workers"] = _workers_run(
                            stack, tmp, nginx, wrk, up_port, upstream.pid, durations,
                            progress, every_cpu=own_affinity,
                        )  # fmt: skip
                    except Exception as exc:
                        result["workers"] = None
                        notes.append(f"workers run failed: {type(exc).__name__}: {exc}")
                else:
                    result["workers"] = None
                    notes.append("no workers run: it needs nginx, wrk and `canary sidecar`")

                if isinstance(command, _Command):
                    _say(progress, "[reload] etcd write to the first request on new weights ...")
                    _repin(upstream.pid, load_cpu)
                    try:
                        result.update(_reload(command, durations.reload_changes, progress))
                    except Exception as exc:
                        result["reload_p99_ms"] = None
                        notes.append(f"reload run failed: {type(exc).__name__}: {exc}")
        finally:
            if own_affinity is not None:
                os.sched_setaffinity(0, own_affinity)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, own_priority)

    direct, sidecar, ref = result["direct"], result["sidecar"], result["nginx"]
    result["added_p50_ms"] = round(sidecar["p50_ms"] - direct["p50_ms"], 3)
    result["added_p99_ms"] = round(sidecar["p99_ms"] - direct["p99_ms"], 3)
    result["rps_vs_nginx"] = round(sidecar["max_rps"] / ref["max_rps"], 3) if ref else None
    full = result.get("sidecar_command")
    if full:
        result["command_added_p50_ms"] = round(full["p50_ms"] - direct["p50_ms"], 3)
        result["command_added_p99_ms"] = round(full["p99_ms"] - direct["p99_ms"], 3)
        result["command_rps_vs_nginx"] = round(full["max_rps"] / ref["max_rps"], 3) if ref else None
    earlier = result.get("sidecar_before")
    if earlier:
        # above 1: this code spends less CPU per request than the revision before
        now_rounds = sidecar.get("rounds", [sidecar])
        before_rounds = earlier.get("rounds", [earlier])
        result.update(cpu_vs_reference(now_rounds, before_rounds, name="before"))
    if ref:
        # the ratio that holds on a loaded machine (requests/s swing with the load)
        result.update(cpu_vs_reference(sidecar.get("rounds", [sidecar]), ref.get("rounds", [ref])))
        if full:
            ratios = cpu_vs_reference(full.get("rounds", [full]), ref.get("rounds", [ref]))
            result.update({f"command_{key}": value for key, value in ratios.items()})
        result["nginx_added_p50_ms"] = round(ref["p50_ms"] - direct["p50_ms"], 3)
        result["nginx_added_p99_ms"] = round(ref["p99_ms"] - direct["p99_ms"], 3)
    result["targets"] = {
        "added_p99_ms_max": TARGET_ADDED_P99_MS,
        "added_p99_ok": result["added_p99_ms"] <= TARGET_ADDED_P99_MS,
        "rps_vs_nginx_min": TARGET_RPS_VS_NGINX,
        "rps_vs_nginx_ok": None
        if result["rps_vs_nginx"] is None
        else result["rps_vs_nginx"] >= TARGET_RPS_VS_NGINX,
        "cpu_vs_nginx_ok": None
        if result.get("cpu_vs_nginx") is None
        else result["cpu_vs_nginx"] >= TARGET_RPS_VS_NGINX,
    }
    # gRPC unary through the proxy (HTTP/2 both sides); alone: `canary bench sidecar-grpc`
    from controlplane.benchmarks import sidecar_grpc

    result["grpc"] = sidecar_grpc.run(quick=quick, progress=progress)
    return result


def _start_before(
    stack: contextlib.ExitStack, tmp: Path, up_port: int, cpu: int | None
) -> tuple[int, int, str] | str | None:
    """The proxy of the revision `CANARY_BENCH_BEFORE` names, run as `sidecar` is:
    (port, pid, commit); None when no revision is asked for, else why it cannot run."""
    rev = os.environ.get("CANARY_BENCH_BEFORE")
    if not rev:
        return None
    from controlplane.benchmarks.revision import unpack_revision

    unpacked = unpack_revision(tmp, rev)
    if isinstance(unpacked, str):
        return unpacked
    tree, commit = unpacked
    port = _free_port()
    # -P: without it `-m` puts the working directory (this checkout, when run from
    # it) ahead of PYTHONPATH, and the "before" proxy would be this tree's
    args = [sys.executable, "-P", "-m", "controlplane.benchmarks.sidecar", "serve-proxy",
            f"{HOST}:{port}", f"http://{HOST}:{up_port}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = stack.enter_context(
        _process(args, cpu=cpu, port=port, log=tmp / "sidecar-before.log", env=env)
    )
    return port, proc.pid, commit


# --- every core: --workers 2 against nginx worker_processes 2 -----------------

WORKER_COUNTS = (1, 2)


def _workers_run(
    stack: contextlib.ExitStack,
    tmp: Path,
    nginx: str,
    wrk: str,
    up_port: int,
    upstream_pid: int,
    durations: Durations,
    progress: bool,
    *,
    every_cpu: set[int] | None,
) -> dict[str, Any]:
    """Max requests/s through `canary sidecar --workers N` and nginx `worker_processes
    N`, N = 1 and 2, nothing pinned: proxies, upstream and wrk share every CPU (this
    process's affinity before the run pinned it, which the processes started here
    inherit)."""
    pinned = os.sched_getaffinity(0) if every_cpu is not None else None
    if every_cpu is not None:
        os.sched_setaffinity(0, every_cpu)
    try:
        return _workers_paths(
            stack, tmp, nginx, wrk, up_port, upstream_pid, durations, progress, every_cpu
        )
    finally:
        if pinned is not None:
            os.sched_setaffinity(0, pinned)


def _workers_paths(
    stack: contextlib.ExitStack,
    tmp: Path,
    nginx: str,
    wrk: str,
    up_port: int,
    upstream_pid: int,
    durations: Durations,
    progress: bool,
    every_cpu: set[int] | None,
) -> dict[str, Any]:
    paths: list[tuple[str, int, int]] = []
    for workers in WORKER_COUNTS:
        command = _start_command(stack, tmp, up_port, None, workers=workers)
        if not isinstance(command, _Command):
            raise RuntimeError(command)
        paths.append((f"sidecar_{workers}", command.port, command.pid))
        port = _free_port()
        conf = _nginx_conf(
            tmp,
            f"proxy-{workers}",
            _NGINX_PROXY.format(host=HOST, port=port, upstream_port=up_port),
            workers=workers,
        )
        proc = stack.enter_context(
            _process(
                _nginx_args(nginx, tmp, conf),
                cpu=None,
                port=port,
                log=tmp / f"nginx-proxy-{workers}.log",
            )
        )
        paths.append((f"nginx_{workers}", port, proc.pid))
    if every_cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(upstream_pid, every_cpu)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in paths}
    for index in range(durations.rounds):
        for name, port, pid in paths:
            _say(progress, f"[{name} {index + 1}] max requests/s, nothing pinned ...")
            before = _cpu_seconds(pid)
            peak = _wrk(wrk, port, duration=durations.max_rps_s, cpu=None, threads=2)
            served = requests_served(peak, durations.max_rps_s)
            used = _cpu_seconds(pid) - before
            peak["cpu_us_per_request"] = round(used / served * 1e6, 1) if served else None
            _say(progress, f"[{name} {index + 1}] {json.dumps(peak)}")
            rounds[name].append(peak)
    result: dict[str, Any] = {
        "setup": "nothing pinned: the proxy's processes, the upstream (nginx, 1 worker) and "
        f"wrk -t2 -c{WRK_CONNECTIONS} share all {len(every_cpu or ()) or '?'} CPUs; "
        "cpu_us_per_request sums the proxy's processes",
        "combined_as": "best round of max_rps; lowest cpu_us_per_request",
    }
    for name, figures in rounds.items():
        result[name] = {
            "max_rps": max(r["max_rps"] for r in figures),
            "cpu_us_per_request": min(
                (r["cpu_us_per_request"] for r in figures if r["cpu_us_per_request"]),
                default=None,
            ),
            "errors": sum(r["errors"] for r in figures),
            "rounds": figures,
        }
    for workers in WORKER_COUNTS:
        ours, ref = result[f"sidecar_{workers}"], result[f"nginx_{workers}"]
        result[f"rps_vs_nginx_{workers}"] = round(ours["max_rps"] / ref["max_rps"], 3)
        ratios = cpu_vs_reference(ours["rounds"], ref["rounds"])
        result.update({f"{key}_{workers}": value for key, value in ratios.items()})
    for kind in ("sidecar", "nginx"):
        result[f"scaling_{kind}"] = round(
            result[f"{kind}_2"]["max_rps"] / result[f"{kind}_1"]["max_rps"], 3
        )
    return result


# --- route reload through `canary sidecar` -----------------------------------


@dataclass(frozen=True)
class _Command:
    """A running `canary sidecar` with its route in etcd."""

    pid: int
    port: int
    etcd: str
    key: str
    upstream: str


SERVICE = "bench-svc"
STEADY_CANARY_BP = 500  # the split while throughput and latency are measured


def _start_command(
    stack: contextlib.ExitStack,
    tmp: Path,
    up_port: int,
    cpu: int | None,
    *,
    workers: int = 1,
) -> _Command | str:
    """`canary sidecar --workers N` routed by etcd, or a note saying why it could not
    run. Its readiness (every worker listening) is awaited."""
    etcd = os.environ.get("CANARY_BENCH_ETCD", f"{HOST}:2379")
    etcd_host, _, etcd_port = etcd.rpartition(":")
    try:
        with socket.create_connection((etcd_host, int(etcd_port)), timeout=1):
            pass
    except OSError:
        return f"no etcd at {etcd}"
    canary = shutil.which("canary") or str(Path(sys.executable).with_name("canary"))
    if not Path(canary).exists():
        return "the canary command is not installed"
    probe = subprocess.run([canary, "sidecar", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "`canary sidecar` is not available"
    from controlplane.kernel.keys import EtcdKeys

    prefix = f"/bench-{uuid.uuid4().hex[:10]}"
    listen, admin = _free_port(), _free_port()
    upstream = f"http://{HOST}:{up_port}"
    args = [
        canary, "sidecar", "--service", SERVICE, "--listen", f"{HOST}:{listen}",
        "--admin", f"{HOST}:{admin}", "--etcd", etcd, "--etcd-prefix", prefix,
        "--redis", "memory://", "--default-upstream", upstream, "--workers", str(workers),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp / f"canary-sidecar-{workers}.log"
    proc = stack.enter_context(_process(args, cpu=cpu, port=listen, log=log, env=env))
    _wait_ready(admin, proc)
    command = _Command(proc.pid, listen, etcd, EtcdKeys(prefix).route(SERVICE), upstream)
    stack.callback(lambda: asyncio.run(_delete(command)))
    asyncio.run(_route_and_wait(command, [(1, STEADY_CANARY_BP)]))
    return command


async def _delete(command: _Command) -> None:
    from controlplane.kernel.kv_etcd import EtcdKV

    kv = EtcdKV(command.etcd)
    try:
        with contextlib.suppress(Exception):
            await kv.delete(command.key)
    finally:
        await kv.close()


async def _route_and_wait(command: _Command, changes: list[tuple[int, int]]) -> list[float]:
    """Write each (revision, canary basis points) and wait until a request is routed by
    it; the seconds from each write to that request."""
    from controlplane.kernel.kv_etcd import EtcdKV
    from controlplane.kernel.routes import Route, RouteState, two_way_variants

    kv = EtcdKV(command.etcd)
    conn = _Connection(command.port)
    conn.sock.setblocking(True)
    conn.sock.settimeout(5)
    times: list[float] = []
    try:
        for revision, canary_bp in changes:
            route = Route(
                experiment="bench",
                revision=revision,
                salt="bench",
                variants=two_way_variants(command.upstream, command.upstream, canary_bp),
                state=RouteState.RUNNING,
            )
            # all-or-nothing weights show exactly when the route is in force; the
            # steady split only has to leave the no-route default behind
            wanted = {
                0: {b"baseline"},
                10_000: {b"canary"},
            }.get(canary_bp, {b"baseline", b"canary"})
            written = time.perf_counter()
            await kv.put(command.key, route.to_json().encode())
            while _variant_of(conn) not in wanted:
                if time.perf_counter() - written > 10:
                    raise TimeoutError(f"route revision {revision} not in force after 10 s")
            times.append(time.perf_counter() - written)
    finally:
        conn.sock.close()
        await kv.close()
    return times


def _reload(command: _Command, changes: int, progress: bool) -> dict[str, Any]:
    """`reload_p99_ms`: from an etcd write flipping the canary weight 0 <-> 10000 to the
    first response that carries the new variant, through `canary sidecar`."""
    # the first flip leaves the steady split, where either variant may answer: untimed
    flips = [(revision, 10_000 if revision % 2 == 0 else 0) for revision in range(2, changes + 3)]
    times = asyncio.run(_route_and_wait(command, flips))[1:]
    ms = np.asarray(times) * 1e3
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    _say(progress, f"[reload] p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    return {
        "reload_p50_ms": round(p50, 2),
        "reload_p99_ms": round(p99, 2),
        "reload_max_ms": round(float(ms.max()), 2),
        "reload_changes": len(times),
        "reload_via": "canary sidecar, etcd watch",
    }


def _variant_of(conn: _Connection) -> bytes | None:
    """One request on a blocking keep-alive socket; the X-Canary-Variant it came back with."""
    variant: list[bytes] = []

    class Head:
        def on_header(self, name: bytes, value: bytes) -> None:
            if name.lower() == b"x-canary-variant":
                variant.append(value)

        def on_message_complete(self) -> None:
            variant.append(b"")

    parser = httptools.HttpResponseParser(Head())
    conn.sock.sendall(_REQUEST)
    while not variant or variant[-1] != b"":
        data = conn.sock.recv(65536)
        if not data:
            raise ConnectionError("the sidecar closed the connection")
        parser.feed_data(data)
    return variant[0] or None


def _main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "serve-fixed":
        _run_async(_serve_fixed(int(argv[1])))
    elif len(argv) == 3 and argv[0] == "serve-proxy":
        _run_async(_serve_proxy(argv[1], argv[2]))
    else:
        sys.exit("usage: serve-fixed PORT | serve-proxy HOST:PORT UPSTREAM_URL")


if __name__ == "__main__":
    _main(sys.argv[1:])
