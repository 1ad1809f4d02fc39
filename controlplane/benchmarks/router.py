"""`canary bench router`: NGINX and HAProxy steered by a router agent, against themselves.

Every figure is a ratio to, or a count beside, a reference measured in the same run,
on the real services (etcd 127.0.0.1:2379 under a prefix of its own, Redis 6379
under a namespace of its own; `CANARY_BENCH_ETCD`, `CANARY_BENCH_REDIS` override):

1. throughput: max requests/s (wrk, keep-alive, 50 connections) through each proxy
   with the canary split and logging on (the config the router renders for a
   two-variant route, canary 20 %, access log to the agent, the agent running) over
   the same proxy plain (one proxy_pass / backend, no split, no log), same upstream
   (nginx `return 200`, measured alone), rounds alternating the two;
2. samples: a fixed-rate load (wrk with a per-request delay: connections x 1000 /
   delay ms is the ceiling) through the steered proxy; requests the proxy counted,
   datagrams the agent received, dropped by the kernel, samples sent, samples a real
   `canary collector` counted;
3. CPU: the agent's per sample, proxy + agent per request, over `canary sidecar
   --workers 1` (real Redis) per request under the same load;
4. route change → in force in the proxy, P50/P99, changes spaced (NGINX coalesces
   reloads within 0.25 s), and one burst of 10 changes in 100 ms.

CPU (two cores): in 1 the proxy under test and its agent share one CPU, wrk and the
upstream the other, so the steered proxy pays for its agent as a data plane on one core
does; the proxy's own CPU per request over the plain one's (`proxy_cpu_ratio`) is what
the proxy alone would reach with the agent elsewhere. In 2 and 3 every process may run
on both CPUs (20,000 requests/s needs them). CPU seconds per process (from /proc; wrk's
from its rusage) are reported with every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import http.client
import io
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from controlplane.benchmarks.sidecar import (
    _NGINX_UPSTREAM,
    HOST,
    WRK_CONNECTIONS,
    _Command,
    _cpu_split,
    _cpus,
    _free_port,
    _nginx_args,
    _nginx_conf,
    _process,
    _raise_priority,
    _repin,
    _route_and_wait,
    _say,
    _wait_ready,
    _wrk,
)

TARGET_RPS_RATIO = 0.9
TARGET_NGINX_P99_MS = 1000.0
TARGET_HAPROXY_P99_MS = 50.0
RATE_RPS = 20_000
RATE_DELAY_MS = 10  # wrk waits this long before each request on a connection
CANARY_BP = 2_000
NGINX_SPACING_S = 0.5  # twice the 0.25 s min interval: no change waits for another
HAPROXY_SPACING_S = 0.05
BURST = 10
BURST_GAP_S = 0.01
SETTLE_S = 30.0
ALL_CPUS: set[int] = set(os.sched_getaffinity(0))  # at import: before the run pins itself


@dataclass(frozen=True)
class Durations:
    rounds: int
    max_rps_s: float
    rate_s: float
    changes: int


QUICK = Durations(rounds=1, max_rps_s=2.0, rate_s=4.0, changes=10)
FULL = Durations(rounds=3, max_rps_s=5.0, rate_s=60.0, changes=50)


# --- pure figures ---------------------------------------------------------------


def rate_connections(rate: float, delay_ms: int) -> int:
    """wrk connections for a rate when each waits `delay_ms` before each request: the
    ceiling is connections x 1000 / delay; 5 % more make up for the response time."""
    return max(1, math.ceil(rate * delay_ms / 1000 * 1.05))


# wrk prints the run's length in the largest unit that fits: "1.00m", "5.00s"
WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def wrk_counts(out: str) -> tuple[int, float, int]:
    """(requests, seconds, non-2xx responses) from wrk's report."""
    served = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m|h)\b", out)
    if served is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    seconds = float(served.group(2)) * WRK_UNITS[served.group(3)]
    return int(served.group(1)), seconds, int(non2xx.group(1)) if non2xx else 0


def delay_script(delay_ms: int) -> str:
    """A wrk Lua script holding each connection `delay_ms` before every request."""
    return f"function delay()\n    return {int(delay_ms)}\nend\n"


def percentiles_ms(seconds: list[float]) -> dict[str, Any]:
    ms = np.asarray(seconds) * 1e3
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "changes": len(seconds),
    }


def sample_accounting(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Counters of a fixed-rate run (after - before) and the loss, with its parts."""
    d = {key: int(after[key] - before.get(key, 0)) for key in after}
    requests, counted = d["requests"], d["collector_ingested"] + d["collector_late"]
    return {
        "requests": requests,
        "datagrams_received": d["received"],
        "dropped_kernel": d["dropped_kernel"],
        "refused_by_parser": d["refused"],
        "refused_by_reason": {
            k.removeprefix("refused_"): v for k, v in d.items() if k.startswith("refused_") and v
        },
        "samples_sent": d["sent"],
        "samples_dropped_by_agent": d["dropped"],
        "samples_unattributed": d["unattributed"],
        "collector_ingested": d["collector_ingested"],
        "collector_late": d["collector_late"],
        "counted": counted,
        "lost": requests - counted,
        "lost_ratio": round((requests - counted) / requests, 6) if requests else None,
        # each part of the loss where it happened; what is left is unexplained
        "lost_explained": {
            "never_received": requests - d["received"],
            "of_which_kernel": d["dropped_kernel"],
            "received_not_sent": d["received"] - d["sent"],
            "sent_not_counted": d["sent"] - counted,
        },
    }


def ratio(ours: float | None, reference: float | None) -> float | None:
    return round(ours / reference, 3) if ours and reference else None


# --- processes and readings --------------------------------------------------------


def _version(args: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(args, capture_output=True, text=True, timeout=10)
        return (out.stderr + out.stdout).strip().splitlines()[0]
    return "unknown"


def _get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _metrics(port: int, wanted: dict[str, dict[str, str]]) -> dict[str, float]:
    """name -> sum of the samples of `metric` whose labels include the given ones."""
    text = _get(port, "/metrics")[1].decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    out: dict[str, float] = {}
    for name, spec in wanted.items():
        metric, labels = spec["metric"], {k: v for k, v in spec.items() if k != "metric"}
        out[name] = sum(
            s.value for s in samples
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())
        )  # fmt: skip
    return out


def _refused(port: int) -> dict[str, float]:
    """Lines the agent's parser refused, by reason."""
    text = _get(port, "/metrics")[1].decode()
    return {
        s.labels["fate"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "canary_router_log_lines_total"
        and s.labels.get("fate", "").startswith("refused")
    }


AGENT_METRICS = {
    "received": {"metric": "canary_router_log_lines_total", "fate": "received"},
    "dropped_kernel": {"metric": "canary_router_log_lines_total", "fate": "dropped_kernel"},
    "sent": {"metric": "canary_router_samples_total", "fate": "sent"},
    "dropped": {"metric": "canary_router_samples_total", "fate": "dropped"},
    "unattributed": {"metric": "canary_router_samples_total", "fate": "unattributed"},
    "buffered": {"metric": "canary_router_samples_buffered"},
    "batches_buffered": {"metric": "canary_router_sample_batches_buffered"},
}
COLLECTOR_METRICS = {
    "collector_ingested": {"metric": "canary_collector_samples_ingested_total"},
    "collector_late": {"metric": "canary_collector_samples_late_total"},
}


def _status(admin: int) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(_get(admin, "/status")[1])
    return status


@dataclass
class Services:
    etcd: str
    redis: str
    namespace: str
    prefix: str
    canary: str

    def env(self) -> dict[str, str]:
        return {
            **os.environ, "PYTHONUNBUFFERED": "1", "CANARY_ETCD": self.etcd,
            "CANARY_ETCD_PREFIX": self.prefix, "CANARY_REDIS_URL": self.redis,
            "CANARY_REDIS_NAMESPACE": self.namespace,
        }  # fmt: skip

    def key(self, service: str) -> str:
        from controlplane.kernel.keys import EtcdKeys

        return EtcdKeys(self.prefix).route(service)


def _route(upstream: str, revision: int, canary_bp: int) -> bytes:
    from controlplane.kernel.routes import Route, RouteState, two_way_variants

    route = Route(
        experiment="bench", revision=revision, salt="bench",
        variants=two_way_variants(upstream, upstream, canary_bp), state=RouteState.RUNNING,
    )  # fmt: skip
    return route.to_json().encode()


async def _put(etcd: str, key: str, value: bytes) -> None:
    from controlplane.kernel.kv_etcd import EtcdKV

    kv = EtcdKV(etcd)
    try:
        await kv.put(key, value)
    finally:
        await kv.close()


@dataclass
class Front:
    """One steered proxy and its plain twin, and the agent beside the steered one."""

    kind: str
    service: str
    port: int  # the steered proxy
    plain_port: int
    pid: int
    plain_pid: int
    agent_pid: int
    admin: int
    upstream: str
    requests: Callable[[], int]  # the steered proxy's own count of the service's requests
    in_force: Callable[[], Coroutine[Any, Any, int | None]]  # the revision the proxy answers with
    revision: int = 1
    notes: list[str] = field(default_factory=list)


def _agent_common(service: str, port: int, admin: int, log_port: int) -> list[str]:
    return ["--service", service, "--listen", f"{HOST}:{port}", "--admin", f"{HOST}:{admin}",
            "--log-listen", f"{HOST}:{log_port}"]


_PLAIN_NGINX = """upstream plain_up {{
    server {host}:{upstream_port};
    keepalive 128;
}}
server {{
    listen {host}:{port};
    access_log off;
    location / {{
        proxy_pass http://plain_up;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
    }}
}}
"""
_STUB = """server {{
    listen {host}:{port};
    access_log off;
    location = /stub {{ stub_status; }}
}}
"""


def _nginx_root(root: Path) -> tuple[Path, Path]:
    from routers.nginx.main_conf import main_config, temp_dirs

    conf_dir = root / "conf.d"
    conf_dir.mkdir(parents=True)
    for path in temp_dirs(root):
        path.mkdir(parents=True)
    conf = root / "nginx.conf"
    # one worker, as the plain twin has: the proxy under test gets one CPU
    conf.write_text(main_config(root, conf_dir, workers="1"))
    return conf, conf_dir


def stub_count(body: str) -> int:
    """The `requests` counter of an nginx stub_status page."""
    return int(body.splitlines()[2].split()[2])


def _stub_requests(port: int) -> Callable[[], int]:
    """nginx's request count (stub_status) less every reading of it made through here:
    each reading is itself a request nginx counts."""
    readings = 0

    def requests() -> int:
        nonlocal readings
        readings += 1
        return stub_count(_get(port, "/stub")[1].decode()) - readings

    return requests


def _start_nginx(
    stack: contextlib.ExitStack, tmp: Path, svc: Services, nginx: str, up_port: int,
    server_cpu: int | None,
) -> Front:
    service = "bench-nginx"
    port, admin, log_port = _free_port(), _free_port(), _free_port()
    status_port, stub_port, plain_port = _free_port(), _free_port(), _free_port()
    root = tmp / "nginx"
    conf, conf_dir = _nginx_root(root)
    args = [
        svc.canary, "router", "nginx", *_agent_common(service, port, admin, log_port),
        "--conf-dir", str(conf_dir), "--nginx-conf", str(conf), "--nginx", nginx,
        "--status-listen", f"{HOST}:{status_port}", "--pid-file", str(root / "nginx.pid"),
        "--etcd", svc.etcd, "--etcd-prefix", svc.prefix, "--redis", svc.redis,
    ]  # fmt: skip
    # as an operator starts it: the agent writes the first include (no route: 503)
    subprocess.run([*args, "--print-config"], env=svc.env(), check=True, capture_output=True)
    # the proxy's own request counter, beside the agent's include (ours, not the agent's)
    (conf_dir / "canary-zz-bench-stub.conf").write_text(_STUB.format(host=HOST, port=stub_port))
    upstream = f"http://{HOST}:{up_port}"
    asyncio.run(_put(svc.etcd, svc.key(service), _route(upstream, 1, CANARY_BP)))
    argv = [nginx, "-p", str(root), "-c", str(conf), "-g", "daemon off;"]
    proxy = stack.enter_context(_process(argv, cpu=server_cpu, port=port, log=tmp / "ng.log"))
    _repin(proxy.pid, server_cpu)
    agent = stack.enter_context(
        _process(args, cpu=server_cpu, port=admin, log=tmp / "ng-agent.log", env=svc.env())
    )
    _wait_ready(admin, agent)

    plain_root = tmp / "nginx-plain"
    plain_conf, plain_dir = _nginx_root(plain_root)
    (plain_dir / "canary-plain.conf").write_text(
        _PLAIN_NGINX.format(host=HOST, port=plain_port, upstream_port=up_port)
    )
    plain_argv = [nginx, "-p", str(plain_root), "-c", str(plain_conf), "-g", "daemon off;"]
    plain = stack.enter_context(
        _process(plain_argv, cpu=server_cpu, port=plain_port, log=tmp / "ng-plain.log")
    )
    _repin(plain.pid, server_cpu)

    async def in_force() -> int | None:
        from routers.nginx.render import STATUS_PATH

        code, body = _get(status_port, STATUS_PATH, timeout=1.0)
        revision = json.loads(body).get("revision") if code == 200 else None
        return revision if isinstance(revision, int) else None

    return Front(
        "nginx", service, port, plain_port, proxy.pid, plain.pid, agent.pid, admin, upstream,
        requests=_stub_requests(stub_port), in_force=in_force,
    )  # fmt: skip


_PLAIN_HAPROXY = """global
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-request 10s

frontend plain
    bind {host}:{port}
    default_backend up

backend up
    server up {host}:{upstream_port}
"""


def _haproxy_command(socket: str, *words: str) -> str:
    from routers.haproxy.runtime import StatsSocket

    return asyncio.run(StatsSocket(socket).command(*words))


def _frontend_requests(socket: str, frontend: str) -> int:
    """HAProxy's `req_tot` of a frontend (`show stat`)."""
    text = _haproxy_command(socket, "show", "stat").lstrip("# ")
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("pxname") == frontend and row.get("svname") == "FRONTEND":
            return int(row["req_tot"])
    raise RuntimeError(f"no frontend {frontend!r} in HAProxy's show stat")


def _start_haproxy(
    stack: contextlib.ExitStack, tmp: Path, svc: Services, haproxy: str, up_port: int,
    server_cpu: int | None,
) -> Front:
    service = "bench-haproxy"
    port, admin, log_port, plain_port = _free_port(), _free_port(), _free_port(), _free_port()
    root = tmp / "haproxy"
    root.mkdir()
    socket, map_path = str(root / "haproxy.sock"), str(root / "route.map")
    args = [
        svc.canary, "router", "haproxy", *_agent_common(service, port, admin, log_port),
        "--socket", socket, "--map", map_path,
        "--etcd", svc.etcd, "--etcd-prefix", svc.prefix, "--redis", svc.redis,
    ]  # fmt: skip
    printed = subprocess.run(
        [*args, "--print-config"], env=svc.env(), check=True, capture_output=True
    )
    (root / "haproxy.cfg").write_bytes(printed.stdout)
    Path(map_path).write_text("")
    upstream = f"http://{HOST}:{up_port}"
    asyncio.run(_put(svc.etcd, svc.key(service), _route(upstream, 1, CANARY_BP)))
    argv = [haproxy, "-f", str(root / "haproxy.cfg"), "-db"]
    proxy = stack.enter_context(_process(argv, cpu=server_cpu, port=port, log=tmp / "hap.log"))
    agent = stack.enter_context(
        _process(args, cpu=server_cpu, port=admin, log=tmp / "hap-agent.log", env=svc.env())
    )
    _wait_ready(admin, agent)
    plain_socket = str(root / "plain.sock")
    (root / "plain.cfg").write_text(
        _PLAIN_HAPROXY.format(socket=plain_socket, host=HOST, port=plain_port,
                              upstream_port=up_port)
    )
    plain = stack.enter_context(
        _process([haproxy, "-f", str(root / "plain.cfg"), "-db"], cpu=server_cpu,
                 port=plain_port, log=tmp / "hap-plain.log")
    )
    threads = {
        name: _info(sock).get("Nbthread") for name, sock in (("steered", socket),
                                                             ("plain", plain_socket))
    }  # fmt: skip

    async def in_force() -> int | None:
        from routers.haproxy.route_value import KEY, SEP
        from routers.haproxy.runtime import StatsSocket

        for entry in await StatsSocket(socket).show_map(map_path):
            if entry.key == KEY:
                return int(entry.value.split(SEP)[1])
        return None

    front = Front(
        "haproxy", service, port, plain_port, proxy.pid, plain.pid, agent.pid, admin, upstream,
        requests=lambda: _frontend_requests(socket, service), in_force=in_force,
    )  # fmt: skip
    front.notes.append(f"HAProxy threads (show info Nbthread): {threads}")
    front.notes.append(
        "a connection a client closes before sending a request (wrk at its end) is logged "
        "as a 400 with termination CR and no route fields, and may count in req_tot: the "
        "agent refuses such a line as unattributed (refused_by_reason), not a sample lost"
    )
    return front


def _info(socket: str) -> dict[str, str]:
    """HAProxy's `show info`, name -> value."""
    out: dict[str, str] = {}
    for line in _haproxy_command(socket, "show", "info").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


# --- 1. throughput ---------------------------------------------------------------


def _affinity(pid: int, cpus: set[int]) -> None:
    """Move a process and its children (nginx's worker) to a set of CPUs."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for each in pids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(each, cpus)


@contextlib.contextmanager
def _spread(pids: Iterable[int]) -> Iterator[None]:
    """Every process free to run on every CPU inside the block (a fixed rate of
    20,000 requests/s needs both), each put back where it was after."""
    placed = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            placed[pid] = os.sched_getaffinity(pid)
            _affinity(pid, set(os.sched_getaffinity(0)) | ALL_CPUS)
    try:
        yield
    finally:
        for pid, cpus in placed.items():
            _affinity(pid, cpus)


@contextlib.contextmanager
def _cpu_of(pids: dict[str, int]) -> Iterator[dict[str, float]]:
    """CPU seconds each process (and its children) spent inside the block; "wrk" is
    the children this process reaped meanwhile (the load generator)."""
    before = {name: sum(_cpu_split(pid)) for name, pid in pids.items()}
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent: dict[str, float] = {}
    yield spent
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for name, pid in pids.items():
        spent[name] = round(sum(_cpu_split(pid)) - before[name], 3)
    spent["wrk"] = round(
        after.ru_utime - reaped.ru_utime + after.ru_stime - reaped.ru_stime, 3
    )


def _peak(
    wrk: str, port: int, pids: dict[str, int], seconds: float, load_cpu: int | None
) -> dict[str, Any]:
    with _cpu_of(pids) as spent:
        peak = _wrk(wrk, port, duration=seconds, cpu=load_cpu)
    served = peak.get("wrk_requests") or 1
    peak["cpu_seconds"] = spent
    peak["cpu_us_per_request"] = {k: round(v / served * 1e6, 1) for k, v in spent.items()}
    return peak


AGENT_NICE = 19  # "agent apart": lowest priority beside wrk and the upstream


def median_ratio(ours: list[float | None], reference: list[float | None]) -> dict[str, Any]:
    """Round-by-round ratios ours / reference and their median (None where a round
    lacks a figure)."""
    rounds = [ratio(o, r) for o, r in zip(ours, reference, strict=True)]
    known = [r for r in rounds if r is not None]
    return {"median": round(float(np.median(known)), 3) if known else None, "rounds": rounds}


def _place_agent(front: Front, cpu: int | None, nice: int) -> None:
    _repin(front.agent_pid, cpu)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, front.agent_pid, nice)


def _throughput(
    front: Front, wrk: str, upstream_pid: int, durations: Durations,
    cpus: tuple[int | None, int | None], progress: bool,
) -> dict[str, Any]:
    """Rounds of plain, steered (the agent on the proxy's CPU) and steered with the
    agent apart (on the load CPU at the lowest priority: the proxy's own cost, the
    agent's shortfall counted as kernel drops)."""
    server_cpu, load_cpu = cpus
    agent_nice = os.getpriority(os.PRIO_PROCESS, front.agent_pid)
    paths = {
        "plain": (front.plain_port, front.plain_pid, server_cpu, agent_nice),
        "steered": (front.port, front.pid, server_cpu, agent_nice),
        "steered_agent_apart": (front.port, front.pid, load_cpu, AGENT_NICE),
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    try:
        for index in range(durations.rounds):
            for name, (port, pid, agent_cpu, nice) in paths.items():
                _place_agent(front, agent_cpu, nice)
                pids = {"proxy": pid, "agent": front.agent_pid, "upstream": upstream_pid}
                drops = _metrics(front.admin, AGENT_METRICS)["dropped_kernel"]
                figures = _peak(wrk, port, pids, durations.max_rps_s, load_cpu)
                figures["agent_dropped_kernel"] = int(
                    _metrics(front.admin, AGENT_METRICS)["dropped_kernel"] - drops
                )
                _say(progress, f"[{front.kind} {name} {index + 1}] {figures['max_rps']} req/s, "
                     f"cpu s {figures['cpu_seconds']}, kernel drops "
                     f"{figures['agent_dropped_kernel']}")
                rounds[name].append(figures)
    finally:
        _place_agent(front, server_cpu, agent_nice)

    def column(name: str, key: str, part: str | None = None) -> list[float | None]:
        return [r[key][part] if part else r[key] for r in rounds[name]]

    out: dict[str, Any] = {"max_rps": {n: max(r["max_rps"] for r in rounds[n]) for n in rounds}}
    for name in ("steered", "steered_agent_apart"):
        rps = median_ratio(column(name, "max_rps"), column("plain", "max_rps"))
        # plain CPU per request over the steered proxy's: the requests/s ratio the
        # proxy alone reaches on a CPU of its own
        cpu = median_ratio(column("plain", "cpu_us_per_request", "proxy"),
                           column(name, "cpu_us_per_request", "proxy"))
        out[name] = {
            "rps_ratio": rps["median"], "rps_ratio_rounds": rps["rounds"],
            "proxy_cpu_ratio": cpu["median"], "proxy_cpu_ratio_rounds": cpu["rounds"],
            "ok": rps["median"] is not None and rps["median"] >= TARGET_RPS_RATIO,
        }
    out["rounds"] = rounds
    out["target_min"] = TARGET_RPS_RATIO
    return out


# --- 2 and 3. samples at a fixed rate, CPU per sample ------------------------------


def _wrk_rate(
    wrk: str, port: int, *, rate: float, seconds: float, cpu: int | None, script: Path,
    delay_ms: int = RATE_DELAY_MS,
) -> dict[str, Any]:
    """wrk held to `rate` by a wait before every request (`script` is written here)."""
    from controlplane.benchmarks.sidecar import _pin

    script.write_text(delay_script(delay_ms))
    connections = rate_connections(rate, delay_ms)
    out = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script),
         f"http://{HOST}:{port}/"],
        capture_output=True, text=True, check=True, preexec_fn=_pin(cpu),
    ).stdout  # fmt: skip
    requests, wall, non2xx = wrk_counts(out)
    return {
        "wrk": f"wrk -t1 -c{connections} -s delay {delay_ms} ms",
        "asked_rps": rate,
        "wrk_requests": requests,
        "reached_rps": round(requests / wall),
        "non_2xx": non2xx,
    }


def _counters(front: Front, collector_admin: int) -> dict[str, float]:
    out = _metrics(front.admin, AGENT_METRICS)
    out.update(_refused(front.admin))
    out["refused"] = sum(_refused(front.admin).values())
    out.update(_metrics(collector_admin, COLLECTOR_METRICS))
    return out


def _settle(front: Front, collector_admin: int) -> dict[str, float]:
    """Until the agent's buffer is empty and the collector has counted what it sent
    (or SETTLE_S passed: the counts then say what is missing)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        c = _counters(front, collector_admin)
        done = c["buffered"] == 0 and c["batches_buffered"] == 0
        if done and c["collector_ingested"] + c["collector_late"] >= c["sent"]:
            return c
        if time.monotonic() > deadline:
            return c
        time.sleep(0.2)


def _samples(
    front: Front, wrk: str, collector_admin: int, durations: Durations, script: Path,
    upstream_pid: int, progress: bool,
) -> dict[str, Any]:
    before = _settle(front, collector_admin)
    pids = {"proxy": front.pid, "agent": front.agent_pid, "upstream": upstream_pid}
    _say(progress, f"[{front.kind} samples] {RATE_RPS} req/s asked for {durations.rate_s} s, "
         "every process on every CPU ...")
    with _spread(pids.values()), _cpu_of(pids) as spent:
        verified = _status(front.admin).get("verified", 0)
        before["requests"] = front.requests()
        load = _wrk_rate(wrk, front.port, rate=RATE_RPS, seconds=durations.rate_s, cpu=None,
                         script=script)
        requests = front.requests()
        # the agent's read-backs of what nginx holds, in the same window (±1)
        read_backs = int(_status(front.admin).get("verified", 0) - verified)
    after = _settle(front, collector_admin)
    after["requests"] = requests
    for key in ("buffered", "batches_buffered"):
        before.pop(key), after.pop(key)
    if front.kind == "nginx":
        # stub_status counts every request nginx served, the agent's read-backs of the
        # status server (not logged) among them
        after["requests"] -= read_backs
    figures = {**load, **sample_accounting(before, after), "agent_read_backs": read_backs}
    sent = figures["samples_sent"]
    figures["cpu_seconds"] = spent
    figures["agent_cpu_us_per_sample"] = round(spent["agent"] / sent * 1e6, 1) if sent else None
    served = figures["requests"] or 1
    figures["proxy_cpu_us_per_request"] = round(spent["proxy"] / served * 1e6, 1)
    figures["proxy_and_agent_cpu_us_per_request"] = round(
        (spent["proxy"] + spent["agent"]) / served * 1e6, 1
    )
    # every measured process's CPU per request: what the machine's cores allow
    every = sum(spent.values()) / served * 1e6
    figures["all_processes_cpu_us_per_request"] = round(every, 1)
    figures["cores_allow_rps_at_most"] = round(len(ALL_CPUS) * 1e6 / every)
    figures["reached_20k"] = figures["reached_rps"] >= RATE_RPS
    brief = {k: v for k, v in figures.items() if k != "lost_explained"}
    _say(progress, f"[{front.kind} samples] {json.dumps(brief)}")
    return figures


def _start_sidecar(
    stack: contextlib.ExitStack, tmp: Path, svc: Services, up_port: int, cpu: int | None
) -> _Command:
    """`canary sidecar --workers 1` with real Redis and etcd, its route in force."""
    service = "bench-svc"  # the name sidecar._route_and_wait's command carries
    listen, admin = _free_port(), _free_port()
    upstream = f"http://{HOST}:{up_port}"
    args = [
        svc.canary, "sidecar", "--service", service, "--listen", f"{HOST}:{listen}",
        "--admin", f"{HOST}:{admin}", "--etcd", svc.etcd, "--etcd-prefix", svc.prefix,
        "--redis", svc.redis, "--default-upstream", upstream, "--workers", "1",
    ]  # fmt: skip
    proc = stack.enter_context(
        _process(args, cpu=cpu, port=listen, log=tmp / "sidecar.log", env=svc.env())
    )
    _wait_ready(admin, proc)
    command = _Command(proc.pid, listen, svc.etcd, svc.key(service), upstream)
    asyncio.run(_route_and_wait(command, [(1, CANARY_BP)]))
    return command


def _sidecar_load(
    command: _Command, wrk: str, durations: Durations, upstream_pid: int, script: Path,
    progress: bool,
) -> dict[str, Any]:
    pids = {"sidecar": command.pid, "upstream": upstream_pid}
    with _spread(pids.values()), _cpu_of(pids) as spent:
        load = _wrk_rate(wrk, command.port, rate=RATE_RPS, seconds=durations.rate_s,
                         cpu=None, script=script)
    served = load["wrk_requests"] or 1
    load["cpu_seconds"] = spent
    load["cpu_us_per_request"] = round(spent["sidecar"] / served * 1e6, 1)
    _say(progress, f"[sidecar samples] {json.dumps(load)}")
    return load


# --- 4. route changes ----------------------------------------------------------------


async def _changes(front: Front, etcd: str, key: str, changes: int, spacing: float) -> list[float]:
    """Write `changes` routes, each `spacing` s after the last was in force; seconds
    from each write to the proxy answering with its revision."""
    from controlplane.kernel.kv_etcd import EtcdKV

    kv = EtcdKV(etcd)
    times: list[float] = []
    try:
        for _ in range(changes):
            front.revision += 1
            value = _route(front.upstream, front.revision, CANARY_BP)
            await asyncio.sleep(spacing)
            written = time.perf_counter()
            await kv.put(key, value)
            await _until_in_force(front, front.revision, written)
            times.append(time.perf_counter() - written)
    finally:
        await kv.close()
    return times


async def _until_in_force(front: Front, revision: int, since: float) -> None:
    while await front.in_force() != revision:
        if time.perf_counter() - since > 10:
            raise TimeoutError(f"{front.kind}: revision {revision} not in force after 10 s")
        await asyncio.sleep(0.002)


async def _agent_at_rest(front: Front) -> dict[str, Any]:
    """The agent's /status once it holds etcd's route (its last apply confirmed and
    counted) and its minimum interval has passed."""
    deadline = time.monotonic() + 10
    while not _status(front.admin)["in_step"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{front.kind} agent not in step after 10 s")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # past the 0.25 s minimum interval
    return _status(front.admin)


async def _burst(front: Front, etcd: str, key: str) -> dict[str, Any]:
    """BURST changes BURST_GAP_S apart: applies (reloads for NGINX), and the time from
    the first write to the last revision in force."""
    from controlplane.kernel.kv_etcd import EtcdKV

    kv = EtcdKV(etcd)
    try:
        # the proxy answers with a revision before the agent has confirmed and counted
        # its apply: count from an agent at rest, past any min interval
        before = await _agent_at_rest(front)
        first = time.perf_counter()
        for index in range(BURST):
            front.revision += 1
            await kv.put(key, _route(front.upstream, front.revision, CANARY_BP))
            if index < BURST - 1:
                await asyncio.sleep(max(0.0, first + (index + 1) * BURST_GAP_S
                                        - time.perf_counter()))
        written_in = time.perf_counter() - first
        await _until_in_force(front, front.revision, first)
        last = time.perf_counter() - first
    finally:
        await kv.close()
    after = await _agent_at_rest(front)
    return {
        "changes": BURST,
        "written_in_ms": round(written_in * 1e3, 1),
        "applies": after["applied"] - before["applied"],
        "coalesced": after["coalesced"] - before["coalesced"],
        "last_in_force_ms": round(last * 1e3, 1),
    }


def _route_changes(front: Front, svc: Services, durations: Durations,
                   progress: bool) -> dict[str, Any]:
    nginx = front.kind == "nginx"
    spacing = NGINX_SPACING_S if nginx else HAPROXY_SPACING_S
    target = TARGET_NGINX_P99_MS if nginx else TARGET_HAPROXY_P99_MS
    _say(progress, f"[{front.kind} route changes] {durations.changes}, {spacing} s apart ...")
    key = svc.key(front.service)
    times = asyncio.run(_changes(front, svc.etcd, key, durations.changes, spacing))
    figures: dict[str, Any] = {**percentiles_ms(times), "spacing_s": spacing}
    figures["burst"] = asyncio.run(_burst(front, svc.etcd, key))
    figures["target_p99_ms_max"] = target
    figures["ok"] = figures["p99_ms"] <= target
    figures["read_as"] = (
        "the status server's revision (a new connection per read)" if nginx
        else "`show map` on the stats socket (the map's revision field)"
    )
    _say(progress, f"[{front.kind} route changes] {json.dumps(figures)}")
    return figures


# --- the run -------------------------------------------------------------------------


def _services() -> Services:
    canary = shutil.which("canary") or str(Path(sys.executable).with_name("canary"))
    token = uuid.uuid4().hex[:10]
    return Services(
        etcd=os.environ.get("CANARY_BENCH_ETCD", f"{HOST}:2379"),
        redis=os.environ.get("CANARY_BENCH_REDIS", f"redis://{HOST}:6379"),
        namespace=f"bench-router-{token}", prefix=f"/bench-router-{token}", canary=canary,
    )  # fmt: skip


async def _clean(svc: Services) -> None:
    """The run's etcd prefix and Redis namespace, removed."""
    import redis.asyncio as aioredis

    from controlplane.kernel.kv_etcd import EtcdKV

    kv = EtcdKV(svc.etcd)
    with contextlib.suppress(Exception):
        items, _ = await kv.get_prefix(svc.prefix + "/")
        for item in items:
            await kv.delete(item.key)
    await kv.close()
    client = aioredis.from_url(svc.redis)
    with contextlib.suppress(Exception):
        async for name in client.scan_iter(match=f"{svc.namespace}:*"):
            await client.delete(name)
    await client.aclose()


def _section(notes: list[str], name: str, measure: Callable[[], dict[str, Any]]) -> Any:
    try:
        return measure()
    except Exception as exc:  # a section's failure is a figure missing, not the run lost
        notes.append(f"{name} failed: {type(exc).__name__}: {exc}"[:2000])
        return None


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Each target with its figure and pass/fail (None: the section did not run)."""
    out: dict[str, Any] = {}
    for kind in ("nginx", "haproxy"):
        part = result.get(kind) or {}
        throughput = part.get("throughput") or {}
        for layout, name in (("steered", "rps_ratio_agent_on_proxy_cpu"),
                             ("steered_agent_apart", "rps_ratio_agent_apart")):
            figures = throughput.get(layout) or {}
            out[f"{kind}_{name}"] = {"value": figures.get("rps_ratio"),
                                     "target": f">= {TARGET_RPS_RATIO}", "ok": figures.get("ok")}
        changes = part.get("route_changes") or {}
        limit = TARGET_NGINX_P99_MS if kind == "nginx" else TARGET_HAPROXY_P99_MS
        out[f"{kind}_route_change_p99_ms"] = {"value": changes.get("p99_ms"),
                                              "target": f"<= {limit}", "ok": changes.get("ok")}
    return out


def _start_collector(stack: contextlib.ExitStack, tmp: Path, svc: Services) -> int:
    admin = _free_port()
    args = [svc.canary, "collector", "--admin", f"{HOST}:{admin}", "--name", "bench-collector"]
    proc = stack.enter_context(
        _process(args, cpu=None, port=admin, log=tmp / "collector.log", env=svc.env())
    )
    _wait_ready(admin, proc)
    return admin


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    from sidecar.proxy.limits import raise_fd_limit

    # progress on stderr even with --json: stdout holds only the JSON object, and a
    # run of minutes should say where it is
    progress = True
    durations = QUICK if quick else FULL
    raise_fd_limit()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    wrk = shutil.which("wrk") or "/usr/bin/wrk"
    for binary in (nginx, haproxy, wrk):
        if not Path(binary).exists():
            raise ValueError(f"the router benchmark needs {binary}")
    server_cpu, load_cpu = _cpus()
    svc = _services()
    notes: list[str] = []
    result: dict[str, Any] = {
        "benchmark": "router",
        "quick": quick,
        "environment": {
            "nginx": _version([nginx, "-v"]), "haproxy": _version([haproxy, "-v"]),
            "wrk": _version([wrk, "-v"]), "cores": os.cpu_count(),
            "cpus_in_throughput": {"proxy_and_agent": server_cpu, "wrk_and_upstream": load_cpu},
            "loadavg_at_start": round(os.getloadavg()[0], 2),
        },
        "rounds": durations.rounds,
        "durations": {"max_rps_s": durations.max_rps_s, "fixed_rate_s": durations.rate_s,
                      "route_changes": durations.changes},
        "load": {
            "max_rps": f"wrk -t1 -c{WRK_CONNECTIONS}, keep-alive",
            "fixed_rate": f"wrk -t1, each connection waits {RATE_DELAY_MS} ms before each "
            f"request (connections x 1000 / {RATE_DELAY_MS} is the ceiling)",
        },
        "route": f"two variants on the same upstream, canary {CANARY_BP} bp, no sticky unit",
        "notes": notes,
    }
    own_affinity = os.sched_getaffinity(0)
    own_priority = os.getpriority(os.PRIO_PROCESS, 0)
    result["environment"]["nice"] = -10 if _raise_priority() else own_priority
    try:
        with tempfile.TemporaryDirectory(prefix="canary-bench-router-") as tmp_name, \
                contextlib.ExitStack() as stack:
            tmp = Path(tmp_name)
            stack.callback(lambda: asyncio.run(_clean(svc)))
            script = tmp / "delay.lua"
            up_port = _free_port()
            up_conf = _nginx_conf(tmp, "upstream", _NGINX_UPSTREAM.format(host=HOST, port=up_port))
            upstream = stack.enter_context(
                _process(_nginx_args(nginx, tmp, up_conf), cpu=load_cpu, port=up_port,
                         log=tmp / "upstream.log")
            )
            # the upstream alone on the proxies' CPU: far above what a proxy reaches
            _repin(upstream.pid, server_cpu)
            direct = _peak(wrk, up_port, {"upstream": upstream.pid}, durations.max_rps_s,
                           load_cpu)
            _repin(upstream.pid, load_cpu)
            result["upstream"] = {"kind": "nginx return 200, 1 worker", "alone_on_a_cpu": direct}
            _say(progress, f"[upstream alone] {direct['max_rps']} req/s")
            collector_admin = _start_collector(stack, tmp, svc)
            fronts = [
                _start_nginx(stack, tmp, svc, nginx, up_port, server_cpu),
                _start_haproxy(stack, tmp, svc, haproxy, up_port, server_cpu),
            ]
            for front in fronts:
                part: dict[str, Any] = {"notes": front.notes}
                # a section that fails is reported as null with its error; the rest runs
                part["throughput"] = _section(front.notes, "throughput", partial(
                    _throughput, front, wrk, upstream.pid, durations, (server_cpu, load_cpu),
                    progress))
                part["samples"] = _section(front.notes, "samples", partial(
                    _samples, front, wrk, collector_admin, durations, script, upstream.pid,
                    progress))
                part["route_changes"] = _section(front.notes, "route_changes", partial(
                    _route_changes, front, svc, durations, progress))
                result[front.kind] = part
            result["sidecar"] = _section(notes, "sidecar", lambda: _sidecar_load(
                _start_sidecar(stack, tmp, svc, up_port, server_cpu), wrk, durations,
                upstream.pid, script, progress))
    finally:
        os.sched_setaffinity(0, own_affinity)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, own_priority)
    result["environment"]["loadavg_at_end"] = round(os.getloadavg()[0], 2)
    sidecar_cpu = (result["sidecar"] or {}).get("cpu_us_per_request")
    for kind in ("nginx", "haproxy"):
        samples = result[kind]["samples"]
        if samples is not None:
            samples["sidecar_cpu_us_per_request"] = sidecar_cpu
            # above 1: the proxy and its agent spend less CPU per request than the sidecar
            ours = samples["proxy_and_agent_cpu_us_per_request"]
            samples["cpu_vs_sidecar"] = ratio(sidecar_cpu, ours)
    result["targets"] = targets(result)
    return result
