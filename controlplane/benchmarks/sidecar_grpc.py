"""`canary bench sidecar-grpc` (and the `grpc` key of `canary bench sidecar`): gRPC
unary calls through the sidecar's proxy against going direct, next to nginx `grpc_pass`.

One grpcio echo server (unary, raw bytes) is the upstream, marked `h2c://` for the
proxy. Paths, each measured in the same run:

- direct: the client calls the upstream;
- sidecar: through the proxy (one process, uvloop, fixed choice, batching recorder:
  `python -m controlplane.benchmarks.sidecar serve-proxy`), HTTP/2 on both sides;
- nginx: `grpc_pass` with one worker, when nginx is installed.

Per path: P50/P99 of sequential calls (one in flight; the added latency is the path's
minus direct's), and the calls/s that 64 calls in flight on one channel reach. The
client is grpcio in this process, pinned to the other CPU: its own ceiling is the
direct figure, so calls/s are reported as ratios to direct and to nginx.

Latency on a busy machine is mostly waiting for a CPU, so each proxy's own CPU time per
sequential call (user + system, its processes and their children, from /proc) is
reported beside it: the figure other work on the machine disturbs least.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from controlplane.benchmarks.sidecar import (
    HOST,
    _cpus,
    _free_port,
    _nginx_args,
    _nginx_conf,
    _process,
    _run_async,
    _say,
    _until_sigterm,
)

CONCURRENCY = 64
_METHOD = "/bench.Echo/Echo"
_MESSAGE = b"x" * 64

_NGINX_GRPC = """
    server {{
        listen {host}:{port} http2 backlog=4096;
        location / {{ grpc_pass grpc://{host}:{upstream_port}; }}
    }}
"""


def _same(data: bytes) -> bytes:
    return data


async def _serve_upstream(port: int) -> None:
    import grpc

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo, _same, _same)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    await _until_sigterm()
    await server.stop(None)


def sequential(port: int, *, calls: int, warmup: int) -> dict[str, Any]:
    """P50/P99 of unary calls made one after another."""
    import grpc

    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        call = channel.unary_unary(_METHOD, request_serializer=_same, response_deserializer=_same)
        for _ in range(warmup):
            call(_MESSAGE, timeout=10)
        times = np.empty(calls)
        for i in range(calls):
            start = time.perf_counter()
            call(_MESSAGE, timeout=10)
            times[i] = time.perf_counter() - start
    ms = times * 1000
    return {
        "calls": calls,
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` and its children (nginx's workers); None off
    Linux."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rpartition(")")[2].split()
        if int(entry) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def max_calls(port: int, *, duration: float) -> dict[str, Any]:
    """Calls/s with CONCURRENCY calls in flight on one channel (HTTP/2 streams)."""
    import grpc

    async def run() -> tuple[int, int]:
        async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
            call = channel.unary_unary(
                _METHOD, request_serializer=_same, response_deserializer=_same
            )
            await call(_MESSAGE, timeout=10)
            done = failed = 0
            deadline = time.perf_counter() + duration

            async def worker() -> None:
                nonlocal done, failed
                while time.perf_counter() < deadline:
                    try:
                        await call(_MESSAGE, timeout=10)
                        done += 1
                    except grpc.aio.AioRpcError:
                        failed += 1

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            return done, failed

    started = time.perf_counter()
    done, failed = asyncio.run(run())
    elapsed = time.perf_counter() - started
    return {"max_calls_per_s": round(done / elapsed), "failed": failed}


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    calls, warmup, duration = (500, 100, 1.5) if quick else (3000, 300, 4.0)
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    server_cpu, load_cpu = _cpus()
    notes = [
        "a shared machine: other work ran beside this one; compare paths of the same run",
    ]
    result: dict[str, Any] = {
        "benchmark": "sidecar-grpc",
        "quick": quick,
        "client": f"grpcio, sequential {calls} calls; {CONCURRENCY} in flight for "
        f"{duration:g} s on one channel",
        "upstream": "grpcio aio echo server, h2c",
        "notes": notes,
    }
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = round(os.getloadavg()[0], 2)
    if nginx is None:
        notes.append("nginx not installed: no grpc_pass reference")
    python = sys.executable
    paths: dict[str, dict[str, Any]] = {}

    def measure(name: str, port: int, server: int | None = None) -> None:
        _say(progress, f"[grpc {name}] latency and calls/s ...")
        before = None if server is None else cpu_seconds(server)
        latency = sequential(port, calls=calls, warmup=warmup)
        after = None if server is None else cpu_seconds(server)
        if before is not None and after is not None:
            # warm-up calls included: their cost is the same as the measured ones'
            latency["proxy_cpu_us_per_call"] = round((after - before) / (calls + warmup) * 1e6)
        paths[name] = {**latency, **max_calls(port, duration=duration)}
        _say(progress, f"[grpc {name}] {paths[name]}")

    own_affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with tempfile.TemporaryDirectory(prefix="canary-bench-grpc-") as tmp_name:
        tmp = Path(tmp_name)
        if load_cpu is not None:
            os.sched_setaffinity(0, {load_cpu})
        try:
            with contextlib.ExitStack() as stack:
                up_port, proxy_port, nginx_port = _free_port(), _free_port(), _free_port()
                module = "controlplane.benchmarks.sidecar_grpc"
                stack.enter_context(
                    _process(
                        [python, "-m", module, "serve-upstream", str(up_port)],
                        cpu=load_cpu, port=up_port, log=tmp / "upstream.log",
                    )
                )  # fmt: skip
                measure("direct", up_port)
                proxy = stack.enter_context(
                    _process(
                        [python, "-m", "controlplane.benchmarks.sidecar", "serve-proxy",
                         f"{HOST}:{proxy_port}", f"h2c://{HOST}:{up_port}"],
                        cpu=server_cpu, port=proxy_port, log=tmp / "proxy.log",
                    )
                )  # fmt: skip
                measure("sidecar", proxy_port, proxy.pid)
                if nginx:
                    body = _NGINX_GRPC.format(host=HOST, port=nginx_port, upstream_port=up_port)
                    conf = _nginx_conf(tmp, "grpc", body)
                    master = stack.enter_context(
                        _process(
                            _nginx_args(nginx, tmp, conf),
                            cpu=server_cpu, port=nginx_port, log=tmp / "nginx.log",
                        )
                    )  # fmt: skip
                    measure("nginx", nginx_port, master.pid)
        finally:
            if own_affinity is not None:
                os.sched_setaffinity(0, own_affinity)
    result["paths"] = paths
    direct, sidecar = paths["direct"], paths["sidecar"]
    result["sidecar_added_p50_ms"] = round(sidecar["p50_ms"] - direct["p50_ms"], 3)
    result["sidecar_added_p99_ms"] = round(sidecar["p99_ms"] - direct["p99_ms"], 3)
    result["sidecar_calls_vs_direct"] = round(
        sidecar["max_calls_per_s"] / direct["max_calls_per_s"], 3
    )
    if "nginx" in paths:
        ref = paths["nginx"]
        result["nginx_added_p50_ms"] = round(ref["p50_ms"] - direct["p50_ms"], 3)
        result["nginx_added_p99_ms"] = round(ref["p99_ms"] - direct["p99_ms"], 3)
        result["sidecar_calls_vs_nginx"] = round(
            sidecar["max_calls_per_s"] / ref["max_calls_per_s"], 3
        )
        if ref.get("proxy_cpu_us_per_call") and "proxy_cpu_us_per_call" in sidecar:
            result["sidecar_cpu_vs_nginx"] = round(
                sidecar["proxy_cpu_us_per_call"] / ref["proxy_cpu_us_per_call"], 2
            )
    return result


def _main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "serve-upstream":
        _run_async(_serve_upstream(int(argv[1])))
    else:
        sys.exit("usage: serve-upstream PORT")


if __name__ == "__main__":
    _main(sys.argv[1:])
