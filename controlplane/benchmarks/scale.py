"""`canary bench scale`: what N running experiments cost the control plane, on one machine.

For N running experiments (one service each; N = 10, 100, 1,000, or 10 and 100 with
`--quick`) on real Redis, etcd and SQLite: simulated sidecars write signed sample
batches (the sidecar's codec and signature) to the services' streams, a `canary
collector` process consumes them, the controller evaluates. Measured at each N:

- `tick`: one controller round (`Controller.evaluate_all`), wall and CPU time, per
  round and per experiment; beside it the same rounds one by one (a Redis read per
  experiment and window, a transaction per decision: `batched_round=False`, the way
  before decision 0031), in turn with them, as the same-run reference;
- `collector`: CPU seconds per million samples (its /proc figures over the ingest of
  a fixed number of samples, with the partial windows it published meanwhile), and
  CPU per experiment and second under a steady feed of FEED_SAMPLES a second to every
  experiment (a process of its own, `scale_feed.py`);
- `redis`: bytes per running experiment (MEMORY USAGE of its stats hash, and of its
  samples stream) after the ingest, and (`steady`) with its window full of the
  steady feed;
- `trip`: among N experiments fed healthy samples, one canary turns bad: time from
  its first bad batch to the trip committed in SQL, and to the route with no canary
  weight in force in a sidecar's route table (watching etcd); meanwhile the leading
  loop's lag, and `canary serve --admin`'s /healthz and /metrics latency for the
  leader (`leader_admin`, answered from a thread while the rounds run);
- `several`: with `ScaleRun.collectors` collector processes sharing the streams (the
  first one and others started then), the steady feed's CPU (summed over them) and
  publishes, and a trip of another experiment, the leader running throughout.

`--only` narrows a run (`narrowed`): the N to run (`1000`, `100,1000`), `watch` for
the fan-out (left out otherwise), `collectors=K` for the second pass (1: none).
`--replicas 1,4` runs instead the replicas dimension (`scale_replicas.py`): N = 4,000
(400 with `--quick`, or `--only`'s numbers) judged by each count of sharded replica
processes on PostgreSQL.

For M = 100, 1,000 simulated sidecars (100 with `--quick`), each with its own etcd
client and route watch (what a sidecar process has), split over two processes:
`watch`: time from a route's put to applied, in every watcher (P50, P99, max), and
the watchers' CPU per route applied.

`growth` holds every per-unit figure at each N over its value at the smallest N: a
cost linear in N keeps its per-unit figure flat (ratio ≈ 1); a ratio growing with N
is a cost growing faster than N. The machine is shared: the load average is
recorded, and the per-unit CPU figures are the robust ones.

URLs: CANARY_BENCH_REDIS (default redis://127.0.0.1:6379/0) and CANARY_BENCH_ETCD
(default http://127.0.0.1:2379); a Redis namespace and an etcd prefix of its own,
removed afterwards; SQLite in a temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from controlplane.benchmarks.children import stop_child

if TYPE_CHECKING:
    from controlplane.controller.runner import Controller
    from controlplane.kernel.admin_thread import AdminThread
    from controlplane.kernel.sample_auth import SampleSigner
    from controlplane.kernel.streams import SampleStream
    from controlplane.runtime import Backends

# the ticker and the leader run in this process: `canary bench` sets the garbage
# collector's policy `canary serve` runs them with (decision 0071); the collector
# process sets its own
HOSTS_LONG_RUNNING_PARTS = True
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
DEFAULT_ETCD = "http://127.0.0.1:2379"
SIZES = (10, 100, 1000)
QUICK_SIZES = (10, 100)
WATCHERS = (100, 1000)
QUICK_WATCHERS = (100,)
WATCHER_PROCESSES = 2
STREAM_MAXLEN = 10_000
BATCH = 512
THRESHOLD_MS = 250.0
WINDOW_SEC = 10
CANARY_EVERY = 10  # one sample in ten to the canary: the first step's 10 %
KID = "bench"
IN_FLIGHT = 16
TRIP_TIMEOUT_SEC = 300.0
FEED_SAMPLES = 50  # per experiment and second in the steady feed
SPARSE_FEED_SAMPLES = 1  # the steady feed's second rate: a sample a second
SPARSE_SPAN_SEC = 6.0
PROBE_EVERY_SEC = 0.05
PROBE_TIMEOUT_SEC = 5.0
SEVERAL_COLLECTORS = 2


@dataclass(frozen=True)
class ScaleRun:
    """How much of each part a run does."""

    sizes: tuple[int, ...]
    watchers: tuple[int, ...]
    ingest_samples: int  # per N, spread over its experiments
    tick_rounds: int
    warm_sec: float
    trips: int
    route_puts: int
    # after the figures of one collector, the steady feed and a trip again with this
    # many collector processes sharing the streams (1: not run)
    collectors: int = 1


FULL = ScaleRun(SIZES, WATCHERS, 1_000_000, 20, float(WINDOW_SEC), 5, 20, SEVERAL_COLLECTORS)
QUICK = ScaleRun(QUICK_SIZES, QUICK_WATCHERS, 200_000, 6, 3.0, 3, 10, SEVERAL_COLLECTORS)
MAX_SIZE = 10_000
MAX_COLLECTORS = 8


def narrowed(plan: ScaleRun, only: str) -> ScaleRun:
    """`plan` cut to the parts `--only` names (pure): numbers are the N to run, `watch`
    the watch fan-out, `collectors=K` the collectors of the second pass. Without a
    number every N of the plan runs; without `watch` none of the fan-out."""
    sizes: list[int] = []
    watch = False
    collectors = plan.collectors
    for token in (t.strip() for t in only.split(",")):
        if token == "watch":
            watch = True
        elif token.startswith("collectors="):
            collectors = _bounded(token.removeprefix("collectors="), MAX_COLLECTORS, token)
        elif token:
            sizes.append(_bounded(token, MAX_SIZE, token))
    return replace(
        plan,
        sizes=tuple(sizes) or plan.sizes,
        watchers=plan.watchers if watch else (),
        collectors=collectors,
    )


def _bounded(text: str, limit: int, token: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= limit:
        raise ValueError(
            f"scale --only: {token!r} is none of N (1..{MAX_SIZE}), watch, "
            f"collectors=K (1..{MAX_COLLECTORS})"
        )
    return int(text)


# --- figures --------------------------------------------------------------------------


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(_quantile(values, 0.5) * 1000, 2),
        "p95_ms": round(_quantile(values, 0.95) * 1000, 2),
        "p99_ms": round(_quantile(values, 0.99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def _cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def growth(per_n: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each per-unit figure at every N over its value at the smallest N (pure)."""
    sizes = sorted(per_n)
    table: dict[str, dict[str, float]] = {}
    if not sizes:
        return table
    for name in per_n[sizes[0]]:
        base = per_n[sizes[0]][name]
        if not base:
            continue
        table[name] = {str(n): round(per_n[n][name] / base, 3) for n in sizes if name in per_n[n]}
    return table


# --- simulated sidecars -----------------------------------------------------------------


def _service(i: int) -> str:
    return f"svc-{i:04d}"


@dataclass
class Sidecars:
    """Sample batches as the sidecars of N services send them: the real codec and
    signature, one source per service, sequence numbers that grow."""

    streams: SampleStream
    signer: SampleSigner
    tag: str = "sidecar"
    seq: dict[str, int] = field(default_factory=dict)
    rng: Any = field(default_factory=lambda: __import__("numpy").random.default_rng(31))

    def entry(
        self, service: str, experiment: str, n: int, now: float, *, bad: bool = False,
        span: float = 0.5,
    ) -> dict[str, bytes]:
        """A signed batch of `n` samples stamped over the `span` seconds before `now`."""
        import numpy as np

        from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields

        canary = np.arange(n) % CANARY_EVERY == 0
        rt = self.rng.lognormal(math.log(40_000), 0.5, n).astype(np.int64)
        outcomes = np.full(n, 200)
        if bad:
            rt[canary] = 2_000_000
            outcomes[canary] = 503
        builder = BatchBuilder()
        builder.add_columns(
            (now - span + span * np.arange(n) / n).tolist(),
            ["canary" if c else "baseline" for c in canary.tolist()],
            rt.tolist(), outcomes.tolist(),
            (self.rng.integers(1, 2**32, n)).tolist(), (rt // 4).tolist(),
        )  # fmt: skip
        seq = self.seq[service] = self.seq.get(service, 0) + 1
        fields = entry_fields(BatchMeta(experiment, f"{self.tag}-{service}", seq, n),
                              builder.encode())  # fmt: skip
        return self.signer.sign(service, fields)

    async def send(self, entries: list[tuple[str, dict[str, bytes]]]) -> None:
        """Append each (service, entry), IN_FLIGHT at a time, as many sidecars would
        (within the client's connection pool)."""
        for i in range(0, len(entries), IN_FLIGHT):
            await asyncio.gather(*(
                self.streams.append(service, [entry], maxlen=STREAM_MAXLEN)
                for service, entry in entries[i : i + IN_FLIGHT]
            ))  # fmt: skip


# --- one N ------------------------------------------------------------------------------


@dataclass
class Rig:
    n: int
    backends: Backends
    experiments: list[tuple[str, str]]  # (experiment id, service)
    sidecars: Sidecars
    namespace: str
    prefix: str
    sample_keys: str
    collector: subprocess.Popen[bytes] | None = None
    # the second pass's other collectors, each with its admin port
    others: list[tuple[subprocess.Popen[bytes], int]] = field(default_factory=list)


async def _create(
    backends: Backends, n: int, progress: bool, first: int = 0
) -> list[tuple[str, str]]:
    """Experiments `first`..`first + n - 1`, each on its service, running."""
    from controlplane.experiments.actions import apply_action, create_experiment
    from controlplane.experiments.lifecycle import LifecycleAction
    from controlplane.experiments.store import ExperimentSpec, StepSpec

    rules = [
        (_service(i), json.dumps({
            "service": _service(i), "threshold_ms": THRESHOLD_MS, "window_sec": WINDOW_SEC,
            "min_samples": 50, "consecutive_breaches": 2, "cooldown_sec": 3600,
        }).encode())
        for i in range(first, first + n)
    ]  # fmt: skip
    await asyncio.gather(*(backends.kv.put(backends.keys.rule(s), rule) for s, rule in rules))
    made = []
    for i in range(first, first + n):
        spec = ExperimentSpec(
            name=f"scale {i}", service=_service(i),
            baseline_upstream="http://127.0.0.1:9001", canary_upstream="http://127.0.0.1:9002",
            steps=(StepSpec(1000, 86_400), StepSpec(10_000, 86_400)),
            sticky_header="x-user-id", sticky_cookie=None, rule=None,
        )  # fmt: skip
        record = await create_experiment(
            store=backends.store, clock=backends.clock, spec=spec, actor="bench"
        )
        await apply_action(
            store=backends.store, changes=backends.route_changes, clock=backends.clock,
            experiment_id=record.id, action=LifecycleAction.START, actor="bench",
        )  # fmt: skip
        made.append((str(record.id), spec.service))
        if progress and (i + 1) % 250 == 0:
            print(f"  {i + 1}/{n} experiments", file=sys.stderr)
    return made


def _start_collector(rig: Rig, redis: str, etcd: str, admin: int) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, CANARY_REDIS_URL=redis, CANARY_REDIS_NAMESPACE=rig.namespace,
        CANARY_ETCD=etcd, CANARY_ETCD_PREFIX=rig.prefix, CANARY_SAMPLE_KEYS=rig.sample_keys,
    )  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "collector", "--admin",
         f"127.0.0.1:{admin}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def _wait_ready(admin: int, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"http://127.0.0.1:{admin}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError("the collector was not ready within a minute")


async def _drained(rig: Rig, redis: Any, timeout: float = 300.0) -> None:
    """Until every stream's group has read and acked everything (acks follow the
    publish that counts the entries)."""
    keys = [rig.backends.redis_keys.samples(service) for _, service in rig.experiments]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.xinfo_groups(key)
            replies = await pipe.execute()
        if all(g and g[0]["lag"] == 0 and g[0]["pending"] == 0 for g in replies):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the collector did not drain the streams in time")


async def _publishes(admin: int) -> int:
    """The collector's count of published partial windows (its /metrics)."""
    return int((await _collector_counters(admin))[0])


async def _collector_counters(admin: int) -> tuple[float, float]:
    """The collector's published partial windows and their bytes (its /metrics).

    A generous timeout: the figure must not be lost to a slow answer, which the
    admin latency below measures on its own."""
    import httpx

    async with httpx.AsyncClient(timeout=30.0) as client:
        text = (await client.get(f"http://127.0.0.1:{admin}/metrics")).text
    publishes = published = 0.0
    for line in text.splitlines():
        if line.startswith("canary_collector_publishes_total "):
            publishes = float(line.split()[1])
        elif line.startswith("canary_collector_published_bytes_total "):
            published = float(line.split()[1])
    return publishes, published


class AdminProbe:
    """The admin endpoints' /healthz and /metrics asked in turn every PROBE_EVERY_SEC
    while they work: each answer's latency (a probe unanswered within
    PROBE_TIMEOUT_SEC counts as that long, and as missed), both together and each
    path's own. Asked from a process of its own (`admin_probe`), as a kubelet or
    Prometheus asks: a thread of this process, which runs the leader's rounds, waited
    for its GIL at every send and receive."""

    def __init__(self, admins: Sequence[int]) -> None:
        command = [sys.executable, "-m", "controlplane.benchmarks.admin_probe",
                   str(PROBE_EVERY_SEC), str(PROBE_TIMEOUT_SEC), *map(str, admins)]  # fmt: skip
        self._child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    async def figures(self) -> dict[str, Any]:
        try:
            out, _ = await asyncio.to_thread(
                self._child.communicate, "", PROBE_TIMEOUT_SEC * 4
            )
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
            raise RuntimeError("the admin probe did not report after its stdin closed") from None
        if self._child.returncode != 0:
            raise RuntimeError(f"the admin probe exited with {self._child.returncode}")
        found = json.loads(out)
        by_path: dict[str, list[float]] = found["latencies"]
        every = [one for took in by_path.values() for one in took]
        paths = {path: _ms(took) for path, took in by_path.items() if took}
        return {**(_ms(every) if every else {}), "missed": found["missed"],
                "by_path": paths}  # fmt: skip


class LoopLag:
    """How late this process's event loop runs a timer of PROBE_EVERY_SEC: what any
    endpoint it served (the API's /healthz and /metrics beside the controller) would
    wait for its turn."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(PROBE_EVERY_SEC)
            self.lags.append(max(0.0, time.perf_counter() - began - PROBE_EVERY_SEC))

    async def figures(self) -> dict[str, float]:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return _ms(self.lags) if self.lags else {}


async def _ingest(rig: Rig, redis: Any, samples: int, admin: int) -> dict[str, float]:
    """A fixed number of samples over every experiment: collector CPU per million.

    The figure holds the publishing of each experiment's partial window (every tick
    while its samples come), a cost per experiment rather than per sample: the
    publishes are counted beside it."""
    assert rig.collector is not None
    publishes = await _publishes(admin)
    per_experiment = max(1, samples // rig.n)
    batches = [
        (experiment, service, min(BATCH, per_experiment - done))
        for experiment, service in rig.experiments
        for done in range(0, per_experiment, BATCH)
    ]
    total = per_experiment * rig.n
    cpu = _cpu_seconds(rig.collector.pid)
    began = time.perf_counter()
    for i in range(0, len(batches), 200):
        now = time.time()  # encoded as they go, so no sample arrives late
        await rig.sidecars.send([
            (service, rig.sidecars.entry(service, experiment, n, now))
            for experiment, service, n in batches[i : i + 200]
        ])  # fmt: skip
    await _drained(rig, redis)
    wall = time.perf_counter() - began
    cpu = _cpu_seconds(rig.collector.pid) - cpu
    return {
        "samples": total,
        "publishes": await _publishes(admin) - publishes,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cpu_s_per_million_samples": round(cpu / total * 1e6, 3),
    }


async def _redis_memory(rig: Rig, redis: Any) -> dict[str, float]:
    keys = rig.backends.redis_keys
    async with redis.pipeline(transaction=False) as pipe:
        for experiment, service in rig.experiments:
            pipe.memory_usage(keys.stats(experiment), samples=0)
            pipe.memory_usage(keys.samples(service), samples=0)
        sizes = await pipe.execute()
    stats = [s or 0 for s in sizes[0::2]]
    streams = [s or 0 for s in sizes[1::2]]
    return {
        "stats_bytes_per_experiment": round(statistics.fmean(stats)),
        "stream_bytes_per_service": round(statistics.fmean(streams)),
    }


class Steady:
    """The collectors' CPU (summed over `pids`) over a span of the steady feed
    (FEED_SAMPLES a second to every experiment), per experiment and second; and per
    partial window published (`publishes`: their count at the start), the figure a
    loaded machine does not cap: a collector short of CPU publishes less, so its CPU
    per second stays flat, but each publish costs what it costs. Collectors that keep
    up publish about N a second together (each experiment gets a batch a second)."""

    def __init__(
        self,
        rig: Rig,
        pids: Sequence[int],
        publishes: float,
        published_bytes: float = 0.0,
        samples: int = FEED_SAMPLES,
    ) -> None:
        self.rig = rig
        self.pids = list(pids)
        self.cpu = self._cpu()
        self.publishes = publishes
        self.published_bytes = published_bytes
        self.samples = samples
        self.began = time.perf_counter()

    def _cpu(self) -> float:
        return sum(_cpu_seconds(pid) for pid in self.pids)

    def figures(self, publishes: float, published_bytes: float = 0.0) -> dict[str, float]:
        cpu = self._cpu() - self.cpu
        span = time.perf_counter() - self.began
        published = max(1, publishes - self.publishes)
        sent = published_bytes - self.published_bytes
        return {"samples_per_experiment_s": self.samples,
                "cpu_s_per_s": round(cpu / span, 4),
                "cpu_ms_per_experiment_s": round(cpu / span / self.rig.n * 1000, 4),
                "publishes_per_s": round((publishes - self.publishes) / span, 2),
                "cpu_ms_per_publish": round(cpu / published * 1000, 4),
                "bytes_per_experiment_s": round(sent / span / self.rig.n, 1),
                "bytes_per_publish": round(sent / published, 1)}  # fmt: skip


async def _ticks(rig: Rig, controller: Controller, rounds: int) -> dict[str, Any]:
    """Rounds batched and one by one, in turn; before them, a term's first round with
    its history merges bounded and not."""
    from controlplane.history.recorder import RETAIN_PER_ROUND

    await controller.evaluate_all(rig.backends, None)  # warm: rule book, first parses
    # the first round of a term merges old history points: at most RETAIN_PER_ROUND
    # experiments' (decision 0031), then every one's, as before; the rounds after it
    # merge none (every experiment done within the last minute)
    first: dict[str, float] = {}
    for name, bound in (("bounded", RETAIN_PER_ROUND), ("all", rig.n)):
        controller.history.new_term()
        controller.history.retain_per_round = bound
        began = time.perf_counter()
        await controller.evaluate_all(rig.backends, None)
        first[name] = round((time.perf_counter() - began) * 1000, 2)
    figures: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    evaluations = controller.stats.evaluations

    async def timed(into: tuple[list[float], list[float]] | None) -> None:
        cpu = time.process_time()
        began = time.perf_counter()
        await controller.evaluate_all(rig.backends, None)
        if into is not None:
            into[0].append(time.perf_counter() - began)
            into[1].append(time.process_time() - cpu)

    for i in range(rounds * 2):
        batched = i % 2 == 0
        controller.batched_round = batched
        await timed(figures[batched])
    controller.batched_round = True
    evaluated = (controller.stats.evaluations - evaluations) / (rounds * 2)
    # what a leader keeping its tick pays: batched rounds one after another, the
    # first of them left out (it catches up on the one-by-one round before it)
    in_a_row: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds + 1):
        await timed(in_a_row if i else None)
    out: dict[str, Any] = {"rounds": rounds, "evaluated_per_round": evaluated,
                           "first_round_ms": {"retention_all": first["all"],
                                              "retention_bounded": first["bounded"]},
                           "decisions_applied": controller.stats.decisions_applied}  # fmt: skip
    for name, (wall, cpus) in (("batched", figures[True]), ("one_by_one", figures[False]),
                               ("batched_in_a_row", in_a_row)):  # fmt: skip
        out[name] = {
            "round_ms": round(statistics.median(wall) * 1000, 2),
            "rounds_per_s": round(1.0 / statistics.median(wall), 3),
            "round_cpu_ms": round(statistics.median(cpus) * 1000, 2),
            "ms_per_experiment": round(statistics.median(wall) * 1000 / rig.n, 4),
            "cpu_ms_per_experiment": round(statistics.median(cpus) * 1000 / rig.n, 4),
        }
    return out


async def _trips(
    rig: Rig, controller: Controller, chosen: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """One canary goes bad among N fed healthy: time to the trip in SQL and in a
    sidecar's route table. `controller` runs its loop (leading, reconciling)."""
    from controlplane.experiments.lifecycle import BreakerState
    from controlplane.kernel.alarms import Alarms
    from sidecar.routing import RouteTable, RouteWatcher

    backends = rig.backends
    sql_s: list[float] = []
    route_s: list[float] = []
    alarm_s: list[float] = []  # to the collector's alarm on the board (decision 0070)
    rounds: list[float] = []  # the leader's rounds from the first bad batch to the trip
    alarm_looks_before = controller.stats.alarm_looks
    trips_wall = time.time()
    lag = LoopLag()
    admin, beating = _leader_admin(controller)
    admin_probe = AdminProbe([admin.port])
    evaluations_before, trips_began = controller.stats.evaluations, time.perf_counter()
    for experiment, service in chosen:
        watcher = RouteWatcher(backends.kv, RouteTable(), service=service, prefix=rig.prefix)
        watcher.start()
        try:
            if not await watcher.wait_for(lambda r: r is not None, 60.0):
                raise RuntimeError(f"no route for {service} within a minute")
            began = time.perf_counter()
            evaluations = controller.stats.evaluations

            async def feed_bad(experiment: str = experiment, service: str = service) -> None:
                while True:
                    entry = rig.sidecars.entry(service, experiment, 200, time.time(), bad=True)
                    await rig.sidecars.send([(service, entry)])
                    await asyncio.sleep(0.1)

            bad = asyncio.create_task(feed_bad())
            routed = asyncio.create_task(watcher.wait_for(
                lambda r: r is not None and r.weight_of("canary") == 0, TRIP_TIMEOUT_SEC
            ))  # fmt: skip
            tripped = False
            alarmed = False
            wall_began = time.time()
            try:
                while not tripped:
                    if not alarmed and isinstance(backends.board, Alarms):
                        found, _ = await backends.board.alarms_since(wall_began)
                        if int(experiment) in found:
                            alarmed = True
                            alarm_s.append(time.perf_counter() - began)
                    async with backends.store.transaction() as tx:
                        row = await tx.load_experiment(experiment_id=int(experiment))
                    tripped = row.breaker_state is not BreakerState.CLOSED
                    if tripped:
                        sql_s.append(time.perf_counter() - began)
                        rounds.append((controller.stats.evaluations - evaluations) / rig.n)
                    elif time.perf_counter() - began > TRIP_TIMEOUT_SEC:
                        break  # counted as missed: the other figures stay
                    else:
                        await asyncio.sleep(0.05)
                if tripped and await routed:
                    route_s.append(time.perf_counter() - began)
            finally:
                bad.cancel()
                routed.cancel()
                for task in (bad, routed):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            await watcher.stop()
    span = time.perf_counter() - trips_began
    rounds_per_s = (controller.stats.evaluations - evaluations_before) / rig.n / span
    return {"trips": len(sql_s), "missed": len(chosen) - len(sql_s),
            "to_alarm": _ms(alarm_s) if alarm_s else None,
            "alarm_looks": controller.stats.alarm_looks - alarm_looks_before,
            # experiments a collector raised an alarm for within the last KEEP_SEC of
            # the trips: the chosen ones, and any raised in vain
            "alarmed_experiments": await _alarmed_since(backends, trips_wall),
            "to_sql": _ms(sql_s) if sql_s else None,
            "to_sidecar_route": _ms(route_s) if route_s else None,
            # trip by trip, in the order they ran: which one a slow figure was
            "each_ms": {"to_sql": [round(s * 1000, 1) for s in sql_s],
                        "to_sidecar_route": [round(s * 1000, 1) for s in route_s]},
            "leader_rounds_to_sql": round(statistics.median(rounds), 2) if rounds else None,
            "leader_rounds_per_s": round(rounds_per_s, 3),
            "leader_loop_lag": await lag.figures(),
            "leader_admin": await _stop_leader_admin(admin_probe, admin, beating)}


async def _alarmed_since(backends: Backends, since: float) -> int | None:
    from controlplane.kernel.alarms import Alarms

    if not isinstance(backends.board, Alarms):
        return None
    found, _ = await backends.board.alarms_since(since)
    return len(found)


def _leader_admin(controller: Controller) -> tuple[AdminThread, asyncio.Task[None]]:
    """`canary serve --admin`'s listener for the leader: its /healthz and /metrics
    answered from a thread while its rounds run on this loop."""
    from controlplane.api.admin_listener import serve_api_admin
    from controlplane.kernel.admin_thread import Heartbeat
    from controlplane.kernel.clock import SystemClock
    from controlplane.kernel.exposition import TextRegistry

    registry = TextRegistry()
    registry.register(controller.metrics_collector())
    registry.add_text(controller.metrics_text)
    heartbeat = Heartbeat(SystemClock())
    beating = asyncio.create_task(heartbeat.run())
    return serve_api_admin(registry, heartbeat, "127.0.0.1", 0, token=None), beating


async def _stop_leader_admin(
    probe: AdminProbe, admin: AdminThread, beating: asyncio.Task[None]
) -> dict[str, Any]:
    figures = await probe.figures()
    admin.stop()
    beating.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beating
    return figures


async def _one_size(
    n: int, plan: ScaleRun, redis_url: str, etcd: str, progress: bool
) -> dict[str, Any]:
    import redis.asyncio as aioredis

    from controlplane.controller.runner import Controller
    from controlplane.db import migrate
    from controlplane.kernel.sample_auth import SampleSigner
    from controlplane.kernel.sample_keys import parse_sample_keys
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import open_backends

    tag = secrets.token_hex(4)
    namespace, prefix = f"canary-bench-{tag}", f"/canary-bench-{tag}"
    sample_keys = f"{KID}:{secrets.token_hex(32)}"
    redis = aioredis.Redis.from_url(redis_url)
    feeder: subprocess.Popen[str] | None = None
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/scale.db"
        migrate.upgrade(url)
        settings = Settings(database_url=url, etcd=etcd, etcd_prefix=prefix,
                            redis_url=redis_url, redis_namespace=namespace)  # fmt: skip
        backends = await open_backends(settings)
        assert backends.streams is not None
        signer = SampleSigner(parse_sample_keys(sample_keys, origin="bench"))
        rig = Rig(n, backends, [], Sidecars(backends.streams, signer), namespace, prefix,
                  sample_keys)  # fmt: skip
        # the tick is measured on a controller that only evaluates (no loop running)
        ticker = Controller(identity=f"bench-ticker-{tag}")
        leader = Controller(identity=f"bench-{tag}")
        result: dict[str, Any] = {"n": n}
        try:
            began = time.perf_counter()
            rig.experiments = await _create(backends, n, progress)
            result["setup_s"] = round(time.perf_counter() - began, 2)
            admin = _free_port()
            rig.collector = _start_collector(rig, redis_url, etcd, admin)
            await _wait_ready(admin)
            result["collector"] = await _ingest(rig, redis, plan.ingest_samples, admin)
            result["redis"] = await _redis_memory(rig, redis)
            if progress:
                print(f"  ingest {result['collector']}, redis {result['redis']}",
                      file=sys.stderr)  # fmt: skip
            feeder = _start_feed(rig, redis_url)
            await ticker.open(backends)
            await asyncio.sleep(plan.warm_sec)  # the windows fill with the steady feed
            assert rig.collector is not None
            if progress:
                print(f"  collector pid {rig.collector.pid}", file=sys.stderr)
            probe = AdminProbe([admin])
            steady = Steady(rig, [rig.collector.pid], *await _collector_counters(admin))
            # fewer rounds at large N: each evaluates every experiment
            rounds = max(2, min(plan.tick_rounds, 400 // n))
            result["tick"] = await _ticks(rig, ticker, rounds)
            result["collector"]["steady"] = steady.figures(*await _collector_counters(admin))
            result["collector"]["admin"] = await probe.figures()
            # the window full of the steady feed: what a running experiment holds
            result["redis"]["steady"] = await _redis_memory(rig, redis)
            if progress:
                print(f"  tick {result['tick']}, steady {result['collector']['steady']}, "
                      f"admin {result['collector']['admin']}", file=sys.stderr)  # fmt: skip
            # the same feed at a sample a second: the cost that is per experiment
            _stop_feed(feeder)
            feeder = _start_feed(rig, redis_url, SPARSE_FEED_SAMPLES)
            await asyncio.sleep(plan.warm_sec)
            sparse = Steady(rig, [rig.collector.pid], *await _collector_counters(admin),
                            samples=SPARSE_FEED_SAMPLES)  # fmt: skip
            await asyncio.sleep(SPARSE_SPAN_SEC)
            result["collector"]["sparse"] = sparse.figures(*await _collector_counters(admin))
            _stop_feed(feeder)
            feeder = _start_feed(rig, redis_url)
            await asyncio.sleep(plan.warm_sec)
            if progress:
                print(f"  sparse {result['collector']['sparse']}", file=sys.stderr)
            await leader.start(backends)
            while not leader.stats.leader:
                await asyncio.sleep(0.05)
            result["trip"] = await _trips(rig, leader, rig.experiments[: plan.trips])
            if progress:
                print(f"  trip {result['trip']}", file=sys.stderr)
            if plan.collectors > 1:
                result["several"] = await _several(rig, leader, plan, redis_url, etcd, admin)
                if progress:
                    print(f"  {plan.collectors} collectors {result['several']}",
                          file=sys.stderr)  # fmt: skip
        finally:
            if feeder is not None:
                _stop_feed(feeder)
            await leader.stop()
            await ticker.stop()
            if rig.collector is not None:
                stop_child(rig.collector, 20.0)
            for other, _ in rig.others:
                stop_child(other, 20.0)
            await _clean(backends, redis, namespace, prefix)
            await backends.close()
            await redis.aclose()
    return result


async def _several(
    rig: Rig, leader: Controller, plan: ScaleRun, redis_url: str, etcd: str, admin: int
) -> dict[str, Any]:
    """The steady feed and a trip again (another experiment), with `plan.collectors`
    collector processes sharing the streams' consumer group: the first one's, the
    others started now. The steady span follows a warm span in which the new ones'
    partial windows fill; the leader keeps running its rounds throughout."""
    assert rig.collector is not None
    for _ in range(plan.collectors - 1):
        port = _free_port()
        rig.others.append((_start_collector(rig, redis_url, etcd, port), port))
        await _wait_ready(port)
    admins = [admin] + [port for _, port in rig.others]
    pids = [rig.collector.pid] + [proc.pid for proc, _ in rig.others]

    async def counters() -> tuple[float, float]:
        each = [await _collector_counters(port) for port in admins]
        return sum(c[0] for c in each), sum(c[1] for c in each)

    await asyncio.sleep(plan.warm_sec)
    probe = AdminProbe(admins)
    steady = Steady(rig, pids, *await counters())
    await asyncio.sleep(max(plan.warm_sec, float(WINDOW_SEC)))
    figures = steady.figures(*await counters())
    admin_figures = await probe.figures()
    chosen = rig.experiments[plan.trips : 2 * plan.trips]
    return {"collectors": plan.collectors, "steady": figures, "admin": admin_figures,
            "trip": await _trips(rig, leader, chosen)}  # fmt: skip


def _start_feed(
    rig: Rig, redis_url: str, samples: int = FEED_SAMPLES
) -> subprocess.Popen[str]:
    """The steady feed, in a process of its own (controlplane.benchmarks.scale_feed),
    so that the controller's CPU figures hold none of it."""
    feeder = subprocess.Popen(
        [sys.executable, "-m", "controlplane.benchmarks.scale_feed", redis_url, rig.namespace,
         str(samples)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, CANARY_SAMPLE_KEYS=rig.sample_keys),
    )  # fmt: skip
    assert feeder.stdin is not None
    feeder.stdin.write(json.dumps(rig.experiments) + "\n")
    feeder.stdin.flush()
    return feeder


def _stop_feed(feeder: subprocess.Popen[str]) -> None:
    assert feeder.stdin is not None
    with contextlib.suppress(OSError):
        feeder.stdin.close()  # its end of input is its stop
    try:
        feeder.wait(timeout=20)
    except subprocess.TimeoutExpired:
        feeder.kill()
        feeder.wait()


async def _clean(backends: Backends, redis: Any, namespace: str, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(match=f"{namespace}:*", count=1000)]
    for i in range(0, len(keys), 1000):
        await redis.delete(*keys[i : i + 1000])
    values, _ = await backends.kv.get_prefix(prefix + "/")
    await asyncio.gather(*(backends.kv.delete(v.key) for v in values))


# --- watch fan-out ----------------------------------------------------------------------


def _route(revision: int, canary_bp: int) -> bytes:
    return json.dumps({
        "experiment": 1, "revision": revision, "salt": "bench",
        "sticky": {"header": "x-user-id", "cookie": None},
        "variants": [
            {"name": "baseline", "upstream": "http://127.0.0.1:9001", "weight": 10_000 - canary_bp},
            {"name": "canary", "upstream": "http://127.0.0.1:9002", "weight": canary_bp},
        ],
        "state": "running",
    }).encode()  # fmt: skip


@contextlib.contextmanager
def _watcher_processes(
    etcd: str, prefix: str, service: str, m: int
) -> Iterator[list[subprocess.Popen[str]]]:
    shares = [m // WATCHER_PROCESSES + (1 if i < m % WATCHER_PROCESSES else 0)
              for i in range(WATCHER_PROCESSES)]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "controlplane.benchmarks.scale_watchers", etcd, prefix,
             service, str(share)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        for share in shares if share
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def _fan_out(m: int, puts: int, etcd: str) -> dict[str, Any]:
    from controlplane.kernel.kv_factory import open_kv

    prefix = f"/canary-bench-{secrets.token_hex(4)}"
    service = "fan-out"
    key = f"{prefix}/routes/{service}"
    kv = open_kv(etcd)
    try:
        await kv.put(key, _route(1, 0))
        with _watcher_processes(etcd, prefix, service, m) as procs:
            began = time.perf_counter()
            for proc in procs:
                assert proc.stdout is not None
                line = await asyncio.to_thread(proc.stdout.readline)
                if line.strip() != "ready":
                    raise RuntimeError(f"a watcher process did not get ready: {line!r}")
            ready_s = time.perf_counter() - began
            sent: dict[int, float] = {}
            for revision in range(2, puts + 2):
                sent[revision] = time.time()
                await kv.put(key, _route(revision, 100 * (revision % 2)))
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)
            reports = []
            for proc in procs:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("stop\n")
                proc.stdin.flush()
                reports.append(json.loads(await asyncio.to_thread(proc.stdout.readline)))
    finally:
        with contextlib.suppress(Exception):
            await kv.delete(key)
        await kv.close()
    delays: list[float] = []
    for report in reports:
        for revision, at in sent.items():
            delays += [t - at for t in report["applied"].get(str(revision), [])]
    expected = m * puts
    cpu = sum(float(r["cpu_s"]) for r in reports)
    return {
        "m": m,
        "puts": puts,
        "applied": len(delays),
        "missed": expected - len(delays),
        "ready_s": round(ready_s, 2),
        "put_to_applied": _ms(delays) if delays else None,
        "cpu_ms_per_watcher_update": round(cpu / expected * 1000, 4),
        "processes": len(reports),
    }


# --- the run ----------------------------------------------------------------------------


REPLICAS_SIZE = 4_000
QUICK_REPLICAS_SIZE = 400


def run(
    *, quick: bool, progress: bool, plan: ScaleRun | None = None, only: str | None = None,
    replicas: str | None = None,
) -> dict[str, Any]:
    if replicas is not None:
        # the replicas dimension alone (scale_replicas.py): N from --only's numbers
        from controlplane.benchmarks.scale_replicas import parse_replicas, run_replicas

        counts = parse_replicas(replicas)
        chosen = narrowed(replace(FULL, sizes=()), only).sizes if only else ()
        figures = run_replicas(
            sizes=chosen or ((QUICK_REPLICAS_SIZE,) if quick else (REPLICAS_SIZE,)),
            counts=counts, seconds=10.0 if quick else 30.0, progress=progress,
        )  # fmt: skip
        return {"benchmark": "scale", "quick": quick, "replicas": figures}
    plan = plan or (QUICK if quick else FULL)
    if only is not None:
        plan = narrowed(plan, only)
    redis = os.environ.get("CANARY_BENCH_REDIS", DEFAULT_REDIS)
    etcd = os.environ.get("CANARY_BENCH_ETCD", DEFAULT_ETCD)
    load_before = os.getloadavg()
    sizes: dict[int, dict[str, Any]] = {}
    for n in plan.sizes:
        if progress:
            print(f"N={n} experiments", file=sys.stderr)
        sizes[n] = asyncio.run(_one_size(n, plan, redis, etcd, progress))
    watch: dict[int, dict[str, Any]] = {}
    for m in plan.watchers:
        if progress:
            print(f"M={m} watchers", file=sys.stderr)
        try:
            watch[m] = asyncio.run(_fan_out(m, plan.route_puts, etcd))
        except (RuntimeError, OSError, ValueError) as exc:  # reported, the rest kept
            watch[m] = {"m": m, "error": f"{type(exc).__name__}: {exc}"}
            continue
    per_unit = {n: _per_unit(figures) for n, figures in sizes.items()}
    watch_units = {m: {
        "watch_cpu_ms_per_watcher_update": w["cpu_ms_per_watcher_update"],
        "watch_p99_ms": (w["put_to_applied"] or {}).get("p99_ms", 0.0),
    } for m, w in watch.items() if "error" not in w}  # fmt: skip
    return {
        "benchmark": "scale",
        "quick": quick,
        "cpus": os.cpu_count(),
        "load_avg": {"before": list(load_before), "after": list(os.getloadavg())},
        "sizes": {str(n): figures for n, figures in sizes.items()},
        "watch": {str(m): figures for m, figures in watch.items()},
        "per_unit": {str(n): figures for n, figures in per_unit.items()},
        "growth": growth(per_unit),
        "watch_growth": growth(watch_units),
        "settings": {"window_sec": WINDOW_SEC, "threshold_ms": THRESHOLD_MS,
                     "ingest_samples": plan.ingest_samples, "batch": BATCH,
                     "watcher_processes": WATCHER_PROCESSES,
                     "several_collectors": plan.collectors},
    }


def _per_unit(figures: dict[str, Any]) -> dict[str, float]:
    """The per-experiment and per-sample figures of one N: flat across N is linear."""
    tick = figures["tick"]
    several: dict[str, float] = {}
    if "several" in figures:
        several = {
            "several_collectors_steady_cpu_ms_per_experiment_s": figures["several"]["steady"][
                "cpu_ms_per_experiment_s"
            ],
            "several_collectors_trip_to_sql_p50_ms": (
                figures["several"]["trip"]["to_sql"] or {}
            ).get("p50_ms", 0.0),
        }
    return several | {
        "tick_ms_per_experiment": tick["batched"]["ms_per_experiment"],
        "tick_cpu_ms_per_experiment": tick["batched"]["cpu_ms_per_experiment"],
        "tick_in_a_row_cpu_ms_per_experiment": tick["batched_in_a_row"]["cpu_ms_per_experiment"],
        "tick_ms_per_experiment_one_by_one": tick["one_by_one"][
            "ms_per_experiment"
        ],
        "collector_cpu_s_per_million_samples": figures["collector"]["cpu_s_per_million_samples"],
        "collector_steady_cpu_ms_per_experiment_s": figures["collector"]["steady"][
            "cpu_ms_per_experiment_s"
        ],
        "collector_steady_cpu_ms_per_publish": figures["collector"]["steady"][
            "cpu_ms_per_publish"
        ],
        "collector_steady_bytes_per_experiment_s": figures["collector"]["steady"].get(
            "bytes_per_experiment_s", 0.0
        ),
        "collector_sparse_cpu_ms_per_experiment_s": figures["collector"]
        .get("sparse", {})
        .get("cpu_ms_per_experiment_s", 0.0),
        "collector_admin_p99_ms": figures["collector"].get("admin", {}).get("p99_ms", 0.0),
        "tick_rounds_per_s": tick["batched"].get("rounds_per_s", 0.0),
        "trip_to_sql_p95_ms": (figures["trip"]["to_sql"] or {}).get("p95_ms", 0.0),
        "leader_loop_lag_p99_ms": figures["trip"].get("leader_loop_lag", {}).get("p99_ms", 0.0),
        "redis_stats_bytes_per_experiment": figures["redis"]["steady"][
            "stats_bytes_per_experiment"
        ],
        "trip_to_sql_p50_ms": (figures["trip"]["to_sql"] or {}).get("p50_ms", 0.0),
        "trip_leader_rounds": figures["trip"]["leader_rounds_to_sql"] or 0.0,
    }
