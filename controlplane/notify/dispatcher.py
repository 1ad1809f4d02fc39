"""The dispatcher: sends what the outbox holds, in order per experiment, until each
delivery is delivered or given up.

    claim due deliveries (lease) → render and sign → POST → record the outcome
    (delivered, retry at, or failed) and release the lease → wait for the next poll

Every `canary serve` / `canary dev` process runs one; their leases keep two of them
off the same row, so no leader is needed and a crash (or a restart) loses nothing:
rows stay in the table until they are delivered or given up, and a lease left by a
dead dispatcher runs out. Within one subscription an experiment's next delivery is
due only once the one before it is settled (db.notifications.claim_due), so a
receiver sees each experiment's events in the order they happened. `run_once` is
one round, which tests drive step by step with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.db import notifications as outbox
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import CanaryError
from controlplane.kernel.settings import Settings
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.notify.backoff import (
    AttemptResult,
    Delivered,
    GiveUp,
    RetryAt,
    RetryPolicy,
    after_attempt,
)
from controlplane.notify.payloads import render
from controlplane.notify.records import ClaimedDelivery, DeliveryStatus
from controlplane.notify.sender import Outgoing, WebhookSender
from controlplane.runtime import Backends

log = logging.getLogger(__name__)


@dataclass
class DispatchStats:
    attempts: int = 0
    refused: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    lost_leases: int = 0
    errors: int = 0
    pending: int = 0


class DispatchMetricsCollector(Collector):
    def __init__(self, stats: DispatchStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats
        p = "canary_notify"
        yield GaugeMetricFamily(
            f"{p}_pending", "Deliveries waiting in the outbox, at the last round", value=s.pending
        )
        for name, text, value in (
            ("attempts", "Webhook requests made", s.attempts),
            (
                "refused",
                "Attempts not sent: the URL, or an address its name resolved to, is refused",
                s.refused,
            ),
            ("delivered", "Deliveries a receiver accepted (2xx)", s.delivered),
            ("retried", "Attempts that failed and were scheduled again", s.retried),
            ("failed", "Deliveries given up (max attempts or max age)", s.failed),
            (
                "lost_leases",
                "Outcomes not written: the lease had passed to another dispatcher",
                s.lost_leases,
            ),
            ("errors", "Rounds that failed (database unavailable…); retried", s.errors),
        ):
            yield CounterMetricFamily(f"{p}_{name}", text, value=value)


def _epoch(at: datetime) -> float:
    return at.timestamp()


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


@dataclass
class Dispatcher:
    """A BackgroundService for the API's lifespan (controlplane.runtime)."""

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    sender: WebhookSender = field(default_factory=WebhookSender)
    identity: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{random.getrandbits(32):08x}"
    )
    # how soon a committed event goes out when nothing else wakes the dispatcher
    poll_sec: float = 0.25
    batch: int = 50
    concurrency: int = 8
    # longer than any one send (sender.timeout_sec), so a live lease is never taken
    lease_sec: float = 120.0
    base_url: str | None = None
    rand: Callable[[], float] = random.random
    stats: DispatchStats = field(default_factory=DispatchStats)
    _task: asyncio.Task[None] | None = None
    _backends: Backends | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def metrics_collector(self) -> Collector:
        return DispatchMetricsCollector(self.stats)

    async def start(self, backends: Backends) -> None:
        self._backends = backends
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._run(backends), name="notify-dispatcher")

    async def stop(self) -> None:
        """Let the round in flight finish (its outcomes written, so nothing is sent
        twice), within one exchange's timeout; then give the leases back."""
        if self._task is not None:
            self._stopping.set()
            try:
                async with asyncio.timeout(self.sender.timeout_sec + 5.0):
                    await asyncio.shield(self._task)
            except TimeoutError:
                await cancel_and_wait(self._task)
            self._task = None
        if self._backends is not None:
            await self.release(self._backends)
        await self.sender.close()

    async def release(self, backends: Backends) -> None:
        """Give back this dispatcher's leases, so another sends those rows at once."""
        try:
            async with backends.database.transaction() as tx:
                await tx.run(outbox.release_claims, holder=self.identity)
        except CanaryError as exc:
            log.warning("notifications: could not release leases (%s); they run out", exc)

    async def _run(self, backends: Backends) -> None:
        while not self._stopping.is_set():
            try:
                sent = await self.run_once(backends)
            except CanaryError as exc:
                self.stats.errors += 1
                log.warning("notifications: round failed (%s); retrying", exc)
                sent = 0
            except Exception:
                # a bug must not end the announcements of a long-running process
                self.stats.errors += 1
                log.exception("notifications: round failed; retrying")
                sent = 0
            if sent == 0:
                # after a round that sent anything, the next rows of those experiments
                # may be due at once: look again without waiting
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_sec):
                        await self._stopping.wait()

    async def run_once(self, backends: Backends) -> int:
        """One round: lease what is due, send it, record the outcomes; how many sent."""
        now = utc_now(backends.clock)
        async with backends.database.transaction() as tx:
            claimed = await tx.run(
                outbox.claim_due, holder=self.identity, now=now,
                lease_until=now + timedelta(seconds=self.lease_sec), limit=self.batch,
            )  # fmt: skip
            self.stats.pending = await tx.run(outbox.pending_count)
        if not claimed:
            return 0
        gate = asyncio.Semaphore(self.concurrency)

        async def one(delivery: ClaimedDelivery) -> None:
            async with gate:
                await self._deliver(backends, delivery)

        # every delivery finishes (and records its outcome) before the round ends, even
        # when one fails: left running unawaited, a sent delivery could go unrecorded
        # once stop() released its lease, and be sent again
        outcomes = await asyncio.gather(*(one(d) for d in claimed), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return len(claimed)

    async def _deliver(self, backends: Backends, delivery: ClaimedDelivery) -> None:
        attempt = delivery.attempts + 1
        try:
            body = render(delivery.event, delivery.format, base_url=self.base_url)
        except Exception as exc:
            # the stored evidence is not JSON a receiver could read (or the renderer has
            # a bug): no retry mends it, and the row must not stay pending unrecorded
            await self._record(
                backends,
                delivery,
                attempt,
                AttemptResult(status=None, error=f"unrenderable event: {exc}"),
                final=True,
            )
            return
        outgoing = Outgoing(
            url=delivery.url,
            secret=delivery.secret,
            body=body,
            event_id=delivery.event.event_id,
            delivery_id=delivery.delivery_id,
            attempt=attempt,
        )
        result = await self.sender.send(outgoing, timestamp=int(backends.clock.now()))
        self.stats.attempts += 1
        if result.refused:
            self.stats.refused += 1
        await self._record(backends, delivery, attempt, result)

    async def _record(
        self,
        backends: Backends,
        delivery: ClaimedDelivery,
        attempt: int,
        result: AttemptResult,
        *,
        final: bool = False,
    ) -> None:
        now = backends.clock.now()
        verdict = GiveUp(result.describe()) if final else after_attempt(
            self.policy, result=result, attempts=attempt,
            queued_at=_epoch(delivery.created_at), now=now, jitter=self.rand() % 1.0,
        )  # fmt: skip
        error = None if result.delivered else result.describe()
        next_at = None
        if isinstance(verdict, Delivered):
            status = DeliveryStatus.DELIVERED
        elif isinstance(verdict, RetryAt):
            status, next_at = DeliveryStatus.PENDING, _at(verdict.at)
        else:
            assert isinstance(verdict, GiveUp)
            status, error = DeliveryStatus.FAILED, verdict.reason
        async with backends.database.transaction() as tx:
            kept = await tx.run(
                outbox.record_attempt, delivery_id=delivery.delivery_id, holder=self.identity,
                at=_at(now), status=status, http_status=result.status, error=error,
                next_attempt_at=next_at,
            )  # fmt: skip
        if not kept:
            self.stats.lost_leases += 1
            return
        if status is DeliveryStatus.DELIVERED:
            self.stats.delivered += 1
        elif status is DeliveryStatus.PENDING:
            self.stats.retried += 1
        else:
            self.stats.failed += 1
            log.warning(
                "notification %d (event %d) failed: %s",
                delivery.delivery_id,
                delivery.event.event_id,
                error,
            )


def dispatcher_for(settings: Settings) -> Dispatcher:
    """The dispatcher `canary serve` and `canary dev` run, configured by CANARY_NOTIFY_*."""
    if settings.dashboard_base_url is None:
        log.info("notifications carry no link to the dashboard: CANARY_PUBLIC_URL is not set")
    return Dispatcher(
        policy=RetryPolicy(
            max_attempts=settings.notify_max_attempts,
            max_age_sec=settings.notify_max_age_sec,
            max_delay_sec=min(900.0, settings.notify_max_age_sec),
        ),
        sender=WebhookSender(
            policy=settings.notify_policy,
            timeout_sec=settings.notify_timeout_sec,
            connect_timeout_sec=min(5.0, settings.notify_timeout_sec),
        ),
        base_url=settings.dashboard_base_url,
    )
