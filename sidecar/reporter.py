"""Batched RT samples to the samples stream (architecture §5), never on the request path.

`SampleReporter.record()` (the proxy's `Recorder`) appends to the current batch in
O(1) and does no I/O. A batch holds one experiment's samples; it is sealed (encoded
once, given the next `seq`) when it reaches the size cap, when the experiment
changes, or when it is older than the max delay. Sealed batches wait in a bounded
buffer; a background task sends them, one XADD per batch and several batches per
pipelined call.

When the stream is down or slow the buffer keeps the newest batches and drops the
oldest, counting what it drops; sending resumes with the shared backoff (kernel/backoff.py). A batch
whose append timed out may have reached Redis anyway and is then sent again with the
same (src, seq): the stream does not take it twice (`SampleStream.append` is
idempotent per source), and a collector would recognise the repeat anyway.

Samples without an experiment (a default upstream, no route) are not sent: there is
nothing to compare them with. They are counted as `unattributed`. A batch whose
experiment id does not match the kernel's pattern would be refused by every
collector, so it is dropped (and counted) here.

With a key set configured each batch is signed (HMAC-SHA256, sample_auth.py) once,
when it is sealed; a retried send repeats the same signed fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.errors import CodecError
from controlplane.kernel.keys import is_experiment_id
from controlplane.kernel.sample_auth import SampleSigner
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.tasks import cancel_and_wait
from sidecar.choice import Sample, SampleColumns

log = logging.getLogger("canary.sidecar.samples")

DEFAULT_BATCH_SIZE = 512
DEFAULT_MAX_DELAY = 0.050
DEFAULT_BUFFER_BATCHES = 2_000
DEFAULT_MAXLEN = 10_000
DEFAULT_BATCHES_PER_CALL = 64
DEFAULT_SEND_TIMEOUT = 2.0


def instance_id(tag: str = "") -> str:
    """A sidecar instance id, unique across hosts and restarts (`src` of its batches);
    `tag` (e.g. a worker's number) makes it easier to read, not more unique."""
    middle = f"{tag}-" if tag else ""
    return f"{socket.gethostname()}-{os.getpid()}-{middle}{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True)
class _Sealed:
    seq: int
    n: int
    fields: Mapping[str, bytes]


@dataclass
class ReporterStats:
    """Counters since start; `buffered_*` are gauges of what waits to be sent."""

    samples_recorded: int = 0
    samples_sent: int = 0
    samples_dropped: int = 0
    samples_unattributed: int = 0
    batches_sent: int = 0
    batches_dropped: int = 0
    send_errors: int = 0
    buffered_samples: int = 0
    buffered_batches: int = 0


class SampleReporter:
    """Implements the proxy's `Recorder`: record() never blocks and never raises."""

    def __init__(
        self,
        stream: SampleStream,
        service: str,
        *,
        clock: Clock | None = None,
        source: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_delay: float = DEFAULT_MAX_DELAY,
        buffer_batches: int = DEFAULT_BUFFER_BATCHES,
        maxlen: int = DEFAULT_MAXLEN,
        batches_per_call: int = DEFAULT_BATCHES_PER_CALL,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        signer: SampleSigner | None = None,
    ) -> None:
        if batch_size < 1 or buffer_batches < 1 or batches_per_call < 1:
            raise ValueError("batch_size, buffer_batches and batches_per_call must be ≥ 1")
        self._stream = stream
        self.service = service
        self.source = source or instance_id()
        self._clock: Clock = clock or SystemClock()
        self._batch_size = batch_size
        self._max_delay = max_delay
        self._buffer_batches = buffer_batches
        self._maxlen = maxlen
        self._per_call = batches_per_call
        self._send_timeout = send_timeout
        self._backoff = BackoffPolicy(initial=backoff_initial, maximum=backoff_max)
        self._signer = signer
        self._refused_experiment: str | None = None  # the last one logged, not every batch

        self._builder = BatchBuilder()
        self._experiment: str | None = None
        self._opened_at = 0.0  # clock.monotonic() of the current batch's first sample
        self._seq = 0
        self._buffer: deque[_Sealed] = deque()
        self._buffered_samples = 0
        self._inflight: list[_Sealed] = []
        self.stats = ReporterStats()

        self._wake = asyncio.Event()
        # one send at a time: the batches in flight are one list, and a flush() called
        # while the background task sends would count or requeue the other's batches
        self._sending = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # --- the request path ---------------------------------------------------

    def record(
        self,
        ts: float,
        experiment: str | None,
        variant: str,
        rt_us: int,
        outcome: int,
        unit_hash: int,
        first_byte_us: int | None = None,
    ) -> None:
        self.stats.samples_recorded += 1
        first = rt_us if first_byte_us is None else first_byte_us
        self._add_one((ts, experiment, variant, rt_us, outcome, unit_hash, first))

    def record_many(self, samples: Sequence[Sample]) -> None:
        try:
            columns = SampleColumns.of(samples)
        except Exception:  # one is not a sample: each goes as `record` would take it
            self.stats.samples_recorded += len(samples)
            for sample in samples:
                self._add_one(sample)
            return
        self.record_columns(columns)

    def record_columns(self, columns: SampleColumns) -> None:
        n = len(columns)
        self.stats.samples_recorded += n
        try:
            experiments = columns.experiments
            if not n or experiments.count(experiments[0]) == n:  # one run, as a rule
                self._add_run(columns, 0, n)
                return
            start = 0
            for index in range(1, n + 1):
                if index == n or experiments[index] != experiments[start]:
                    self._add_run(columns, start, index)
                    start = index
        except Exception:  # a bug, not a bad sample (those are dropped one by one)
            log.exception("recording samples failed")

    def _add_one(self, sample: Sample) -> None:
        try:
            ts, experiment, variant, rt_us, outcome, unit_hash, first_byte_us = sample
            if experiment is None:
                self.stats.samples_unattributed += 1
                return
            builder = self._open_batch(experiment)
            builder.add(ts, variant, rt_us, outcome, unit_hash, first_byte_us)
            self._seal_if_full(builder)
        except Exception:  # a sample is never worth failing a request over
            self.stats.samples_dropped += 1
            log.exception("sample dropped while recording")

    def _add_run(self, columns: SampleColumns, start: int, stop: int) -> None:
        """Samples start..stop, of one experiment, in as many batches as they fill."""
        if start >= stop:
            return
        experiment = columns.experiments[start]
        if experiment is None:
            self.stats.samples_unattributed += stop - start
            return
        while start < stop:
            builder = self._open_batch(experiment)
            end = min(stop, start + self._batch_size - len(builder))
            try:
                builder.add_columns(
                    columns.ts[start:end],
                    columns.variants[start:end],
                    columns.rt_us[start:end],
                    columns.outcomes[start:end],
                    columns.units[start:end],
                    columns.first_byte_us[start:end],
                )
            except Exception:
                # e.g. one variant name too many for this batch; add_columns changed
                # nothing, so each sample goes as `record` would take it, alone
                for sample in columns.rows(start, end):
                    self._add_one(sample)
                start = end
                continue
            start = end
            self._seal_if_full(builder)

    def _open_batch(self, experiment: str) -> BatchBuilder:
        """The batch `experiment`'s samples go into (a batch holds one experiment)."""
        if experiment != self._experiment:
            self._seal()
            self._experiment = experiment
        builder = self._builder
        if not len(builder):
            self._opened_at = self._clock.monotonic()
            # arms the sender's max-delay timer: once per batch, not per sample
            self._wake.set()
        return builder

    def _seal_if_full(self, builder: BatchBuilder) -> None:
        if len(builder) >= self._batch_size:
            self._seal()
            self._wake.set()

    # --- batching -----------------------------------------------------------

    def _seal(self) -> None:
        """Encode the current batch (if any) and queue it; drop the oldest when full."""
        builder = self._builder
        n = len(builder)
        if not n or self._experiment is None:
            return
        self._builder = BatchBuilder()
        if not is_experiment_id(self._experiment):
            self.stats.samples_dropped += n
            self.stats.batches_dropped += 1
            if self._experiment != self._refused_experiment:
                self._refused_experiment = self._experiment
                log.warning(
                    "samples of a malformed experiment id (%d characters) dropped",
                    len(self._experiment),
                )
            return
        try:
            payload = builder.encode()  # version 3 only when it holds a shed tally
        except CodecError as exc:  # e.g. an over-long variant name from a request header
            self.stats.samples_dropped += n
            self.stats.batches_dropped += 1
            log.warning("a batch of %d samples could not be encoded: %s", n, exc)
            return
        self._seq += 1
        meta = BatchMeta(
            experiment=self._experiment,
            source=self.source,
            seq=self._seq,
            n=n,
            version=builder.version,
        )
        fields = entry_fields(meta, payload)
        if self._signer is not None:
            fields = self._signer.sign(self.service, fields)
        self._buffer.append(_Sealed(self._seq, n, fields))
        self._buffered_samples += n
        self._trim()

    def _trim(self) -> None:
        while len(self._buffer) + len(self._inflight) > self._buffer_batches and self._buffer:
            dropped = self._buffer.popleft()
            self._buffered_samples -= dropped.n
            self.stats.batches_dropped += 1
            self.stats.samples_dropped += dropped.n

    def seal_due(self) -> bool:
        """Seal the current batch if it is older than the max delay; True if it did."""
        if len(self._builder) and self._clock.monotonic() - self._opened_at >= self._max_delay:
            self._seal()
            return True
        return False

    def _next_due_in(self) -> float | None:
        if not len(self._builder):
            return None
        return max(self._max_delay - (self._clock.monotonic() - self._opened_at), 0.0)

    # --- sending ------------------------------------------------------------

    async def send_pending(self) -> bool:
        """Send every sealed batch, several per call; False when the stream failed."""
        async with self._sending:
            return await self._send_buffered()

    async def _send_buffered(self) -> bool:
        while self._buffer:
            count = min(self._per_call, len(self._buffer))
            self._inflight = [self._buffer.popleft() for _ in range(count)]
            try:
                async with asyncio.timeout(self._send_timeout):
                    await self._stream.append(
                        self.service,
                        [batch.fields for batch in self._inflight],
                        maxlen=self._maxlen,
                    )
            except asyncio.CancelledError:
                self._requeue()
                raise
            except Exception as exc:
                self.stats.send_errors += 1
                self._requeue()
                log.warning("samples not sent (%s); %d batches buffered", exc, len(self._buffer))
                return False
            sent = self._inflight
            self._inflight = []
            self._buffered_samples -= sum(batch.n for batch in sent)
            self.stats.batches_sent += len(sent)
            self.stats.samples_sent += sum(batch.n for batch in sent)
        return True

    def _requeue(self) -> None:
        # the batches go back in front: they are older than anything queued since
        self._buffer.extendleft(reversed(self._inflight))
        self._inflight = []
        self._trim()

    async def flush(self) -> bool:
        """Seal the current batch whatever its age and send everything now."""
        self._seal()
        return await self.send_pending()

    def snapshot(self) -> ReporterStats:
        stats = ReporterStats(**vars(self.stats))
        stats.buffered_batches = len(self._buffer) + len(self._inflight)
        stats.buffered_samples = self._buffered_samples + len(self._builder)
        return stats

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sample-reporter:{self.service}")

    async def _run(self) -> None:
        backoff = Backoff(self._backoff)
        # the closing flag as well as the cancellation: either one ends the loop
        while not self._closing:
            due = self._next_due_in()
            if not self._buffer:
                # wait for a full batch, or until the open batch reaches its max delay
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due):
                        await self._wake.wait()
                self._wake.clear()
                self.seal_due()
            if not self._buffer:
                continue
            if await self.send_pending():
                backoff.reset()
                continue
            # Backing off: record() keeps filling the bounded buffer meanwhile.
            await asyncio.sleep(backoff.next_delay())
            self.seal_due()

    async def close(self, deadline: float = 5.0) -> None:
        """Stop the background task and flush what can be sent within deadline seconds."""
        if self._closing:
            return
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            self._wake.set()
            await cancel_and_wait(task)
        self._seal()
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        try:
            async with asyncio.timeout_at(end):
                backoff = Backoff(self._backoff)
                # the deadline is also checked here: a stream that loses the
                # timeout's cancellation must not keep the loop going for ever
                while not await self.send_pending() and loop.time() < end:
                    await asyncio.sleep(backoff.next_delay())
        except TimeoutError:
            pass
        stats = self.snapshot()
        if stats.buffered_samples:
            log.warning(
                "closing with %d samples unsent (%d batches)",
                stats.buffered_samples,
                stats.buffered_batches,
            )
