"""The in-process twin of streams_redis, for the embedded mode (`canary dev`, `canary demo`).

It keeps the Redis Streams semantics the collector relies on, so the same code and
the same contract suite run on both:

- entry ids are "<ms>-<seq>" and strictly increase, even when the clock stands still;
- a consumer group remembers its last-delivered id and a pending-entries list (PEL)
  of (consumer, delivery time, delivery count) per entry;
- ">" reads deliver each entry to one consumer of the group once;
- entries stay pending until acked and are claimable once idle for long enough,
  measured on the injected clock so tests claim with a FakeClock instead of sleeping;
- trimming drops the oldest entries but leaves their PEL rows, which a claim then
  drops (Redis 7 XAUTOCLAIM does the same);
- a read on a group that vanished recreates it, as the Redis adapter does.

Trimming is exact: an approximate MAXLEN only promises "at least maxlen", and exact
is the tightest case of that.

`MemoryStreams` is both the `SampleStream` and the `SnapshotBoard`. In-process
producers and consumers must share one instance.
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.kernel.alarms import CLOCK_SKEW_SEC as ALARM_SKEW_SEC
from controlplane.kernel.alarms import KEEP_SEC as ALARM_KEEP_SEC
from controlplane.kernel.alarms import MAX_READ as ALARMS_READ
from controlplane.kernel.alarms import parsed_alarms
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import source_and_seq
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.keys import is_service_name
from controlplane.kernel.route_reports import (
    CLOCK_SKEW_SEC,
    FORGET_SEC,
    MAX_REPORTS,
    RouteReport,
    parse_member,
    report_member,
)
from controlplane.kernel.streams import DECISIONS_MAXLEN, PendingSummary, StreamEntry

_Id = tuple[int, int]


def _format_id(entry_id: _Id) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


def _parse_id(text: str) -> _Id | None:
    ms, sep, seq = text.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        return None
    return int(ms), int(seq)


@dataclass
class _Pending:
    consumer: str
    delivered_at: float
    deliveries: int


@dataclass
class _Group:
    last_delivered: _Id = (0, 0)
    # Insertion order is id order: ">" reads deliver ids in increasing order and a
    # claim updates a row in place, so scanning the dict scans the PEL like Redis.
    pending: dict[_Id, _Pending] = field(default_factory=dict)


@dataclass
class _Stream:
    ids: list[_Id] = field(default_factory=list)
    data: dict[_Id, dict[str, bytes]] = field(default_factory=dict)
    last_id: _Id = (0, 0)
    groups: dict[str, _Group] = field(default_factory=dict)

    def add(self, fields: Mapping[str, bytes], now_ms: int, maxlen: int) -> _Id:
        last_ms, last_seq = self.last_id
        new_id = (now_ms, 0) if now_ms > last_ms else (last_ms, last_seq + 1)
        self.last_id = new_id
        self.ids.append(new_id)
        self.data[new_id] = dict(fields)
        self.trim(maxlen)
        return new_id

    def trim(self, maxlen: int) -> None:
        excess = len(self.ids) - max(maxlen, 0)
        if excess > 0:
            for old in self.ids[:excess]:
                del self.data[old]
            del self.ids[:excess]

    def after(self, entry_id: _Id, count: int) -> list[_Id]:
        start = bisect_right(self.ids, entry_id)
        return self.ids[start : start + count]


class MemoryStreams:
    """Sample streams and the snapshot board in one process, on an injected clock."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        self._streams: dict[str, _Stream] = {}
        self._stats: dict[str, dict[str, str]] = {}
        self._decisions = _Stream()
        # (service, src) -> the last seq appended (SampleStream.append is idempotent)
        self._last_seq: dict[tuple[str, str], int] = {}
        self._route_reports: dict[str, dict[str, float]] = {}  # service -> member -> time
        self._alarms: dict[str, float] = {}  # member -> time
        # Replaced on every append: a blocked reader waits on the generation it saw,
        # so no wake-up is lost between its check and its wait.
        self._arrival = asyncio.Event()
        self._closed = False

    # --- SampleStream -------------------------------------------------------

    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        self._check_open()
        stream = self._streams.setdefault(service, _Stream())
        ids: list[str] = []
        for batch in batches:
            origin = source_and_seq(batch)
            if origin is not None:
                last = self._last_seq.get((service, origin[0]))
                if last is not None and origin[1] <= last:
                    ids.append("")  # already appended: a retried send
                    continue
                self._last_seq[(service, origin[0])] = origin[1]
            ids.append(_format_id(stream.add(batch, self._now_ms(), maxlen)))
        if any(ids):
            self._wake_readers()
        return ids

    async def ensure_group(self, service: str, group: str) -> None:
        self._check_open()
        self._group(service, group)

    async def read_group(
        self,
        services: Sequence[str],
        group: str,
        consumer: str,
        *,
        count: int,
        block_ms: int,
    ) -> list[StreamEntry]:
        self._check_open()
        entries = self._deliver_new(services, group, consumer, count)
        if entries or block_ms <= 0:
            return entries
        try:
            async with asyncio.timeout(block_ms / 1000):
                while not entries:
                    await self._arrival.wait()
                    self._check_open()
                    entries = self._deliver_new(services, group, consumer, count)
        except TimeoutError:
            return []
        return entries

    async def ack(self, service: str, group: str, entry_ids: Sequence[str]) -> int:
        self._check_open()
        stream = self._streams.get(service)
        state = stream.groups.get(group) if stream else None
        if state is None:
            return 0
        acked = 0
        for text in entry_ids:
            entry_id = _parse_id(text)
            if entry_id is not None and state.pending.pop(entry_id, None) is not None:
                acked += 1
        return acked

    async def ack_many(self, group: str, entry_ids: Mapping[str, Sequence[str]]) -> int:
        acked = 0
        for service, ids in entry_ids.items():
            acked += await self.ack(service, group, ids)
        return acked

    async def claim_idle(
        self, service: str, group: str, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[StreamEntry]:
        self._check_open()
        stream, state = self._group(service, group)
        now = self._clock.monotonic()
        claimed: list[StreamEntry] = []
        vanished: list[_Id] = []
        for entry_id, row in state.pending.items():
            if len(claimed) >= count:
                break
            if (now - row.delivered_at) * 1000 < min_idle_ms:
                continue
            fields = stream.data.get(entry_id)
            if fields is None:
                vanished.append(entry_id)
                continue
            row.consumer = consumer
            row.delivered_at = now
            row.deliveries += 1
            claimed.append(
                StreamEntry(service, _format_id(entry_id), dict(fields), row.deliveries)
            )
        for entry_id in vanished:
            del state.pending[entry_id]
        return claimed

    async def pending(self, service: str, group: str) -> int:
        self._check_open()
        _, state = self._group(service, group)
        return len(state.pending)

    async def pending_many(
        self, group: str, services: Sequence[str], *, min_idle_ms: int
    ) -> dict[str, PendingSummary]:
        self._check_open()
        now = self._clock.monotonic()
        found: dict[str, PendingSummary] = {}
        for service in services:
            stream = self._streams.get(service)
            state = stream.groups.get(group) if stream else None
            rows = state.pending.values() if state is not None else ()
            idle = any((now - row.delivered_at) * 1000 >= min_idle_ms for row in rows)
            found[service] = PendingSummary(len(rows), idle)
        return found

    async def services(self) -> list[str]:
        self._check_open()
        return sorted(s for s in self._streams if is_service_name(s))

    def add_raw(self, service: str, fields: Mapping[str, bytes], *, maxlen: int = 10_000) -> str:
        """An entry as any Redis writer could XADD it, without `append`'s seq check:
        what collectors must cope with (tests of duplicates and poison)."""
        self._check_open()
        stream = self._streams.setdefault(service, _Stream())
        entry_id = _format_id(stream.add(fields, self._now_ms(), maxlen))
        self._wake_readers()
        return entry_id

    def length(self, service: str) -> int:
        """Entries held in the service's stream (XLEN), for gauges and tests."""
        stream = self._streams.get(service)
        return len(stream.ids) if stream else 0

    # --- SnapshotBoard ------------------------------------------------------

    async def publish(
        self, experiment: str, per_variant: Mapping[str, str], decision: Mapping[str, str]
    ) -> None:
        self._check_open()
        if not decision:
            raise ValueError("a decision entry needs at least one field")
        self._stats.setdefault(experiment, {}).update(per_variant)
        self._decisions.add(
            {name: value.encode() for name, value in decision.items()},
            self._now_ms(),
            DECISIONS_MAXLEN,
        )

    async def write_many(self, fields: Mapping[str, Mapping[str, str]]) -> None:
        self._check_open()
        for experiment, values in fields.items():
            self._stats.setdefault(experiment, {}).update(values)

    async def read(self, experiment: str) -> dict[str, str]:
        self._check_open()
        return dict(self._stats.get(experiment, {}))

    async def read_many(self, experiments: Sequence[str]) -> list[dict[str, str]]:
        self._check_open()
        return [dict(self._stats.get(experiment, {})) for experiment in experiments]

    async def remove_if_unchanged(self, experiment: str, expected: Mapping[str, str]) -> list[str]:
        self._check_open()
        stats = self._stats.get(experiment, {})
        removed = [name for name, value in expected.items() if stats.get(name) == value]
        for name in removed:
            del stats[name]
        if not stats:
            self._stats.pop(experiment, None)  # as Redis drops an emptied hash
        return removed

    async def recent_decisions(self, count: int) -> list[dict[str, str]]:
        self._check_open()
        if count <= 0:
            return []
        newest = reversed(self._decisions.ids[-count:])
        return [
            {name: value.decode() for name, value in self._decisions.data[entry_id].items()}
            for entry_id in newest
        ]

    def decisions_length(self) -> int:
        """Entries held in the decisions stream (XLEN), for gauges and tests."""
        return len(self._decisions.ids)

    # --- RouteReports -------------------------------------------------------

    async def report_route(self, service: str, instance: str, revision: int, now: float) -> None:
        self._check_open()
        members = self._route_reports.setdefault(service, {})
        members[report_member(instance, revision)] = now
        for member, seen in list(members.items()):
            if now - seen > FORGET_SEC or seen - now > CLOCK_SKEW_SEC:
                del members[member]

    async def route_reports(self, service: str) -> list[RouteReport]:
        self._check_open()
        newest = sorted(self._route_reports.get(service, {}).items(), key=lambda m: -m[1])
        parsed = (parse_member(member, seen) for member, seen in newest[:MAX_REPORTS])
        return [report for report in parsed if report is not None]

    # --- Alarms -------------------------------------------------------------

    async def raise_alarms(self, experiments: Mapping[str, float], now: float) -> None:
        self._check_open()
        for member, at in experiments.items():
            self._alarms[member] = max(at, self._alarms.get(member, -math.inf))
        for member, at in list(self._alarms.items()):
            if now - at > ALARM_KEEP_SEC or at - now > ALARM_SKEW_SEC:
                del self._alarms[member]

    async def alarms_since(self, since: float) -> tuple[dict[int, float], int]:
        self._check_open()
        newest = sorted(((at, m) for m, at in self._alarms.items() if at > since), reverse=True)
        return parsed_alarms((m, at) for at, m in newest[:ALARMS_READ])

    def add_raw_alarm(self, member: str, at: float) -> None:
        """A member no collector of ours wrote (tests of the reader's strictness)."""
        self._alarms[member] = at

    async def close(self) -> None:
        self._closed = True
        self._wake_readers()

    # --- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable("the in-process stream bus is closed")

    def _now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    def _wake_readers(self) -> None:
        self._arrival.set()
        self._arrival = asyncio.Event()

    def _group(self, service: str, group: str) -> tuple[_Stream, _Group]:
        stream = self._streams.setdefault(service, _Stream())
        return stream, stream.groups.setdefault(group, _Group())

    def _deliver_new(
        self, services: Sequence[str], group: str, consumer: str, count: int
    ) -> list[StreamEntry]:
        # COUNT applies per stream, as in XREADGROUP over several keys.
        now = self._clock.monotonic()
        entries: list[StreamEntry] = []
        for service in services:
            stream, state = self._group(service, group)
            for entry_id in stream.after(state.last_delivered, count):
                state.last_delivered = entry_id
                state.pending[entry_id] = _Pending(consumer, now, 1)
                entries.append(
                    StreamEntry(service, _format_id(entry_id), dict(stream.data[entry_id]), 1)
                )
        return entries
