"""The history's one writer: the controller's leader records what it judged.

    observe (per evaluation: is a point due?) and observe_metrics (a new reading of
    a provider metric?) → flush (once a round, one transaction) → keep (per round:
    merge what is old, and what ended)

The controller reads every running experiment's windows several times a second
anyway; recording them there costs one insert of a few rows per second. Writing
never stops the controller: points wait in a bounded buffer while the database is
away (the oldest dropped first, counted), and a failed merge is tried next time.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.history.metric_points import MetricPoint, new_readings
from controlplane.history.points import (
    ENDED_POINTS,
    RAW_RETENTION_SEC,
    RETAINED_BUCKET_SEC,
    HistoryPoint,
    point_due,
    point_of,
)
from controlplane.history.store import HistoryStore, ended_width
from controlplane.kernel.errors import CanaryError
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.providers.evidence import MetricEvidence

log = logging.getLogger(__name__)

# ten minutes of 50 experiments; beyond that the oldest points go first
MAX_PENDING = 30_000
# how often a running experiment's points older than RAW_RETENTION_SEC are merged
RETAIN_EVERY_SEC = 60.0
# at most this many of those merges (one transaction each) in one round: all running
# experiments fall due together (a new leader, a minute later), and N merges in one
# round would delay every evaluation of that round by N transactions (decision 0031)
RETAIN_PER_ROUND = 16


def due_for_retention(
    active: Collection[int],
    retained_at: Mapping[int, float],
    now: float,
    *,
    every: float = RETAIN_EVERY_SEC,
    limit: int = RETAIN_PER_ROUND,
) -> list[int]:
    """The experiments whose old points are merged this round (pure): those not merged
    for `every` seconds, the longest waiting (never merged: first) first, at most
    `limit`. At 4 rounds a second, 16 a round cycle 3,840 experiments a minute."""
    due = [e for e in active if e not in retained_at or now - retained_at[e] >= every]
    due.sort(key=lambda e: (retained_at.get(e, float("-inf")), e))
    return due[:limit]


@dataclass
class HistoryStats:
    written: int = 0
    dropped: int = 0
    write_failures: int = 0
    compactions: int = 0


@dataclass
class HistoryRecorder:
    max_pending: int = MAX_PENDING
    ended_points: int = ENDED_POINTS
    retain_per_round: int = RETAIN_PER_ROUND
    stats: HistoryStats = field(default_factory=HistoryStats)
    _last: dict[int, int] = field(default_factory=dict)
    _pending: deque[HistoryPoint] = field(default_factory=deque)
    # per experiment and metric, the `read_at` of the reading last queued
    _last_read: dict[int, dict[str, float]] = field(default_factory=dict)
    _pending_metrics: deque[MetricPoint] = field(default_factory=deque)
    _retained_at: dict[int, float] = field(default_factory=dict)
    # experiments seen running this term; ended ones are merged when they leave
    _seen: set[int] = field(default_factory=set)
    _caught_up: bool = False

    def new_term(self) -> None:
        """Forget what another term did: a new leader checks the ended ones once."""
        self._caught_up = False
        self._retained_at.clear()

    def observe(
        self,
        experiment_id: int,
        snapshots: Mapping[str, WindowSnapshot],
        rule: BreakerRule,
        canary_bp: int,
        now: float,
    ) -> None:
        """Queue a point when this second has none yet."""
        self._seen.add(experiment_id)
        if not point_due(self._last.get(experiment_id), now):
            return
        self._last[experiment_id] = int(now)
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
            self.stats.dropped += 1
        self._pending.append(point_of(experiment_id, snapshots, rule, canary_bp, now))

    def observe_metrics(
        self,
        experiment_id: int,
        specs: Sequence[MetricSpec],
        evidence: Mapping[str, MetricEvidence],
    ) -> None:
        """Queue a point per metric read anew since the last call (one per reading)."""
        last = self._last_read.setdefault(experiment_id, {})
        for point in new_readings(experiment_id, specs, evidence, last):
            reading = evidence[point.name]
            last[point.name] = reading.read_at
            if len(self._pending_metrics) >= self.max_pending:
                self._pending_metrics.popleft()
                self.stats.dropped += 1
            self._pending_metrics.append(point)
        # a metric taken out of the rule leaves its last reading behind
        for name in [n for n in last if n not in {s.name for s in specs}]:
            del last[name]

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._pending_metrics)

    async def flush(self, store: HistoryStore) -> None:
        """Write what is queued, in one transaction; kept for the next round on failure."""
        if not self._pending and not self._pending_metrics:
            return
        batch = list(self._pending)
        metrics = list(self._pending_metrics)
        try:
            await store.append(batch, metrics)
        except CanaryError as exc:
            self.stats.write_failures += 1
            log.warning(
                "history: %d points and %d metric readings not written yet: %s",
                len(batch), len(metrics), exc,
            )  # fmt: skip
            return
        for _ in batch:
            self._pending.popleft()
        for _ in metrics:
            self._pending_metrics.popleft()
        self.stats.written += len(batch) + len(metrics)

    async def keep(self, store: HistoryStore, active: Collection[int], now: float) -> None:
        """Bound what is stored: per-second points older than a day merge by minute;
        an ended experiment merges into at most `ended_points` points."""
        try:
            await self._merge_ended(store, active)
            await self._merge_old(store, active, now)
        except CanaryError as exc:
            log.warning("history: merging old points failed (tried again later): %s", exc)

    async def _merge_ended(self, store: HistoryStore, active: Collection[int]) -> None:
        left = self._seen - set(active)
        ids: Collection[int] | None
        if not self._caught_up:
            ids = None
        elif left:
            ids = left
        else:
            return
        spans = await store.spans(experiment_ids=ids)
        metric_spans = await store.metric_spans(experiment_ids=ids)
        self._caught_up = True
        for experiment_id in sorted(set(spans) | set(metric_spans)):
            # one width over both spans: the windows and each metric keep at most
            # `ended_points` points
            found = [f[experiment_id] for f in (spans, metric_spans) if experiment_id in f]
            points = max(n for n, _, _ in found)
            first = min(a for _, a, _ in found)
            last = max(b for _, _, b in found)
            width = ended_width(points, first, last, self.ended_points)
            if width is not None:
                await store.compact(
                    experiment_id=experiment_id, before=None, origin=first, width=width
                )
                self.stats.compactions += 1
        self.hand_over(left)

    @property
    def seen(self) -> frozenset[int]:
        """The experiments observed since they were last handed over or merged."""
        return frozenset(self._seen)

    def hand_over(self, experiment_ids: Collection[int]) -> None:
        """Forget experiments another replica judges now (decision 0057), or ended ones
        just merged: still running elsewhere, they are not this recorder's to merge."""
        for experiment_id in experiment_ids:
            self._seen.discard(experiment_id)
            self._last.pop(experiment_id, None)
            self._last_read.pop(experiment_id, None)
            self._retained_at.pop(experiment_id, None)

    async def _merge_old(self, store: HistoryStore, active: Collection[int], now: float) -> None:
        due = due_for_retention(active, self._retained_at, now, limit=self.retain_per_round)
        for experiment_id in due:
            self._retained_at[experiment_id] = now
            merged = await store.compact(
                experiment_id=experiment_id,
                before=int(now) - RAW_RETENTION_SEC,
                origin=0,
                width=RETAINED_BUCKET_SEC,
            )
            if merged:
                self.stats.compactions += 1
