"""`canary bench sidecar-tracing`: what tracing costs the proxy, off and on.

One upstream (nginx returning a fixed 200, else a Python one), one load generator
(wrk for the maximum, the open loop of `canary bench sidecar` for latency at 1,000
requests/s), and the proxy of `canary bench sidecar` (fixed choice, batching
recorder) in four forms, measured in the same run, the rounds alternating them:

- before: the code before tracing existed (`git archive` of the parent of the commit
  that added `sidecar/proxy/tracing.py`, or of `CANARY_BENCH_BEFORE`);
- off: this code, tracing not configured (what every sidecar runs by default);
- on_1: tracing at ratio 1.0, every request a span exported over OTLP/HTTP (protobuf)
  to a local receiver that answers 200;
- on_0.01: tracing at ratio 0.01.

Requests carry no traceparent, so the ratio decides. The figures that hold up on a
shared machine are ratios within the run: CPU time per request and maximum
requests/s of each form over `off`, and `off` over `before`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import httptools
import numpy as np

from controlplane.benchmarks.revision import ROOT, unpack_revision
from controlplane.benchmarks.sidecar import (
    _NGINX_UPSTREAM,
    HOST,
    RATE,
    WRK_CONNECTIONS,
    _cpu_seconds,
    _cpus,
    _free_port,
    _nginx_args,
    _nginx_conf,
    _process,
    _repin,
    _run_async,
    _say,
    _serve_proxy,
    _until_sigterm,
    _wrk,
    closed_loop,
    open_loop,
)

MODULE = "controlplane.benchmarks.sidecar_tracing"
PROXY = "controlplane.benchmarks.sidecar"  # its serve-proxy: the proxy, tracing off
FORMS = ("before", "off", "on_1", "on_0.01")
RATIOS = {"on_1": 1.0, "on_0.01": 0.01}
_EMPTY_PROTOBUF = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
)


def _before_tree(tmp: Path) -> tuple[Path, str] | str:
    """The code before tracing, unpacked under `tmp`; or why it is not at hand."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return "not a git checkout"
    rev = os.environ.get("CANARY_BENCH_BEFORE")
    if not rev:
        added = subprocess.run(
            [git, "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--",
             "sidecar/proxy/tracing.py"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
        if not added:
            return "sidecar/proxy/tracing.py is not committed yet"
        rev = added[-1] + "^"
    return unpack_revision(tmp, rev)


async def _serve_otlp(port: int) -> None:
    """An OTLP/HTTP receiver that reads each export and answers 200 (an empty
    ExportTraceServiceResponse)."""

    class Receiver(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            assert self.transport is not None
            self.transport.write(_EMPTY_PROTOBUF)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Receiver, HOST, port)
    await _until_sigterm()
    server.close()


async def _serve_traced_proxy(listen: str, upstream_url: str, ratio: float, otlp: str) -> None:
    from controlplane.kernel.tracing_config import tracing_config
    from sidecar.otel_spans import otlp_sink
    from sidecar.proxy.tracing import RequestTracing

    config = tracing_config(otlp, ratio, {})
    assert config is not None
    tracing = RequestTracing(otlp_sink(config, service="bench"), ratio)
    await _serve_proxy(listen, upstream_url, tracing)


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    rounds = 3 if quick else 5
    max_rps_s, latency_s, warmup_s = (2.0, 2.0, 0.3) if quick else (5.0, 5.0, 0.5)
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    wrk = shutil.which("wrk")
    server_cpu, load_cpu = _cpus()
    python = sys.executable
    notes: list[str] = []
    result: dict[str, Any] = {
        "benchmark": "sidecar-tracing",
        "quick": quick,
        "rounds": rounds,
        "rate_rps": RATE,
        "cpus": {"server": server_cpu, "load": load_cpu},
        "upstream": "nginx return 200, 1 worker" if nginx else "python asyncio fixed 200",
        "load_generator": f"wrk -t1 -c{WRK_CONNECTIONS}" if wrk else "python closed loop",
        "combined_as": "median of rounds; rounds alternate the forms",
        "notes": notes,
    }
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = round(os.getloadavg()[0], 2)

    def measure(name: str, port: int, pid: int) -> dict[str, Any]:
        cpu_before = _cpu_seconds(pid)
        if wrk:
            peak = _wrk(wrk, port, duration=max_rps_s, cpu=load_cpu)
        else:
            peak = closed_loop(port, connections=WRK_CONNECTIONS, duration=max_rps_s)
        served = peak["max_rps"] * max(1, round(max_rps_s))
        cpu_used = _cpu_seconds(pid) - cpu_before
        peak["cpu_us_per_request"] = round(cpu_used / served * 1e6, 2) if served else None
        latency = open_loop(port, rate=RATE, duration=latency_s, warmup=warmup_s)
        figures = {**peak, **latency}
        _say(progress, f"[{name}] {json.dumps(figures)}")
        return figures

    own_affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with tempfile.TemporaryDirectory(prefix="canary-bench-tracing-") as tmp_name:
        tmp = Path(tmp_name)
        if load_cpu is not None:
            os.sched_setaffinity(0, {load_cpu})
        try:
            with contextlib.ExitStack() as stack:
                up_port, otlp_port = _free_port(), _free_port()
                if nginx:
                    conf = _nginx_conf(
                        tmp, "upstream", _NGINX_UPSTREAM.format(host=HOST, port=up_port)
                    )
                    up_args = _nginx_args(nginx, tmp, conf)
                else:
                    up_args = [python, "-m", "controlplane.benchmarks.sidecar", "serve-fixed",
                               str(up_port)]  # fmt: skip
                upstream = stack.enter_context(
                    _process(up_args, cpu=load_cpu, port=up_port, log=tmp / "upstream.log")
                )
                _repin(upstream.pid, load_cpu)
                stack.enter_context(
                    _process([python, "-m", MODULE, "serve-otlp", str(otlp_port)],
                             cpu=load_cpu, port=otlp_port, log=tmp / "otlp.log")
                )  # fmt: skip
                upstream_url = f"http://{HOST}:{up_port}"
                otlp_url = f"http://{HOST}:{otlp_port}"
                forms: list[tuple[str, int, int]] = []
                before = _before_tree(tmp)
                if isinstance(before, str):
                    notes.append(f"no `before` figures: {before}")
                else:
                    tree, commit = before
                    result["before_commit"] = commit
                    port = _free_port()
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    proc = stack.enter_context(
                        _process([python, "-P", "-m", PROXY, "serve-proxy",
                                  f"{HOST}:{port}", upstream_url],
                                 cpu=server_cpu, port=port, log=tmp / "before.log", env=env)
                    )  # fmt: skip
                    forms.append(("before", port, proc.pid))
                port = _free_port()
                proc = stack.enter_context(
                    _process([python, "-P", "-m", PROXY, "serve-proxy",
                              f"{HOST}:{port}", upstream_url],
                             cpu=server_cpu, port=port, log=tmp / "off.log",
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
                )  # fmt: skip
                forms.append(("off", port, proc.pid))
                for name, ratio in RATIOS.items():
                    port = _free_port()
                    proc = stack.enter_context(
                        _process([python, "-P", "-m", MODULE, "serve-proxy", f"{HOST}:{port}",
                                  upstream_url, repr(ratio), otlp_url],
                                 cpu=server_cpu, port=port, log=tmp / f"{name}.log",
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
                    )  # fmt: skip
                    forms.append((name, port, proc.pid))
                measured: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in forms}
                for index in range(rounds):
                    # each round starts with another form: none always goes first
                    shift = index % len(forms)
                    for name, port, pid in forms[shift:] + forms[:shift]:
                        measured[name].append(measure(f"{name} {index + 1}", port, pid))
        finally:
            if own_affinity is not None:
                os.sched_setaffinity(0, own_affinity)
    for name, figures in measured.items():
        result[name] = _median(figures)
    result["ratios"] = _ratios(result, measured)
    return result


def _median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("max_rps", "cpu_us_per_request", "p50_ms", "p99_ms")
    combined: dict[str, Any] = {
        key: round(float(np.median([r[key] for r in rounds if r[key] is not None])), 3)
        for key in keys
    }
    combined["errors"] = sum(r["errors"] for r in rounds)
    combined["rounds"] = rounds
    return combined


def _ratios(result: dict[str, Any], measured: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each form over `off` (and `off` over `before`), per round then the median: a
    round's forms ran back to back, so their ratio carries less of the machine's noise."""
    ratios: dict[str, Any] = {}
    pairs = [(name, "off") for name in RATIOS] + [("off", "before")]
    for name, reference in pairs:
        if name not in measured or reference not in measured:
            continue
        per_round = {
            key: [
                a[key] / b[key]
                for a, b in zip(measured[name], measured[reference], strict=True)
                if a[key] and b[key]
            ]
            for key in ("cpu_us_per_request", "max_rps")
        }
        ratios[f"{name}_vs_{reference}"] = {
            key: {"median": round(float(np.median(values)), 3),
                  "rounds": [round(v, 3) for v in values]}
            for key, values in per_round.items()
            if values
        }  # fmt: skip
        ratios[f"{name}_vs_{reference}"]["added_p99_ms"] = round(
            result[name]["p99_ms"] - result[reference]["p99_ms"], 3
        )
    return ratios


def _main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "serve-otlp":
        _run_async(_serve_otlp(int(argv[1])))
    elif len(argv) == 5 and argv[0] == "serve-proxy":
        _run_async(_serve_traced_proxy(argv[1], argv[2], float(argv[3]), argv[4]))
    else:
        sys.exit("usage: serve-otlp PORT | serve-proxy HOST:PORT UPSTREAM_URL RATIO OTLP_URL")


if __name__ == "__main__":
    _main(sys.argv[1:])
