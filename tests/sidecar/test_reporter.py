"""SampleReporter: batching by size, experiment and delay; drop-oldest; Redis outages."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import SHED, TIMEOUT, parse_entry
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.keys import COLLECTOR_GROUP
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from sidecar.reporter import SampleReporter
from tests.support.processes import RedisProcess

SERVICE = "svc"
Sample = tuple[float, str, str, int, int, int]  # ts, experiment, variant, rt_us, outcome, unit


@pytest.fixture(params=["memory", "redis"])
async def stream(
    request: pytest.FixtureRequest, redis_url: str
) -> AsyncIterator[SampleStream]:
    if request.param == "memory":
        bus, _ = open_streams("memory://")
    else:
        namespace = request.getfixturevalue("redis_namespace")
        bus, _ = open_streams(redis_url, namespace=namespace)
    await bus.ensure_group(SERVICE, COLLECTOR_GROUP)
    yield bus
    await bus.close()


async def read_all(stream: SampleStream) -> list[tuple[str, int, list[Sample]]]:
    """Every new batch as (src, seq, samples), decoded the way a collector does."""
    entries = await stream.read_group(
        [SERVICE], COLLECTOR_GROUP, "test", count=10_000, block_ms=0
    )
    out = []
    for entry in entries:
        meta, batch = parse_entry(entry.fields)
        samples = [
            (
                float(batch.ts[i]),
                meta.experiment,
                batch.variants[batch.variant[i]],
                int(batch.rt_us[i]),
                int(batch.outcome[i]),
                int(batch.unit[i]),
                int(batch.fb_us[i]) if batch.fb_us is not None else -1,
            )
            for i in range(len(batch))
        ]
        out.append((meta.source, meta.seq, samples))
    return out


def samples(n: int, experiment: str = "7", t0: float = 1_800_000_000.0) -> list[Sample]:
    return [
        (t0 + i * 0.001, experiment, "canary" if i % 3 == 0 else "baseline",
         1000 + i, TIMEOUT if i % 7 == 0 else 200, i * 11, 400 + i)
        for i in range(n)
    ]


def record_all(reporter: SampleReporter, batch: list[Sample]) -> None:
    for sample in batch:
        reporter.record(*sample)


async def test_batches_by_size_and_decoded_samples_equal_the_recorded(
    stream: SampleStream,
) -> None:
    reporter = SampleReporter(stream, SERVICE, batch_size=4, clock=FakeClock())
    recorded = samples(10)
    record_all(reporter, recorded)
    assert reporter.snapshot().buffered_batches == 2  # two full batches sealed, 2 open
    assert await reporter.send_pending()
    assert [len(s) for _, _, s in await read_all(stream)] == [4, 4]

    assert await reporter.flush()
    batches = await read_all(stream)
    assert [len(s) for _, _, s in batches] == [2]
    stats = reporter.snapshot()
    assert (stats.samples_sent, stats.batches_sent, stats.buffered_samples) == (10, 3, 0)
    await reporter.close()


async def test_decoded_samples_equal_the_recorded_ones(stream: SampleStream) -> None:
    reporter = SampleReporter(stream, SERVICE, batch_size=512, clock=FakeClock())
    recorded = samples(300)
    record_all(reporter, recorded)
    await reporter.flush()
    [(src, seq, decoded)] = await read_all(stream)
    assert (src, seq) == (reporter.source, 1)
    assert [d[1:] for d in decoded] == [s[1:] for s in recorded]
    # timestamps travel as whole microseconds from the batch's first sample
    assert [d[0] for d in decoded] == pytest.approx([s[0] for s in recorded], abs=1e-6)
    await reporter.close()


async def test_a_batch_holds_one_experiment(stream: SampleStream) -> None:
    reporter = SampleReporter(stream, SERVICE, clock=FakeClock())
    record_all(reporter, samples(3, "7") + samples(2, "8") + samples(1, "7"))
    reporter.record(1.0, None, "default", 10, 200, 0)  # no experiment: not sent
    await reporter.flush()
    batches = await read_all(stream)
    assert [(s[0][1], len(s)) for _, _, s in batches] == [("7", 3), ("8", 2), ("7", 1)]
    assert [seq for _, seq, _ in batches] == [1, 2, 3]
    assert reporter.snapshot().samples_unattributed == 1
    await reporter.close()


async def test_a_batch_is_sealed_once_it_is_older_than_the_max_delay() -> None:
    clock = FakeClock()
    bus, _ = open_streams("memory://", clock=clock)
    reporter = SampleReporter(bus, SERVICE, max_delay=0.05, clock=clock)
    record_all(reporter, samples(3))
    clock.advance(0.049)
    assert not reporter.seal_due()
    clock.advance(0.001)
    assert reporter.seal_due()
    assert reporter.snapshot().buffered_batches == 1
    await reporter.send_pending()
    assert reporter.snapshot().samples_sent == 3
    await reporter.close()
    await bus.close()


async def test_the_background_task_sends_a_partial_batch_after_the_delay(
    stream: SampleStream,
) -> None:
    reporter = SampleReporter(stream, SERVICE, max_delay=0.01)
    reporter.start()
    record_all(reporter, samples(5))
    deadline = time.monotonic() + 5
    while reporter.snapshot().samples_sent < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert reporter.snapshot().samples_sent == 5
    assert sum(len(s) for _, _, s in await read_all(stream)) == 5
    await reporter.close()


async def test_src_and_seq_are_unique_across_instances(stream: SampleStream) -> None:
    reporters = [SampleReporter(stream, SERVICE, batch_size=2, clock=FakeClock())
                 for _ in range(3)]
    for reporter in reporters:
        record_all(reporter, samples(7))
        await reporter.flush()
    keys = [(src, seq) for src, seq, _ in await read_all(stream)]
    assert len(keys) == 12 and len(set(keys)) == 12
    assert len({src for src, _ in keys}) == 3
    for reporter in reporters:
        await reporter.close()


class DownStream:
    """A samples stream that is unreachable until `up` is set."""

    def __init__(self) -> None:
        self.up = False
        self.appended: list[Mapping[str, bytes]] = []

    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        if not self.up:
            raise BackendUnavailable("down")
        self.appended.extend(batches)
        return [str(i) for i in range(len(batches))]


async def test_a_full_buffer_drops_the_oldest_batches_and_counts_them() -> None:
    down = DownStream()
    reporter = SampleReporter(
        down, SERVICE, batch_size=10, buffer_batches=3, clock=FakeClock()  # type: ignore[arg-type]
    )
    record_all(reporter, samples(50))
    assert not await reporter.send_pending()
    stats = reporter.snapshot()
    assert (stats.batches_dropped, stats.samples_dropped) == (2, 20)
    assert (stats.buffered_batches, stats.buffered_samples) == (3, 30)
    assert stats.send_errors == 1

    down.up = True
    assert await reporter.flush()
    seqs = [int(b["seq"]) for b in down.appended]
    assert seqs == [3, 4, 5]  # the oldest two went
    stats = reporter.snapshot()
    assert (stats.samples_sent, stats.buffered_samples) == (30, 0)
    await reporter.close(deadline=0.1)


async def test_record_never_raises_even_on_a_bad_sample() -> None:
    reporter = SampleReporter(DownStream(), SERVICE, clock=FakeClock())  # type: ignore[arg-type]
    for i in range(300):  # more variant names than a batch can hold
        reporter.record(1.0, "7", f"v{i}", 1, 200, 0)
    assert reporter.snapshot().samples_dropped == 45
    await reporter.close(deadline=0.05)


async def test_a_batch_that_cannot_be_encoded_is_dropped_and_counted() -> None:
    down = DownStream()
    down.up = True
    reporter = SampleReporter(down, SERVICE, clock=FakeClock())  # type: ignore[arg-type]
    reporter.record(1.0, "7", "x" * 300, 1, 200, 0)  # a name too long for the codec
    reporter.record(1.0, "8", "canary", 1, 200, 0)
    assert await reporter.flush()
    stats = reporter.snapshot()
    assert (stats.samples_dropped, stats.batches_dropped, stats.samples_sent) == (1, 1, 1)
    await reporter.close()


async def test_close_gives_up_at_its_deadline_when_the_stream_stays_down() -> None:
    reporter = SampleReporter(DownStream(), SERVICE, clock=FakeClock())  # type: ignore[arg-type]
    record_all(reporter, samples(5))
    await reporter.close(deadline=0.05)
    assert reporter.snapshot().buffered_samples == 5


async def test_redis_stopped_mid_run_drops_are_counted_and_samples_flow_again() -> None:
    redis_server = RedisProcess()
    redis_server.start()
    bus, _ = open_streams(redis_server.url, namespace="t")
    try:
        await bus.ensure_group(SERVICE, COLLECTOR_GROUP)
        reporter = SampleReporter(
            bus, SERVICE, batch_size=10, max_delay=0.01, buffer_batches=5,
            backoff_initial=0.02, backoff_max=0.1,
        )
        reporter.start()
        record_all(reporter, samples(20))
        await wait_until(lambda: reporter.snapshot().samples_sent == 20)

        redis_server.stop()
        record_all(reporter, samples(200))  # 20 batches into a buffer of 5: never raises
        await wait_until(lambda: reporter.snapshot().send_errors > 0)
        stats = reporter.snapshot()
        assert stats.samples_dropped >= 150
        assert stats.buffered_batches <= 5

        redis_server.start()
        await wait_until(lambda: reporter.snapshot().buffered_samples == 0, timeout=15)
        record_all(reporter, samples(10, "9"))
        await wait_until(lambda: reporter.snapshot().buffered_samples == 0)
        stats = reporter.snapshot()
        assert stats.samples_sent + stats.samples_dropped == 230
        entries = await bus.read_group([SERVICE], COLLECTOR_GROUP, "t", count=1000, block_ms=0)
        # the stream lived in the stopped server's memory: only post-restart batches remain
        decoded = [parse_entry(e.fields) for e in entries]
        assert decoded and decoded[-1][0].experiment == "9"
        await reporter.close()
    finally:
        await bus.close()
        redis_server.close()


async def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.01)


# --- record_many: what record does for each sample, in order ----------------------

AnySample = tuple[float, str | None, str, int, int, int, int]

any_samples = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=100).map(lambda t: 1_800_000_000.0 + t),
        st.sampled_from(["7", "7", "8", "9", None]),
        st.sampled_from(["baseline", "canary", "canary-2"]),
        st.integers(-5, 2**33),
        st.sampled_from([TIMEOUT, 200, 404, 503]),
        st.integers(0, 2**32 - 1),
        st.integers(-5, 2**33),
    ),
    max_size=60,
)


def decoded_entries(entries: Sequence[Mapping[str, bytes]]) -> list[tuple[object, list[object]]]:
    """(meta, samples) per batch, variant indices resolved to names."""
    out: list[tuple[object, list[object]]] = []
    for fields in entries:
        meta, batch = parse_entry(fields)
        rows: list[object] = [
            (
                float(batch.ts[i]),
                batch.variants[batch.variant[i]],
                int(batch.rt_us[i]),
                int(batch.outcome[i]),
                int(batch.unit[i]),
                int(batch.fb_us[i]) if batch.fb_us is not None else -1,
            )
            for i in range(len(batch))
        ]
        out.append((meta, rows))
    return out


Twins = tuple[DownStream, SampleReporter, DownStream, SampleReporter]


def twin_reporters(batch_size: int) -> Twins:
    """Two reporters alike (same source) over two streams that are up."""
    streams = DownStream(), DownStream()
    reporters = []
    for bus in streams:
        bus.up = True
        reporters.append(
            SampleReporter(
                bus,  # type: ignore[arg-type]
                SERVICE,
                source="src",
                batch_size=batch_size,
                clock=FakeClock(),
            )
        )
    return streams[0], reporters[0], streams[1], reporters[1]


@settings(max_examples=150, deadline=None)
@given(any_samples, st.integers(1, 8), st.lists(st.integers(0, 60), max_size=6))
def test_record_many_does_what_record_does_per_sample(
    recorded: list[AnySample], batch_size: int, cuts: list[int]
) -> None:
    one_stream, one, many_stream, many = twin_reporters(batch_size)
    # random-sized slices, empty ones included; the state must agree after each
    bounds = sorted([0, len(recorded), *(min(cut, len(recorded)) for cut in cuts)])
    for start, end in itertools.pairwise(bounds):
        for sample in recorded[start:end]:
            one.record(*sample)
        many.record_many(recorded[start:end])
        assert many.snapshot() == one.snapshot()

    async def flush_both() -> None:
        assert await one.flush()
        assert await many.flush()

    asyncio.run(flush_both())
    assert decoded_entries(many_stream.appended) == decoded_entries(one_stream.appended)
    assert many.snapshot() == one.snapshot()
    stats = many.snapshot()
    unattributed = sum(1 for s in recorded if s[1] is None)
    assert (stats.samples_recorded, stats.samples_unattributed) == (len(recorded), unattributed)
    assert stats.samples_sent == len(recorded) - unattributed


async def test_record_many_seals_on_experiment_change_and_at_the_batch_size(
    stream: SampleStream,
) -> None:
    reporter = SampleReporter(stream, SERVICE, batch_size=4, clock=FakeClock())
    unattributed = (1_800_000_000.5, None, "default", 10, 200, 0, 10)
    recorded = [*samples(3, "7"), unattributed, *samples(6, "8"), *samples(2, "7")]
    reporter.record_many(recorded)  # type: ignore[arg-type]
    stats = reporter.snapshot()
    assert (stats.buffered_batches, stats.buffered_samples) == (3, 11)  # "7" x2 still open
    await reporter.flush()
    batches = await read_all(stream)
    assert [(s[0][1], len(s)) for _, _, s in batches] == [("7", 3), ("8", 4), ("8", 2), ("7", 2)]
    assert [seq for _, seq, _ in batches] == [1, 2, 3, 4]
    sent = [sample for _, _, s in batches for sample in s]
    expected = [s for s in recorded if s[1] is not None]
    assert [d[1:] for d in sent] == [s[1:] for s in expected]
    assert [d[0] for d in sent] == pytest.approx([s[0] for s in expected], abs=1e-6)
    stats = reporter.snapshot()
    assert (stats.samples_recorded, stats.samples_unattributed, stats.samples_sent) == (12, 1, 11)
    await reporter.close()


async def test_record_many_over_the_variant_limit_drops_only_what_record_drops() -> None:
    one_stream, one, many_stream, many = twin_reporters(512)
    over = [(1.0, "7", f"v{i}", 1, 200, 0, 1) for i in range(300)]
    after = [(2.0, "8", "canary", 1, 200, 0, 1), (3.0, "9", "baseline", 1, 200, 0, 0)]
    for sample in over + after:
        one.record(*sample)
    many.record_many(over)
    many.record_many(after)
    assert await one.flush() and await many.flush()
    assert one.snapshot().samples_dropped == 45
    assert many.snapshot() == one.snapshot()
    assert decoded_entries(many_stream.appended) == decoded_entries(one_stream.appended)


async def test_record_many_counts_each_sample_once_when_a_run_fails() -> None:
    stream = DownStream()
    stream.up = True
    reporter = SampleReporter(stream, SERVICE, clock=FakeClock())  # type: ignore[arg-type]
    good = samples(3, "7")
    over = [(2.0, "8", f"v{i}", 1, 200, 0, 1) for i in range(300)]
    reporter.record_many([*good, *over, *samples(2, "9")])
    assert await reporter.flush()
    stats = reporter.snapshot()
    assert stats.samples_recorded == 305
    assert stats.samples_sent + stats.samples_dropped == 305
    assert (stats.samples_sent, stats.samples_dropped) == (3 + 255 + 2, 45)


async def test_only_a_batch_holding_a_shed_tally_is_version_3(stream: SampleStream) -> None:
    reporter = SampleReporter(stream, SERVICE, batch_size=4, clock=FakeClock())
    t0 = 1_800_000_000.0
    reporter.record_many([(t0, "7", "canary", 900, 200, 1, 800)] * 4)  # sealed: no tally
    reporter.record_many(
        [(t0, "7", "canary", 900, 200, 2, 800), (t0 + 0.001, "7", "baseline", 5, SHED, 0, 0)]
    )
    await reporter.flush()
    entries = await stream.read_group([SERVICE], COLLECTOR_GROUP, "test", count=10, block_ms=0)
    metas = [parse_entry(entry.fields) for entry in entries]
    assert [meta.version for meta, _ in metas] == [2, 3]
    _, tallied = metas[1]
    assert tallied.outcome.tolist() == [200, SHED] and tallied.rt_us.tolist() == [900, 5]
    await reporter.close()


async def test_record_many_with_a_malformed_sample_drops_only_that_one() -> None:
    stream = DownStream()
    stream.up = True
    reporter = SampleReporter(stream, SERVICE, clock=FakeClock())  # type: ignore[arg-type]
    bad = (2.0, "7", "baseline", 1, 200, 0)  # six fields: not a sample
    reporter.record_many([*samples(2, "7"), bad, *samples(1, "7")])  # type: ignore[list-item]
    assert await reporter.flush()
    stats = reporter.snapshot()
    assert (stats.samples_recorded, stats.samples_sent, stats.samples_dropped) == (4, 3, 1)
    await reporter.close(deadline=0.05)


class GatedStream:
    """Appends wait for `gate`; `swallow` makes one that is cancelled fail instead,
    as a client library that loses the cancellation at a timeout's edge does."""

    def __init__(self, *, swallow: bool = False) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.swallow = swallow
        self.appended: list[Mapping[str, bytes]] = []

    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        self.entered.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            if not self.swallow:
                raise
            raise BackendUnavailable("connection reset") from None
        self.appended.extend(batches)
        return [str(i) for i in range(len(batches))]


async def test_close_ends_the_task_when_the_stream_loses_the_cancellation() -> None:
    stream = GatedStream(swallow=True)
    reporter = SampleReporter(
        stream, SERVICE, batch_size=10, clock=FakeClock(), backoff_initial=0.01  # type: ignore[arg-type]
    )
    reporter.start()
    record_all(reporter, samples(20))
    await stream.entered.wait()
    # a hang guard, not a speed claim: before, close() awaited the task forever
    await asyncio.wait_for(reporter.close(deadline=0.05), timeout=30)
    stats = reporter.snapshot()
    assert stats.buffered_samples == 20  # nothing sent, nothing lost: still held
    assert stats.send_errors >= 1


async def test_a_flush_during_the_background_send_sends_each_batch_once() -> None:
    stream = GatedStream()
    reporter = SampleReporter(
        stream, SERVICE, batch_size=10, batches_per_call=2, clock=FakeClock()  # type: ignore[arg-type]
    )
    reporter.start()
    record_all(reporter, samples(60))  # six batches: three calls of two
    await stream.entered.wait()  # the background task is sending the first two
    flushing = asyncio.create_task(reporter.flush())
    await asyncio.sleep(0)  # the flush reaches the send while the first is in flight
    stream.gate.set()
    assert await flushing
    await reporter.close()
    seqs = [int(batch["seq"]) for batch in stream.appended]
    assert sorted(seqs) == list(range(1, 7))  # each once: none lost, none twice
    stats = reporter.snapshot()
    assert (stats.samples_sent, stats.batches_sent, stats.buffered_samples) == (60, 6, 0)
