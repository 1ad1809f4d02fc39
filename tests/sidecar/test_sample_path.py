"""The proxy's sample path by columns gives what the per-sample path gave.

Requests finish, overload gates shed, flushes come; the same history goes through
`ProxyServer` (columns: `PendingSamples`, `ProxyMetrics.observe_many`,
`SampleReporter.record_columns`, `BatchBuilder.add_columns`) and through a reference
written the way the proxy worked before: one tuple per request, the metrics by
Counter and bisect, and each sample into the batch by `BatchBuilder.add` (through
`SampleReporter.record`). The batches must be byte for byte the same, and so must
the counters and the histogram.
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import ABORTED, CONNECT_ERROR, SHED, TIMEOUT, grpc_outcome
from sidecar.choice import Choice, Sample, SampleColumns, Upstream
from sidecar.proxy import ProxyServer
from sidecar.proxy.metrics import OVERHEAD_BUCKETS, ProxyMetrics
from sidecar.proxy.server import SAMPLE_FLUSH_COUNT
from sidecar.reporter import SampleReporter
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder
from tests.sidecar.test_reporter import SERVICE, DownStream

NOW = 1_800_000_000.0
U32 = 0xFFFF_FFFF
UPSTREAM = Upstream.parse("http://127.0.0.1:9")


class SetClock:
    """A clock a test sets to any value, backwards included."""

    def __init__(self) -> None:
        self.wall = NOW
        self.mono = 0.0

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


@dataclass
class Stream:
    """What `streams_finished` reads of a finished request (the `Finished` protocol)."""

    choice: Choice | None
    t0: float
    ts: float
    t_sent: float | None
    t_first: float | None
    trace: None = None


@dataclass(frozen=True)
class Request:
    choice: Choice | None
    ts: float
    t0: float
    t_sent: float | None
    t_first: float | None
    outcome: int
    end: float


@dataclass(frozen=True)
class Shed:
    choice: Choice
    now: float


@dataclass(frozen=True)
class Flush:
    now: float


Event = Request | Shed | Flush

choices = st.builds(
    Choice,
    experiment=st.sampled_from(["7", "7", "8", "x" * 80, None]),  # "x"*80: refused id
    variant=st.sampled_from(["baseline", "canary", "canary-2", "β"]),
    upstream=st.just(UPSTREAM),
    unit_hash=st.one_of(st.integers(0, U32), st.integers(-(2**40), 2**70)),
)
# wall times before a batch's first (dt clamps to 0) and over 71 minutes after it
walls = st.one_of(
    st.floats(-10, 60, allow_nan=False), st.floats(4290, 5000, allow_nan=False)
).map(lambda offset: NOW + offset)
monotonic = st.floats(0, 10, allow_nan=False)
outcomes = st.one_of(
    st.sampled_from([CONNECT_ERROR, TIMEOUT, ABORTED, 200, 200, 404, 503]),
    st.integers(0, 16).map(grpc_outcome),
)
requests = st.builds(
    Request,
    choice=st.one_of(choices, st.none()),
    ts=walls,
    t0=monotonic,
    # a first byte before the head (negative) or after the end (clamped to it)
    t_sent=st.one_of(st.none(), monotonic),
    t_first=st.one_of(st.none(), monotonic),
    outcome=outcomes,
    end=st.one_of(monotonic, st.floats(4000, 5000)),  # up to far beyond u32 µs
)
events = st.lists(
    st.one_of(
        requests,
        requests,
        requests,
        st.builds(Shed, choices.filter(lambda c: c.experiment is not None), walls),
        st.builds(Flush, walls),
    ),
    max_size=80,
)


class Reference:
    """The proxy's sample path as it was: a tuple per request, a batch sample by sample."""

    def __init__(self, reporter: SampleReporter) -> None:
        self.reporter = reporter
        self.metrics = ProxyMetrics()
        self.samples: list[Sample] = []
        self.overheads: list[float] = []
        self.shed: dict[tuple[str, str], int] = {}

    def finished(self, request: Request, now: float) -> None:
        choice = request.choice
        if choice is not None:
            total = int((request.end - request.t0) * 1e6)
            t_first = request.t_first
            first = total if t_first is None else int((t_first - request.t0) * 1e6)
            self.samples.append(
                (request.ts, choice.experiment, choice.variant, total, request.outcome,
                 choice.unit_hash, first if first < total else total)
            )  # fmt: skip
            t_sent = request.t_sent
            self.overheads.append(-1.0 if t_sent is None else t_sent - request.t0)
        if len(self.samples) >= SAMPLE_FLUSH_COUNT:
            self.flush(now)

    def add_shed(self, choice: Choice) -> None:
        assert choice.experiment is not None
        key = (choice.experiment, choice.variant)
        self.shed[key] = self.shed.get(key, 0) + 1

    def flush(self, now: float) -> None:
        samples, self.samples = self.samples, []
        overheads, self.overheads = self.overheads, []
        if samples:
            observe_many_before(self.metrics, samples, overheads)
        tallies = [(now, e, v, count, SHED, 0, 0) for (e, v), count in self.shed.items()]
        self.shed = {}
        for sample in samples + tallies:
            self.reporter.record(*sample)


def observe_many_before(
    metrics: ProxyMetrics, samples: Sequence[Sample], overheads: Sequence[float]
) -> None:
    """ProxyMetrics.observe_many as it was, on rows."""
    requests = metrics.requests
    for key, count in Counter([(s[2], s[4]) for s in samples]).items():
        requests[key] = requests.get(key, 0) + count
    measured = [o for o in overheads if o >= 0]
    for o in measured:
        metrics.overhead_counts[bisect_left(OVERHEAD_BUCKETS, o)] += 1
    metrics.overhead_sum += sum(measured)
    metrics.overhead_count += len(measured)


def reporter(batch_size: int) -> tuple[DownStream, SampleReporter]:
    stream = DownStream()
    stream.up = True
    return stream, SampleReporter(
        stream,  # type: ignore[arg-type]
        SERVICE,
        source="src",
        batch_size=batch_size,
        clock=SetClock(),
    )


def replay(history: list[Event], proxy: ProxyServer, clock: SetClock, ref: Reference) -> None:
    for event in history:
        if isinstance(event, Request):
            clock.mono = event.end
            stream = Stream(event.choice, event.t0, event.ts, event.t_sent, event.t_first)
            proxy.streams_finished([(stream, event.outcome)])
            ref.finished(event, clock.wall)
        elif isinstance(event, Shed):
            proxy.shed(event.choice)
            ref.add_shed(event.choice)
        else:
            clock.wall = event.now
            proxy.flush_samples()
            ref.flush(event.now)
    clock.wall = NOW + 1
    proxy.flush_samples()
    ref.flush(NOW + 1)


def same_metrics(got: ProxyMetrics, expected: ProxyMetrics) -> None:
    assert list(got.requests.items()) == list(expected.requests.items())
    assert got.overhead_counts == expected.overhead_counts
    # summed in the same order; from Python 3.12 sum() compensates, so within rounding
    assert math.isclose(got.overhead_sum, expected.overhead_sum, rel_tol=1e-12, abs_tol=1e-15)
    assert got.overhead_count == expected.overhead_count


def send_both(*reporters: SampleReporter) -> None:
    async def flush() -> None:
        for one in reporters:
            assert await one.flush()

    asyncio.run(flush())


@settings(max_examples=200, deadline=None)
@given(events, st.integers(1, 600))
def test_columns_give_the_batches_and_metrics_of_the_per_sample_path(
    history: list[Event], batch_size: int
) -> None:
    new_stream, new = reporter(batch_size)
    old_stream, old = reporter(batch_size)
    clock = SetClock()
    proxy = ProxyServer(HeaderChooser({}), new, clock=clock)
    ref = Reference(old)
    replay(history, proxy, clock, ref)
    send_both(new, old)
    assert new_stream.appended == old_stream.appended  # every field, payloads byte for byte
    assert new.snapshot() == old.snapshot()
    same_metrics(proxy.metrics, ref.metrics)


def test_a_full_flush_goes_by_itself_and_splits_into_runs_of_one_experiment() -> None:
    new_stream, new = reporter(512)
    old_stream, old = reporter(512)
    clock = SetClock()
    proxy = ProxyServer(HeaderChooser({}), new, clock=clock)
    ref = Reference(old)
    baseline, canary = (Choice("7", v, UPSTREAM, 0) for v in ("baseline", "canary"))
    other = Choice("8", "baseline", UPSTREAM, 5)
    history: list[Event] = [
        Request(
            (baseline, canary, other, None)[i // 100 % 4],
            NOW + i * 0.001, i * 0.001, i * 0.001 + 0.0001, None if i % 5 else i * 0.001,
            200 if i % 9 else 503, i * 0.001 + 0.002,
        )
        for i in range(SAMPLE_FLUSH_COUNT * 2 + 17)
    ]  # fmt: skip
    history.insert(300, Shed(canary, NOW))
    replay(history, proxy, clock, ref)
    send_both(new, old)
    assert [fields["exp"] for fields in new_stream.appended] == [b"7", b"8", b"7"]
    assert new_stream.appended == old_stream.appended
    assert new.snapshot() == old.snapshot()
    same_metrics(proxy.metrics, ref.metrics)


def test_a_recorder_without_record_columns_gets_the_samples_as_tuples() -> None:
    recorder = ListRecorder()
    clock = SetClock()
    proxy = ProxyServer(HeaderChooser({}), recorder, clock=clock)
    choice = Choice("7", "canary", UPSTREAM, 9)
    clock.mono = 0.5
    proxy.streams_finished([(Stream(choice, 0.25, NOW, 0.3, 0.4), 200)])
    proxy.shed(choice)
    clock.wall = NOW + 2
    proxy.flush_samples()
    assert [tuple(vars(s).values()) for s in recorder.samples] == [
        (NOW, "7", "canary", 250_000, 200, 9, 150_000),
        (NOW + 2, "7", "canary", 1, SHED, 0, 0),
    ]


def test_sample_columns_are_the_rows_transposed() -> None:
    rows: list[Sample] = [(NOW, "7", "a", 1, 200, 2, 1), (NOW + 1, None, "b", 3, 404, 4, 0)]
    columns = SampleColumns.of(rows)
    assert columns.experiments == ["7", None] and columns.first_byte_us == [1, 0]
    assert len(columns) == 2 and columns.rows() == rows and columns.rows(1) == rows[1:]
    assert len(SampleColumns.of([])) == 0
