"""`canary bench sidecar-resources`: the CPU and memory one sidecar worker needs, to
size a sidecar container's requests and limits (deploy/, decision 0055).

`canary sidecar --workers 1` as a Pod runs it: its route from etcd (a 10% canary),
signed samples to Redis, in front of a real upstream (nginx returning a fixed 200, or
a Python one). An open-loop generator sends requests on a fixed schedule at each
rate (idle, then 250, 1,000 and 2,000 requests/s), and for each the run reads, from
/proc, the CPU time of the supervisor and its worker over the run (in cores: CPU
seconds per second) and their memory every 0.25 s (PSS summed, which counts a page
shared by the two processes once, as the container's cgroup does; RSS summed beside
it). The sidecar has one CPU to itself, the generator and the upstream the other.

`recommended` turns the 1,000 requests/s figures into a container's resources: the
CPU request is that rate's cores with 50% headroom, the memory request the peak PSS
at the highest rate with 25%, both rounded up; the limits are one core (a worker is
one process: it cannot use more) and twice the memory request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from controlplane.benchmarks.sidecar import (
    _NGINX_UPSTREAM,
    HOST,
    _Command,
    _cpus,
    _free_port,
    _nginx_args,
    _nginx_conf,
    _process,
    _raise_priority,
    _route_and_wait,
    _say,
    _wait_ready,
    open_loop,
)

RATES = (0, 250, 1_000, 2_000)  # requests/s; 0: idle, route and reporter running
SIZING_RATE = 1_000
CANARY_BP = 1_000  # a 10% canary: both variants' pools and samples are exercised
CPU_HEADROOM = 1.5
MEMORY_HEADROOM = 1.25
MEMORY_SAMPLE_S = 0.25


def _tree(pid: int) -> list[int]:
    """The supervisor and its workers."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return pids


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(PSS, RSS) in KiB summed over the processes, from smaps_rollup."""
    pss = rss = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                name, _, rest = line.partition(":")
                if name == "Pss":
                    pss += int(rest.split()[0])
                elif name == "Rss":
                    rss += int(rest.split()[0])
    return pss, rss


class _MemoryWatch:
    """The peak PSS and RSS of a process tree, sampled in a thread while a run lasts."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_pss = self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            pss, rss = memory_kib(_tree(self.pid))
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self._stop.wait(MEMORY_SAMPLE_S)

    def __enter__(self) -> _MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def recommend(cores_at_sizing_rate: float, peak_pss_mib: float) -> dict[str, Any]:
    """A container's resources from the measured figures (see the module's docstring)."""
    cpu_m = max(50, _round_up(cores_at_sizing_rate * 1000 * CPU_HEADROOM, 10))
    memory_mi = _round_up(peak_pss_mib * MEMORY_HEADROOM, 16)
    return {
        "requests": {"cpu": f"{cpu_m}m", "memory": f"{memory_mi}Mi"},
        "limits": {"cpu": "1", "memory": f"{2 * memory_mi}Mi"},
        "workers": 1,
        "basis": f"cpu: cores at {SIZING_RATE} req/s x {CPU_HEADROOM}; memory: peak PSS "
        f"x {MEMORY_HEADROOM}; cpu limit: one worker process; memory limit: 2x request",
    }


def _measure(command: _Command, rate: int, seconds: float, warmup: float) -> dict[str, Any]:
    pids = _tree(command.pid)
    with _MemoryWatch(command.pid) as memory:
        started, cpu_before = time.perf_counter(), cpu_seconds(pids)
        if rate:
            latency = open_loop(command.port, rate=rate, duration=seconds, warmup=warmup)
        else:
            time.sleep(seconds + warmup)
            latency = {}
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(pids) - cpu_before
    figures: dict[str, Any] = {
        "rate_rps": rate,
        "seconds": round(elapsed, 2),
        "cores": round(cpu / elapsed, 4),
        "peak_pss_mib": round(memory.peak_pss / 1024, 1),
        "peak_rss_mib": round(memory.peak_rss / 1024, 1),
        "processes": len(pids),
    }
    if latency:
        figures.update(
            {k: latency[k] for k in ("p50_ms", "p99_ms", "requests", "errors")}
        )
        figures["cpu_us_per_request"] = round(cpu / (rate * elapsed) * 1e6, 1)
    return figures


def _start_sidecar(
    stack: contextlib.ExitStack, tmp: Path, up_port: int, cpu: int | None
) -> _Command | str:
    etcd = os.environ.get("CANARY_BENCH_ETCD", f"{HOST}:2379")
    redis = os.environ.get("CANARY_BENCH_REDIS", f"redis://{HOST}:6379/0")
    for address in (etcd, redis.split("//", 1)[1].split("/", 1)[0]):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
        except OSError:
            return f"nothing answers at {address}"
    canary = shutil.which("canary") or str(Path(sys.executable).with_name("canary"))
    if not Path(canary).exists():
        return "the canary command is not installed"
    from controlplane.kernel.keys import EtcdKeys

    service = f"bench-res-{uuid.uuid4().hex[:8]}"
    prefix = f"/bench-{uuid.uuid4().hex[:10]}"
    listen, admin = _free_port(), _free_port()
    upstream = f"http://{HOST}:{up_port}"
    args = [
        canary, "sidecar", "--service", service, "--listen", f"{HOST}:{listen}",
        "--admin", f"{HOST}:{admin}", "--etcd", etcd, "--etcd-prefix", prefix,
        "--redis", redis, "--default-upstream", upstream, "--workers", "1",
        # every request comes from one address here, as from behind an ingress
        "--max-connections-per-client", "0",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "CANARY_SAMPLE_KEYS": f"bench:{secrets.token_hex(32)}",
    }
    proc = stack.enter_context(
        _process(args, cpu=cpu, port=listen, log=tmp / "sidecar.log", env=env)
    )
    _wait_ready(admin, proc)
    command = _Command(proc.pid, listen, etcd, EtcdKeys(prefix).route(service), upstream)
    stack.callback(_forget, command, redis, service)
    asyncio.run(_route_and_wait(command, [(1, CANARY_BP)]))
    return command


def _forget(command: _Command, redis_url: str, service: str) -> None:
    """The route and the sample stream this run wrote."""
    import redis as redis_py

    from controlplane.benchmarks.sidecar import _delete
    from controlplane.kernel.keys import RedisKeys

    asyncio.run(_delete(command))
    keys = RedisKeys()
    client = redis_py.Redis.from_url(redis_url)
    try:
        client.delete(keys.samples(service))
        for key in client.scan_iter(match=f"{keys.namespace}:seq:{{{service}}}:*"):
            client.delete(key)
    finally:
        client.close()


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    from sidecar.proxy.limits import raise_fd_limit

    raise_fd_limit()  # the open loop opens connections as a stalled server needs them
    seconds, warmup = (3.0, 0.5) if quick else (20.0, 2.0)
    server_cpu, load_cpu = _cpus()
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    from sidecar import compiled

    result: dict[str, Any] = {
        "benchmark": "sidecar-resources",
        "quick": quick,
        "command": "canary sidecar --workers 1 (route from etcd, 10% canary; signed "
        "samples to Redis)",
        "upstream": "nginx return 200, 1 worker" if nginx else "python asyncio fixed 200",
        "load_generator": "python open loop (fixed schedule, keep-alive)",
        "cpus": {"sidecar": server_cpu, "load_and_upstream": load_cpu},
        "proxy_build": compiled.select()[1],
        "seconds_per_rate": seconds,
        "nice": -10 if _raise_priority() else os.getpriority(os.PRIO_PROCESS, 0),
    }
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="canary-bench-") as tmp_name, \
            contextlib.ExitStack() as stack:  # fmt: skip
        tmp = Path(tmp_name)
        if load_cpu is not None:
            os.sched_setaffinity(0, {load_cpu})
        up_port = _free_port()
        if nginx:
            conf = _nginx_conf(tmp, "upstream", _NGINX_UPSTREAM.format(host=HOST, port=up_port))
            up_args = _nginx_args(nginx, tmp, conf)
        else:
            up_args = [sys.executable, "-m", "controlplane.benchmarks.sidecar", "serve-fixed",
                       str(up_port)]  # fmt: skip
        stack.enter_context(_process(up_args, cpu=load_cpu, port=up_port, log=tmp / "up.log"))
        command = _start_sidecar(stack, tmp, up_port, server_cpu)
        if isinstance(command, str):
            raise RuntimeError(f"cannot run canary sidecar: {command}")
        runs = []
        for rate in RATES:
            _say(progress, f"[sidecar-resources] {rate} req/s for {seconds} s ...")
            try:
                runs.append(_measure(command, rate, seconds, warmup))
            except OSError as exc:  # the sidecar gave up a connection: say so, go on
                runs.append({"rate_rps": rate, "failed": f"{type(exc).__name__}: {exc}"})
            _say(progress, f"[sidecar-resources] {runs[-1]}")
    with contextlib.suppress(OSError):
        result["loadavg_at_end"] = round(os.getloadavg()[0], 2)
    result["runs"] = runs
    sizing = next(r for r in runs if r["rate_rps"] == SIZING_RATE)
    result["recommended"] = recommend(
        sizing["cores"], max(r.get("peak_pss_mib", 0.0) for r in runs)
    )
    return result
