"""Overload kept apart from judgment, end to end (docs/decisions/0025).

The real sidecar (in this process) with overload protection from etcd, in front of
two upstreams of fixed capacity; its samples and shed tallies go to the real Redis,
a real collector windows them, and the controller's decision is taken on the merged
snapshots it reads from Redis, as the controller loop takes it.

- Overload: more high-priority clients than the gates' limit, and low-priority ones.
  High priority queues and gets 200, low priority gets 429 with Retry-After. The
  canary is healthy but its admitted requests queue behind the overload, above the
  rule's bound: under `overload: hold` the breaker holds (the evidence names the shed
  counts and the hold), while the same snapshots judged under `overload: judge`
  trip it - the hold is what keeps it closed. Once the shedding stops the hold ends
  a window later (`overload_cleared`) and the looks are judged again.
- Control: no overload, a canary slow on its own: it trips under `overload: hold`.

Every assertion is on counts and states, none on how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from controlplane.benchmarks import capacity_upstream
from controlplane.collector.service import Collector
from controlplane.collector.sharding import read_merged_snapshots
from controlplane.decision import BreakerState, Decision, EventKind, RecordEvent, Step, decide
from controlplane.decision.rollout import start as start_rollout
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.overload import OverloadConfig
from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.streams import SampleStream, SnapshotBoard
from controlplane.kernel.streams_factory import open_streams
from sidecar.assignment import bucket
from sidecar.main import Sidecar
from sidecar.reporter import SampleReporter
from tests.conftest import ETCD

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(120)]

SERVICE = "orders"
SALT = "overload-salt"
CANARY_BP = 5000
STEPS = (Step(50, 3600),)  # one long step: nothing here is about advancing
RULE = BreakerRule(
    service=SERVICE,
    threshold_ms=100,
    percentile=95,
    window_sec=3,
    min_samples=20,
    consecutive_breaches=2,
    failure_ratio=0.3,
)
JUDGE = BreakerRule.model_validate({**RULE.model_dump(), "overload": "judge"})
# the gates' limit is pinned at 2: what is admitted, queued and shed follows the
# number of clients, not what a limit learned; low priority is shed from the light
# level on (one request in flight), and high priority queues until the severe level,
# which is out of reach; a standing queue keeps the long timeout and its order, so
# high priority waits its turn instead of being cut at CoDel's 5 ms (or served newest
# first: the clients just answered would go again at once and the others wait)
OVERLOAD = OverloadConfig(
    min_limit=2,
    max_limit=2,
    initial_limit=2,
    queue_size=100,
    queue_timeout_ms=10_000,
    queue_standing_timeout_ms=10_000,
    queue_standing_lifo=False,
    light_at=0.5,
    heavy_at=1.5,
    light_shed_share=1.0,
    severe_at=50.0,
    low_priority_paths=("/batch",),
    retry_after_s=2,
)
LOOKS = 8  # fresh looks judged while the condition under test holds
LOOK_SEC = 0.25  # the controller's tick


def users(variant: str, count: int, clients: int) -> list[list[str]]:
    """`count` user ids the route sends to `variant`, dealt to `clients` clients."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        user = f"user-{i}"
        if ("canary" if bucket(SALT, user) < CANARY_BP else "baseline") == variant:
            found.append(user)
        i += 1
    return [found[k::clients] for k in range(clients)]


@dataclass
class Answers:
    high: dict[int, int] = field(default_factory=dict)
    low: dict[int, int] = field(default_factory=dict)
    low_without_retry_after: int = 0

    def count(self, low: bool, response: httpx.Response) -> None:
        seen = self.low if low else self.high
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        if low and response.status_code == 429 and "retry-after" not in response.headers:
            self.low_without_retry_after += 1


@dataclass
class Stack:
    kv: KeyValueStore
    keys: EtcdKeys
    board: SnapshotBoard
    stream: SampleStream
    sidecar: Sidecar
    collector: Collector
    upstreams: dict[str, str]
    client: httpx.AsyncClient

    async def route(self, experiment: int, canary_upstream: str, revision: int) -> None:
        route = Route(
            experiment=experiment,
            revision=revision,
            salt=SALT,
            sticky=Sticky(header="x-user-id"),
            variants=two_way_variants(self.upstreams["baseline"], canary_upstream, CANARY_BP),
            state=RouteState.RUNNING,
        )
        await self.kv.put(self.keys.route(SERVICE), route.to_json().encode())
        assert await self.sidecar.watcher.wait_for(
            lambda r: r is not None and r.revision == revision, 10
        )

    def shed_counted(self) -> float:
        value = self.collector.metrics.registry.get_sample_value(
            "canary_collector_shed_total", {"service": SERVICE}
        )
        return value or 0.0


@pytest.fixture
async def stack(etcd_prefix: str, redis_url: str, redis_namespace: str) -> AsyncIterator[Stack]:
    keys = EtcdKeys(etcd_prefix)
    kv = open_kv(ETCD)
    stream, board = open_streams(redis_url, namespace=redis_namespace)
    servers = []
    upstreams = {}
    for name, concurrency, service_ms in (
        ("baseline", 20, 40.0),
        ("canary", 20, 40.0),
        ("slow_canary", 20, 150.0),
    ):
        server, _ = await capacity_upstream.start(0, concurrency, service_ms)
        servers.append(server)
        upstreams[name] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    await kv.put(keys.rule(SERVICE), RULE.to_json().encode())
    await kv.put(keys.overload(SERVICE), OVERLOAD.model_dump_json().encode())
    reporter = SampleReporter(stream, SERVICE, max_delay=0.02)
    sidecar = Sidecar(
        service=SERVICE, kv=kv, stream=stream, reporter=reporter, etcd_prefix=etcd_prefix
    )
    await sidecar.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    collector = Collector(
        stream, board, kv, keys, consumer_name="overload-e2e", clock=SystemClock(), tick=0.05
    )
    await collector.load_config()
    stop = asyncio.Event()
    running = asyncio.create_task(collector.run(stop))
    client = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{sidecar.proxy.port}",
        trust_env=False,
        timeout=15,
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
    )
    try:
        async with asyncio.timeout(10):
            while sidecar.proxy.overload is None:  # protection read from etcd
                await asyncio.sleep(0.01)
        yield Stack(kv, keys, board, stream, sidecar, collector, upstreams, client)
    finally:
        await client.aclose()
        await sidecar.stop()
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(running, 10)
        for server in servers:
            server.close()
        await stream.close()
        await kv.close()


@contextlib.asynccontextmanager
async def clients(
    stack: Stack, answers: Answers, high: list[list[str]], low: list[list[str]]
) -> AsyncIterator[None]:
    """Closed-loop clients, each going through its own users in turn: `high` on
    /orders, `low` on /batch. The low ones start once every gate queues high-priority
    requests, and stop before them. Many users, so the windows are judged per request
    (a handful of users would be judged on units, cluster-robust, and weakly)."""
    stop_high, stop_low = asyncio.Event(), asyncio.Event()

    async def one(pool: list[str], is_low: bool) -> None:
        path, stop = ("/batch", stop_low) if is_low else ("/orders", stop_high)
        turn = 0
        while not stop.is_set():
            user = pool[turn % len(pool)]
            turn += 1
            response = await stack.client.get(path, headers={"x-user-id": user})
            answers.count(is_low, response)
            if is_low:
                await asyncio.sleep(0.02)  # pacing of the load, not a wait for a result

    high_tasks = [asyncio.create_task(one(u, False)) for u in high]
    low_tasks: list[asyncio.Task[None]] = []
    try:
        if low:
            guard = stack.sidecar.proxy.overload
            assert guard is not None
            async with asyncio.timeout(15):
                while len(guard.gates) < 2 or any(
                    len(g.waiting) < 2 for g in guard.gates.values()
                ):
                    await asyncio.sleep(0.01)
            low_tasks = [asyncio.create_task(one(u, True)) for u in low]
        yield
    finally:
        stop_low.set()
        await asyncio.gather(*low_tasks)
        stop_high.set()
        await asyncio.gather(*high_tasks)


@dataclass
class Judged:
    hold: list[Decision] = field(default_factory=list)
    judge: list[Decision] = field(default_factory=list)


async def judge_looks(
    stack: Stack,
    experiment: int,
    ready: Callable[[dict[str, int]], bool],
    *,
    looks: int = LOOKS,
    until: Callable[[Judged], bool] | None = None,
    after: Judged | None = None,
    timeout: float = 40.0,
) -> Judged:
    """Decide on every fresh merged snapshot, as the controller does, under both
    overload policies side by side; `looks` decisions once `ready(counts)` holds for
    the snapshots (counts: canary samples, baseline shed, canary shed), or as many as
    it takes for `until(judged)`. `after`: go on from the states those looks left."""
    now = time.time()
    first = start_rollout(STEPS, now).new_state
    states = {"hold": first, "judge": first}
    last_ts = 0.0
    if after is not None:
        states = {"hold": after.hold[-1].new_state, "judge": after.judge[-1].new_state}
        last_ts = states["hold"].last_snapshot_ts or 0.0
    judged = Judged()
    deadline = time.monotonic() + timeout

    def done() -> bool:
        return until(judged) if until is not None else len(judged.hold) >= looks

    while not done():
        assert time.monotonic() < deadline, f"not done within {timeout} s: {judged}"
        await asyncio.sleep(LOOK_SEC)
        now = time.time()
        snaps = await read_merged_snapshots(
            stack.board, str(experiment), now, window_sec=RULE.window_sec
        )
        canary, baseline = snaps.get("canary"), snaps.get("baseline")
        if canary is None or baseline is None or canary.ts <= last_ts:
            continue
        counts = {
            "canary": canary.count,
            "baseline_shed": baseline.shed,
            "canary_shed": canary.shed,
        }
        if not ready(counts):
            continue
        last_ts = canary.ts
        for name, rule, out in (("hold", RULE, judged.hold), ("judge", JUDGE, judged.judge)):
            decision = decide(states[name], snaps, rule, STEPS, now)
            states[name] = decision.new_state
            out.append(decision)
    return judged


def events(decisions: list[Decision]) -> Iterator[RecordEvent]:
    for d in decisions:
        yield from (a for a in d.effects if isinstance(a, RecordEvent))


async def flushed(stack: Stack, shed_answers: int) -> None:
    """Every tally the sidecar holds is in Redis and the collector has counted it."""
    stack.sidecar.proxy.flush_samples()
    assert await stack.sidecar.reporter.flush()
    async with asyncio.timeout(15):
        while stack.shed_counted() < shed_answers:
            await asyncio.sleep(0.05)


async def test_overload_sheds_low_priority_and_holds_the_breaker(stack: Stack) -> None:
    await stack.route(41, stack.upstreams["canary"], revision=1)
    answers = Answers()
    # 2 high-priority clients per variant, the gates' limit, all along; during the
    # overload 4 more per variant (they queue, ~3 service times each) and 2
    # low-priority ones per variant, which are shed
    steady = users("baseline", 200, 2) + users("canary", 200, 2)
    surge = users("baseline", 300, 4) + users("canary", 300, 4)
    low = users("baseline", 100, 2) + users("canary", 100, 2)

    def overloaded(c: dict[str, int]) -> bool:
        return c["canary"] >= RULE.min_samples and c["baseline_shed"] > 0

    def cleared(j: Judged) -> bool:
        kinds = [e.kind for e in events(j.hold)]
        return EventKind.OVERLOAD_CLEARED in kinds and len(j.hold) > kinds.index(
            EventKind.OVERLOAD_CLEARED
        )

    async with clients(stack, answers, steady, []):
        async with clients(stack, answers, surge, low):
            judged = await judge_looks(stack, 41, overloaded)
        # the shedding stopped: the hold ends once the window no longer holds any
        after = await judge_looks(stack, 41, lambda c: True, until=cleared, after=judged)

    # high priority is served, low priority is shed with a Retry-After
    assert set(answers.high) == {200}, answers
    assert set(answers.low) == {429} and answers.low[429] > 0, answers
    assert answers.low_without_retry_after == 0

    # under overload: hold the breaker never trips; every look is held, with evidence
    assert all(d.new_state.breaker is BreakerState.CLOSED for d in judged.hold)
    assert [e.kind for e in events(judged.hold)] == [EventKind.OVERLOAD_HOLD]
    for d in judged.hold:
        assert d.evidence["window"]["verdict"] == "overloaded", d.evidence["window"]
        overload = d.evidence["overload"]
        assert overload["policy"] == "hold" and overload["held"] is True
        assert overload["variants"]["baseline"]["shed"] > 0
        assert 0 < overload["variants"]["baseline"]["shed_share"] < 1
        assert d.evidence["window"]["variants"]["canary"]["count"] >= RULE.min_samples
    # the same snapshots judged: the canary's queued requests are over the bound, and
    # it trips - the hold, not a healthy window, kept it closed
    assert any(d.new_state.breaker is BreakerState.OPEN for d in judged.judge), [
        d.reason for d in judged.judge
    ]
    tripped = next(e for e in events(judged.judge) if e.kind is EventKind.TRIPPED)
    evidence = tripped.payload["evidence"]
    assert evidence["overload"]["held"] is False
    assert evidence["overload"]["variants"]["baseline"]["shed"] > 0

    # the hold ended a window after the shedding, with its event, and judging resumed
    assert all(d.new_state.breaker is BreakerState.CLOSED for d in after.hold)
    assert [e.kind for e in events(after.hold)] == [EventKind.OVERLOAD_CLEARED]
    last = after.hold[-1]
    assert last.evidence["overload"]["held"] is False
    assert last.evidence["overload"]["variants"]["baseline"]["shed"] == 0
    assert last.evidence["window"]["verdict"] != "overloaded"

    # every 429 answered is one shed request counted by the collector, none a sample
    await flushed(stack, answers.low[429])
    assert stack.shed_counted() == answers.low[429]


async def test_a_slow_canary_trips_when_only_it_is_slow(stack: Stack) -> None:
    await stack.route(42, stack.upstreams["slow_canary"], revision=1)
    answers = Answers()
    # within the baseline's limit: nothing is shed there; the canary is slow on its own
    high = users("baseline", 200, 2) + users("canary", 200, 4)

    def enough(c: dict[str, int]) -> bool:
        return c["canary"] >= RULE.min_samples

    async with clients(stack, answers, high, []):
        judged = await judge_looks(stack, 42, enough, looks=4)

    assert set(answers.high) == {200}, answers
    trips = [e for e in events(judged.hold) if e.kind is EventKind.TRIPPED]
    assert len(trips) == 1, [d.evidence["window"] for d in judged.hold]
    assert EventKind.OVERLOAD_HOLD not in [e.kind for e in events(judged.hold)]
    evidence = trips[0].payload["evidence"]
    assert evidence["overload"] == {
        "policy": "hold",
        "held": False,
        "variants": {
            "canary": {"shed": 0, "shed_share": 0.0},
            "baseline": {"shed": 0, "shed_share": 0.0},
        },
    }
    assert evidence["window"]["verdict"] == "breach"
