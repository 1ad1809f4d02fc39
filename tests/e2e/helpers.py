"""The processes of an end-to-end run and the few things a test does with them.

Every part runs as its own process, on the real services and on free ports:

    upstreams (baseline, canary) ◄── canary sidecar ◄── load generator (in the test)
    canary collector x 2 ── Redis ── canary serve x N (API + leader-elected controller)
                                          PostgreSQL, etcd

Each process writes its output to a file in the run's directory; a failing test
shows the tail of every one (see conftest.py). Nothing here sleeps to wait for a
result: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from controlplane.demo.load import LoadGenerator
from controlplane.demo.scenarios import RouteLog
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValue, KeyValueStore
from controlplane.kernel.routes import Route, parse_route
from tests.support.processes import free_port

REPO = Path(__file__).resolve().parents[2]
SERVICE = "shop"
TERMINAL = frozenset({"promoted", "rolled_back", "aborted"})
POLL_SEC = 0.2
USER = "e2e"


def canary_command() -> list[str]:
    """The `canary` console script of this environment (the module if it is missing)."""
    script = Path(sys.executable).with_name("canary")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "controlplane.cli.main"]


# ------------------------------------------------------------ the rule and the trail

THRESHOLD_MS = 300
MIN_SAMPLES = 50
# Upstreams answer in a lognormal around 50 ms (sigma 0.3): P95 about 80 ms. At x5
# the P95 is about 410 ms and a quarter of the answers are above 300 ms, against the
# 5 % a P95 bound allows, so the rule separates them by a wide margin either way.
RULE: dict[str, Any] = {
    "threshold_ms": THRESHOLD_MS,
    "percentile": 95,
    "window_sec": 5,
    "failure_ratio": 0.3,
    "cooldown_sec": 4,
    "min_samples": MIN_SAMPLES,
    "max_trips": 2,
    "half_open_weight": 1000,
    "action": "stop",
}
HOLD = 6


def kinds_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def controller_events(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and e["actor"] == "controller"]


def canary_window(event: dict[str, Any]) -> dict[str, Any]:
    """The canary's window numbers behind a decision."""
    window = event["payload"]["evidence"].get("window") or {}
    variants = window.get("variants") or {}
    canary: dict[str, Any] = variants.get("canary") or {}
    return canary


def is_subsequence(wanted: Sequence[object], seen: Sequence[object]) -> bool:
    it = iter(seen)
    return all(any(item == w for item in it) for w in wanted)


_GIVEN_PORTS: set[int] = set()


def new_port() -> int:
    """A free port not handed out before in this session: two calls of free_port() in a
    row may return the same one, as it is free again once probed."""
    while True:
        port = free_port()
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def reserve_ports(*ports: int) -> None:
    """Ports taken by other means (a test-owned etcd): new_port() never returns them."""
    _GIVEN_PORTS.update(ports)


_ACCESS_OK = re.compile(r'^INFO: +[\d.:]+ - "[A-Z]+ [^"]*" 2\d\d ')


class Proc:
    """One child process, its output in a file; stopped by its own pid only."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], logdir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.log_path = logdir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            log.write(f"--- start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    def wait_exit(self, timeout: float) -> int | None:
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no output file)"
        # the API's access log of successful polls says nothing: leave it out
        kept = [line for line in text.splitlines() if not _ACCESS_OK.search(line)]
        return "\n".join(kept[-lines:])


class Processes:
    """Every process a test started; `close()` ends them all, whatever happened."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> Proc:
        proc = Proc(name, argv, env, self.logdir)
        self.procs.append(proc)
        return proc.start()

    def close(self, grace: float = 8.0) -> None:
        """SIGTERM every live process, give them `grace` seconds together, then SIGKILL."""
        for proc in self.procs:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            if (
                proc.popen is not None
                and proc.wait_exit(max(deadline - time.monotonic(), 0.1)) is None
            ):
                proc.kill()
        for proc in self.procs:
            proc.kill()

    def report(self, lines: int = 40) -> str:
        parts = []
        for proc in self.procs:
            state = (
                "running"
                if proc.alive
                else f"exited {proc.popen.returncode if proc.popen else '-'}"
            )
            parts.append(
                f"===== {proc.name} (pid {proc.popen.pid if proc.popen else '-'}, {state})"
            )
            parts.append(proc.tail(lines))
        return "\n".join(parts)


async def poll(
    check: Callable[[], Awaitable[Any]],
    *,
    timeout: float,
    what: str,
    every: float = POLL_SEC,
    procs: list[Proc] | None = None,
) -> Any:
    """Await check() until it returns something truthy, or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        for proc in procs or ():
            if not proc.alive:
                raise AssertionError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        try:
            result = await check()
            if result:
                return result
        except (httpx.HTTPError, OSError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            note = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"not within {timeout:g} s: {what}{note}")
        await asyncio.sleep(every)


async def http_ok(client: httpx.AsyncClient, url: str) -> bool:
    response = await client.get(url)
    return response.status_code == 200


def metric_values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text → {(sample name, labels): value}."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return values


def metric(
    values: Mapping[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


@dataclass
class Upstream:
    proc: Proc
    port: int
    control: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_factor(self, factor: float) -> None:
        """Slow the upstream down (or restore it): it re-reads its control file."""
        staging = self.control.with_suffix(".new")
        staging.write_text(json.dumps({"factor": factor}))
        os.replace(staging, self.control)


@dataclass
class Collector:
    proc: Proc
    admin_port: int

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}/metrics"


@dataclass
class Serve:
    proc: Proc
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Stack:
    """A whole deployment on the real services, every part its own process."""

    procs: Processes
    env: dict[str, str]
    etcd_endpoint: str
    keys: EtcdKeys
    kv: KeyValueStore
    http: httpx.AsyncClient
    baseline: Upstream
    canary: Upstream
    serves: list[Serve] = field(default_factory=list)
    collectors: list[Collector] = field(default_factory=list)
    sidecar: Proc | None = None
    sidecar_port: int = 0
    sidecar_admin: int = 0
    log_port: int = 0
    load: LoadGenerator | None = None
    routes: RouteLog | None = None
    # what users' requests go through: our sidecar, or NGINX / HAProxy steered by an
    # agent (`canary router …`); `sidecar` is then the agent, whose /metrics carry the
    # same sample figures under canary_router_*
    front: str = "sidecar"
    proxy: Proc | None = None

    # ----------------------------------------------------------------- starting

    def start_serve(self, index: int) -> Serve:
        port = new_port()
        proc = self.procs.start(
            f"serve-{index}",
            [*canary_command(), "serve", "--listen", f"127.0.0.1:{port}"],
            self.env,
        )
        serve = Serve(proc, port)
        self.serves.append(serve)
        return serve

    def start_collector(self, index: int) -> Collector:
        port = new_port()
        proc = self.procs.start(
            f"collector-{index}",
            [*canary_command(), "collector", "--admin", f"127.0.0.1:{port}",
             "--name", f"collector-{index}", "--claim-idle-ms", "2000"],
            self.env,
        )  # fmt: skip
        collector = Collector(proc, port)
        self.collectors.append(collector)
        return collector

    def start_sidecar(self) -> None:
        self.sidecar_port, self.sidecar_admin = new_port(), new_port()
        self.sidecar = self.procs.start(
            "sidecar",
            [*canary_command(), "sidecar", "--service", SERVICE,
             "--listen", f"127.0.0.1:{self.sidecar_port}",
             "--admin", f"127.0.0.1:{self.sidecar_admin}",
             "--default-upstream", self.baseline.url],
            self.env,
        )  # fmt: skip

    def start_front(self, workdir: Path) -> None:
        if self.front == "sidecar":
            self.start_sidecar()
        elif self.front in ("nginx", "haproxy"):
            self.start_router(self.front, workdir)
        else:
            raise AssertionError(f"unknown front {self.front!r}")

    def router_args(self, kind: str, workdir: Path) -> list[str]:
        common = ["--service", SERVICE, "--listen", f"127.0.0.1:{self.sidecar_port}",
                  "--admin", f"127.0.0.1:{self.sidecar_admin}",
                  "--log-listen", f"127.0.0.1:{self.log_port}", "--allow-force"]  # fmt: skip
        if kind == "haproxy":
            return [*canary_command(), "router", "haproxy", *common,
                    "--socket", str(workdir / "haproxy.sock"),
                    "--map", str(workdir / "route.map")]  # fmt: skip
        return [*canary_command(), "router", "nginx", *common,
                "--conf-dir", str(workdir / "conf.d"),
                "--nginx-conf", str(workdir / "nginx.conf"),
                "--status-listen", f"127.0.0.1:{new_port()}"]  # fmt: skip

    def start_router(self, kind: str, workdir: Path) -> None:
        """The proxy from the config the agent prints (as an operator starts it), then
        the agent beside it."""
        self.sidecar_port, self.sidecar_admin, self.log_port = new_port(), new_port(), new_port()
        root = workdir / kind
        root.mkdir(parents=True, exist_ok=True)
        args = self.router_args(kind, root)
        printed = subprocess.run(
            [*args, "--print-config"], env=self.env, cwd=REPO, capture_output=True, timeout=60
        )
        assert printed.returncode == 0, printed.stderr.decode(errors="replace")
        if kind == "haproxy":
            (root / "haproxy.cfg").write_bytes(printed.stdout)
            (root / "route.map").write_text("")
            argv = ["/usr/sbin/haproxy", "-f", str(root / "haproxy.cfg"), "-db"]
        else:
            (root / "conf.d").mkdir(exist_ok=True)
            (root / "nginx.conf").write_bytes(printed.stdout)
            argv = ["/usr/sbin/nginx", "-p", str(root), "-c", str(root / "nginx.conf"),
                    "-g", "daemon off;"]  # fmt: skip
        self.proxy = self.procs.start(kind, argv, self.env)
        self.sidecar = self.procs.start(f"router-{kind}", args, self.env)

    def sample_metric(self, name: str) -> str:
        prefix = "canary_sidecar" if self.front == "sidecar" else "canary_router"
        return f"{prefix}_{name}"

    async def router_status(self) -> dict[str, Any]:
        response = await self.http.get(f"http://127.0.0.1:{self.sidecar_admin}/status")
        assert response.status_code == 200, response.text
        status: dict[str, Any] = response.json()
        return status

    async def wait_in_force(self, experiment_id: int, timeout: float = 15.0) -> None:
        """Until the proxy itself holds a route of the experiment (a router front)."""

        async def held() -> bool:
            status = await self.router_status()
            in_force = status.get("in_force") or {}
            return bool(status["in_step"]) and in_force.get("experiment") == str(experiment_id)

        await poll(held, timeout=timeout, what=f"experiment {experiment_id}'s route in force",
                   procs=[p for p in (self.proxy, self.sidecar) if p is not None])

    async def wait_ready(self, timeout: float = 60.0) -> None:
        urls = [(s.proc, f"{s.url}/readyz") for s in self.serves]
        urls += [(c.proc, f"http://127.0.0.1:{c.admin_port}/readyz") for c in self.collectors]
        if self.sidecar is not None:
            urls.append((self.sidecar, f"http://127.0.0.1:{self.sidecar_admin}/readyz"))
        for proc, url in urls:
            await poll(
                partial(http_ok, self.http, url),
                timeout=timeout,
                what=f"{proc.name} ready ({url})",
                procs=[proc],
            )

    # --------------------------------------------------------------------- API

    def live_api(self) -> str:
        for serve in self.serves:
            if serve.proc.alive:
                return serve.url
        raise AssertionError("no `canary serve` process is alive")

    async def api(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        response = await self.http.request(
            method, f"{self.live_api()}{path}", json=body, params=params or None,
        )  # fmt: skip
        assert response.status_code < 400, (
            f"{method} {path}: {response.status_code} {response.text}"
        )
        return response.json() if response.content else None

    async def put_rule(self, rule: dict[str, Any], timeout: float = 15.0) -> None:
        """PUT the rule, then wait until the controller's leader has published it (the
        API commits it to SQL; the collectors and the controller read it from etcd)."""
        answer = await self.api("PUT", f"/v1/services/{SERVICE}/rule", rule)
        async with asyncio.timeout(timeout):
            while answer["applied"] is not True:
                await asyncio.sleep(0.05)  # the leader's pass follows the commit
                answer = await self.api("GET", f"/v1/services/{SERVICE}/rule")

    async def create_and_start(self, name: str, steps: list[tuple[float, int]]) -> int:
        created = await self.api("POST", "/v1/experiments", {
            "name": name,
            "service": SERVICE,
            "variants": {"baseline": {"upstream": self.baseline.url},
                         "canary": {"upstream": self.canary.url}},
            "steps": [{"weight_pct": w, "hold_sec": h} for w, h in steps],
            "sticky": {"header": "x-user-id"},
        })  # fmt: skip
        experiment_id = int(created["id"])
        await self.api("POST", f"/v1/experiments/{experiment_id}/start", {"reason": "e2e"})
        return experiment_id

    async def experiment(self, experiment_id: int) -> dict[str, Any]:
        data: dict[str, Any] = await self.api("GET", f"/v1/experiments/{experiment_id}")
        return data

    async def events(self, experiment_id: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            page = await self.api(
                "GET", f"/v1/experiments/{experiment_id}/events", limit=500, offset=len(items)
            )
            items += page["items"]
            if len(items) >= page["total"] or not page["items"]:
                return items

    async def run_to_end(
        self,
        experiment_id: int,
        *,
        timeout: float,
        on_poll: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """Poll the experiment until it ends; on_poll sees every state read."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                data = await self.experiment(experiment_id)
            except (httpx.HTTPError, AssertionError):
                # a serve replica killed or restarting: ask again (live_api picks another)
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(POLL_SEC)
                continue
            if on_poll is not None:
                await on_poll(data)
            if data["state"] in TERMINAL:
                return data
            assert time.monotonic() < deadline, (
                f"experiment {experiment_id} did not end within {timeout:g} s: "
                f"state {data['state']}, step {data['current_step']}, "
                f"breaker {data['breaker_state']}, canary {data['canary_weight_bp']} bp"
            )
            await asyncio.sleep(POLL_SEC)

    # ------------------------------------------------------------------- etcd

    async def route(self) -> Route | None:
        item = await self.kv.get(self.keys.route(SERVICE))
        return parse_route(item.value) if item else None

    async def follow_routes(self) -> RouteLog:
        """Record every route written for the service from now on (an etcd watch)."""
        self.routes = RouteLog(self.kv, self.keys, SERVICE)
        await self.routes.start()
        return self.routes

    async def election(self) -> KeyValue | None:
        return await self.kv.get(self.keys.election)

    # ------------------------------------------------------------------- load

    def start_load(self, rate: float = 150.0) -> LoadGenerator:
        self.load = LoadGenerator(
            "127.0.0.1", self.sidecar_port, rate=rate, users=5_000, timeout=10.0, seed=11
        )
        self.load.start()
        return self.load

    # ---------------------------------------------------------------- samples

    async def sidecar_samples(self) -> dict[str, float]:
        text = (await self.http.get(f"http://127.0.0.1:{self.sidecar_admin}/metrics")).text
        values = metric_values(text)
        return {
            "sent": metric(values, self.sample_metric("samples_total"), fate="sent"),
            "dropped": metric(values, self.sample_metric("samples_total"), fate="dropped"),
            "buffered": metric(values, self.sample_metric("samples_buffered")),
            "batches_buffered": metric(values, self.sample_metric("sample_batches_buffered")),
        }

    async def collector_samples(self) -> dict[str, float]:
        """Samples the live collectors counted, summed over them."""
        total = {"ingested": 0.0, "late": 0.0, "duplicate_batches": 0.0}
        for collector in self.collectors:
            if not collector.proc.alive:
                continue
            values = metric_values((await self.http.get(collector.metrics_url)).text)
            total["ingested"] += metric(values, "canary_collector_samples_ingested_total")
            total["late"] += metric(values, "canary_collector_samples_late_total")
            total["duplicate_batches"] += metric(values, "canary_collector_batches_duplicate_total")
        return total

    async def stop_load_and_flush(self, timeout: float = 30.0) -> dict[str, float]:
        """Stop the load and wait until the sidecar has sent every sample it buffered."""
        if self.load is not None:
            await self.load.stop()

        async def flushed() -> dict[str, float] | None:
            s = await self.sidecar_samples()
            return s if s["buffered"] == 0 and s["batches_buffered"] == 0 else None

        sent: dict[str, float] = await poll(
            flushed, timeout=timeout, what="the sidecar's sample buffer empty"
        )
        return sent

    async def quiesce_samples(
        self, timeout: float = 30.0
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Stop the load, let the sidecar flush and the collectors catch up.

        Returns the sidecar's and the collectors' counters once the collectors have
        accounted for as many samples as the sidecar sent, or at the deadline.
        """
        sent = await self.stop_load_and_flush(timeout)

        async def caught_up() -> bool:
            c = await self.collector_samples()
            return c["ingested"] + c["late"] >= sent["sent"]

        with contextlib.suppress(AssertionError):  # the caller compares the numbers
            await poll(caught_up, timeout=timeout, what="the collectors caught up")
        return await self.sidecar_samples(), await self.collector_samples()


Launch = Callable[..., Awaitable[Stack]]
