"""Sample batches and snapshots: Redis Streams in production, in-process by default.

`SampleStream` is the only way samples travel from sidecars to collectors, and
`SnapshotBoard` the only way snapshots travel from collectors to the controller.
Implementations: streams_redis (Redis ≥ 6.2) and streams_memory (same semantics:
consumer groups, pending entries, idle-time claims), chosen by `open_streams(url)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# the decision stream keeps this many entries, in every implementation: the rule
# recommendation reads the whole retained stream
DECISIONS_MAXLEN = 10_000


@dataclass(frozen=True)
class StreamEntry:
    service: str
    entry_id: str
    fields: Mapping[str, bytes]
    deliveries: int = 1


@dataclass(frozen=True)
class PendingSummary:
    """A stream's entries delivered to the group and not acked yet, on any consumer;
    `idle`: at least one of them has waited min_idle_ms or longer (claimable)."""

    pending: int
    idle: bool


NOTHING_PENDING = PendingSummary(0, False)


class SampleStream(Protocol):
    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        """Append batches (one entry each, in one call), trimming to ~maxlen entries.

        Idempotent per source: a batch whose (src, seq) is not above the last seq
        appended from its src to this stream is not added again (its id is ""), so a
        send retried after a lost reply never puts a batch in the stream twice (two
        collectors would each count their copy). A source's batches go in seq order
        (the reporter's). Entries without a well-formed (src, seq) are appended as
        they are.
        """
        ...

    async def ensure_group(self, service: str, group: str) -> None:
        """Create the consumer group (and the stream) if missing; idempotent."""
        ...

    async def read_group(
        self,
        services: Sequence[str],
        group: str,
        consumer: str,
        *,
        count: int,
        block_ms: int,
    ) -> list[StreamEntry]:
        """New entries for this consumer, blocking up to block_ms when there are none."""
        ...

    async def ack(self, service: str, group: str, entry_ids: Sequence[str]) -> int: ...

    async def ack_many(self, group: str, entry_ids: Mapping[str, Sequence[str]]) -> int:
        """`ack` of each service's entries (service -> ids) in one round trip (the
        collector acks a tick's publishes at once); returns how many were acked."""
        ...

    async def claim_idle(
        self, service: str, group: str, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[StreamEntry]:
        """Take over entries pending on other consumers for longer than min_idle_ms."""
        ...

    async def pending(self, service: str, group: str) -> int: ...

    async def pending_many(
        self, group: str, services: Sequence[str], *, min_idle_ms: int
    ) -> dict[str, PendingSummary]:
        """`pending` of every service, and whether any of its entries is idle for
        min_idle_ms, in one round trip (the collector's claim pass looks at every
        stream each second, and claims only where something is idle); a stream
        without the group has nothing pending."""
        ...

    async def services(self) -> list[str]:
        """Services that have a samples stream."""
        ...

    async def close(self) -> None: ...


class SnapshotBoard(Protocol):
    async def publish(
        self, experiment: str, per_variant: Mapping[str, str], decision: Mapping[str, str]
    ) -> None:
        """Set the stats hash fields (variant -> JSON) and add one decisions entry."""
        ...

    async def write_many(self, fields: Mapping[str, Mapping[str, str]]) -> None:
        """Set stats hash fields of several experiments (experiment -> field -> JSON)
        in one round trip, with no decisions entry (a tick's partial windows)."""
        ...

    async def read(self, experiment: str) -> dict[str, str]:
        """variant -> snapshot JSON, empty when nothing was published."""
        ...

    async def read_many(self, experiments: Sequence[str]) -> list[dict[str, str]]:
        """`read` of each experiment, in order, in one round trip (the controller's
        tick reads every running experiment at once: decision 0031)."""
        ...

    async def remove_if_unchanged(self, experiment: str, expected: Mapping[str, str]) -> list[str]:
        """Delete each stats hash field whose value is still exactly `expected[field]`.

        One atomic compare-and-delete: a field written again since it was read keeps
        its new value. Returns the fields deleted; changed or missing ones are not.
        """
        ...

    async def recent_decisions(self, count: int) -> list[dict[str, str]]:
        """The newest `count` decisions entries (XREVRANGE), newest first, as text fields."""
        ...

    async def close(self) -> None: ...
