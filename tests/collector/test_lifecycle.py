"""The collector forgets ended experiments: memory follows the live ones.

An experiment ends when no route names it in a live state any more (promoted, rolled
back, deleted, replaced); its windows and its partial go once its grace (the longest
window it had) has passed on the injected clock. Memory is counted in objects held.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from controlplane.collector.lifecycle import ExperimentLifecycle
from controlplane.collector.service import Collector
from controlplane.collector.sharding import part_field
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.routes import RouteState
from controlplane.kernel.streams_factory import open_streams

WINDOW_SEC = 5


def route_json(experiment: int, state: str) -> bytes:
    return json.dumps(
        {
            "experiment": experiment,
            "revision": 1,
            "salt": "s1",
            "variants": [
                {"name": "baseline", "upstream": "http://127.0.0.1:9/", "weight": 9000},
                {"name": "canary", "upstream": "http://127.0.0.1:9/", "weight": 1000},
            ],
            "state": state,
        }
    ).encode()


def batch(experiment: int, now: float, seq: int, n: int = 64) -> dict[str, bytes]:
    builder = BatchBuilder()
    for i in range(n):
        builder.add(now, "canary" if i % 4 == 0 else "baseline", 1_000 + i, 200)
    meta = BatchMeta(str(experiment), "sc-1", seq, len(builder))
    return entry_fields(meta, builder.encode())


async def until(collector: Collector, done: Callable[[], bool]) -> None:
    """Let the config watch deliver (the in-process bus answers without waiting)."""
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0)
    assert done()


# --- the bookkeeping ---------------------------------------------------------


def test_a_route_leaving_the_live_states_ends_its_experiment() -> None:
    life = ExperimentLifecycle()
    life.route("a", "1", RouteState.RUNNING, 100.0)
    for state in (RouteState.PAUSED, RouteState.TRIPPED, RouteState.HALF_OPEN):
        life.route("a", "1", state, 101.0)
        assert life.is_live("1") and life.ended_at("1") is None
    life.route("a", "1", RouteState.PROMOTED, 102.0)
    assert not life.is_live("1") and life.ended_at("1") == 102.0
    assert life.due(111.0, lambda e: 10.0) == []
    assert life.due(112.0, lambda e: 10.0) == ["1"]


def test_deleted_and_replaced_routes_end_their_experiment() -> None:
    life = ExperimentLifecycle()
    life.route("a", "1", RouteState.RUNNING, 0.0)
    life.route("b", "2", RouteState.RUNNING, 0.0)
    life.route("a", "3", RouteState.RUNNING, 5.0)  # another experiment on service a
    life.route("b", None, None, 6.0)  # route deleted
    assert life.ended_at("1") == 5.0 and life.ended_at("2") == 6.0
    assert life.ended_at("3") is None
    # rolled back: ended at the first time it was seen over, not moved by repeats
    life.route("a", "3", RouteState.ROLLED_BACK, 7.0)
    life.route("a", "3", RouteState.ROLLED_BACK, 9.0)
    assert life.ended_at("3") == 7.0


def test_an_experiment_live_on_another_service_is_not_ended() -> None:
    life = ExperimentLifecycle()
    life.route("a", "1", RouteState.RUNNING, 0.0)
    life.route("b", "1", RouteState.RUNNING, 0.0)
    life.route("a", None, None, 1.0)
    assert life.is_live("1") and life.ended_at("1") is None
    life.route("b", "1", RouteState.ROLLED_BACK, 2.0)
    assert life.ended_at("1") == 2.0


def test_a_restarted_experiment_is_live_again() -> None:
    life = ExperimentLifecycle()
    life.route("a", "1", RouteState.ROLLED_BACK, 0.0)
    life.route("a", "1", RouteState.RUNNING, 1.0)
    assert life.ended_at("1") is None and life.due(100.0, lambda e: 0.0) == []


def test_samples_after_forgetting_end_the_experiment_again_and_the_memory_stays_bounded() -> None:
    life = ExperimentLifecycle(remember_forgotten=100)
    for i in range(1_000):
        life.route("a", str(i), RouteState.PROMOTED, float(i))
        for e in life.due(float(i), lambda e: 0.0):
            life.forgotten(e)
    assert life.ended_count == 0
    life.revived("999", 2_000.0)  # recently forgotten: ends again
    life.revived("0", 2_000.0)  # forgotten long ago: the LRU let it go
    assert life.ended_at("999") == 2_000.0 and life.ended_at("0") is None


# --- the collector -----------------------------------------------------------


async def test_thousands_of_ended_experiments_leave_no_window_behind() -> None:
    clock = FakeClock()
    streams, board = open_streams("memory://", clock=clock)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/t")
    services = [f"svc-{i}" for i in range(50)]
    for service in services:
        rule = {"service": service, "threshold_ms": 100, "window_sec": WINDOW_SEC}
        await kv.put(keys.rule(service), json.dumps(rule).encode())
    collector = Collector(
        streams, board, kv, keys, consumer_name="c1", clock=clock, block_ms=0, tick=0.5
    )
    await collector.load_config()
    grace = WINDOW_SEC + 2 + 2  # window + skew + the ring's margin (retained_sec)
    rounds = 40  # 50 services x 40 rounds: 2,000 experiments, one after the other
    most_held = 0
    try:
        seq = 0
        for r in range(rounds):
            for s, service in enumerate(services):
                experiment = 1 + r * len(services) + s
                # the next experiment's route replaces the previous one's: that one ends
                await kv.put(keys.route(service), route_json(experiment, "running"))
                seq += 1
                await streams.append(service, [batch(experiment, clock.now(), seq)], maxlen=100)
            started = [str(1 + r * len(services) + s) for s in range(len(services))]
            await until(collector, lambda: all(map(collector.lifecycle.is_live, started)))  # noqa: B023
            clock.advance(1.0)
            for _ in range(3):
                await collector.step()
            most_held = max(most_held, len(collector.windows))
            assert collector.metrics.experiments._value.get() == len(collector.windows)
        last = [1 + (rounds - 1) * len(services) + s for s in range(len(services))]
        for service, experiment in zip(services, last, strict=True):
            await kv.put(keys.route(service), route_json(experiment, "promoted"))
        await until(collector, lambda: not any(collector.lifecycle.is_live(str(e)) for e in last))
        clock.advance(grace)
        await collector.step()
        clock.advance(1.0)
        await collector.step()

        assert collector.windows == {}
        assert collector.experiment_service == {}
        assert collector._last_publish == {} and collector._held == {}
        assert collector.lifecycle.ended_count == 0
        assert collector.metrics.forgotten._value.get() == rounds * len(services)
        assert collector.metrics.experiments._value.get() == 0
        # at most the experiments of the last grace period were ever held at once
        assert most_held <= (grace + 1) * len(services)
        # and no partial of this collector is left on any stats hash
        for experiment in (1, 999, last[-1]):
            assert part_field("c1") not in await board.read(str(experiment))
        assert await streams.pending(services[0], "collectors") == 0
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()


async def test_a_rolled_back_experiment_is_forgotten_after_its_grace_on_redis_and_etcd(
    redis_url: str, redis_namespace: str, etcd_endpoint: str, etcd_prefix: str
) -> None:
    clock = FakeClock()
    streams, board = open_streams(redis_url, namespace=redis_namespace)
    kv = open_kv(etcd_endpoint)
    keys = EtcdKeys(etcd_prefix)
    service = "orders"
    rule = {"service": service, "threshold_ms": 100, "window_sec": WINDOW_SEC}
    await kv.put(keys.rule(service), json.dumps(rule).encode())
    await kv.put(keys.route(service), route_json(7, "running"))
    collector = Collector(streams, board, kv, keys, consumer_name="c1", clock=clock, block_ms=20)
    try:
        await collector.load_config()
        await collector.step()  # discovers the stream
        await streams.append(service, [batch(7, clock.now(), 1)], maxlen=100)
        for _ in range(20):
            clock.advance(0.2)
            await collector.step()
            if part_field("c1") in await board.read("7"):
                break
        assert part_field("c1") in await board.read("7")
        grace = collector.grace_sec("7")
        assert grace == WINDOW_SEC + 2 + 2

        await kv.put(keys.route(service), route_json(7, "rolled_back"))
        for _ in range(100):
            if collector.lifecycle.ended_at("7") is not None:
                break
            await asyncio.sleep(0.01)  # the etcd watch delivers on its own time
        ended = collector.lifecycle.ended_at("7")
        assert ended is not None

        clock.advance(grace - 1.0)  # inside the grace period: kept
        await collector.step()
        assert "7" in collector.windows
        clock.advance(ended + grace - clock.now())
        await collector.step()
        assert "7" not in collector.windows
        assert part_field("c1") not in await board.read("7")
        assert collector.metrics.forgotten._value.get() == 1
        # the judged snapshots stay on the board for whoever reads the outcome
        assert "baseline" in await board.read("7")
    finally:
        await collector.stop_watching()
        await streams.close()
        await kv.close()
