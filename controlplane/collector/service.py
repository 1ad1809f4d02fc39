"""The collector process: sample batches in (consumer group), window snapshots out.

One loop, named steps: read new entries → apply them → (each tick) publish the
changed experiments and ack what those publishes contain → (now and then) claim a
dead consumer's idle entries and refresh the list of services. Configuration (rules,
routes and the experiments' window rules from etcd) is watched in a task of its own
and applied live; an experiment's window rule (written by the leader from the
experiment's own rule) takes precedence over its service's rule;
an experiment whose routes all ended is forgotten once its grace has passed
(lifecycle.py), so memory follows the live experiments.

Ordering is what makes counts exact (see sharding.py): an entry is acked only after
a partial window containing it is on the board.

Entries are untrusted: each passes screening.screen_entry (signature when keys are
configured, strict decode, plausible times) on its own, and one that fails is counted
under its reason, acked and skipped without touching the others of the same read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from controlplane.collector.alarm_screen import (
    ABOVE,
    FAILURES,
    LATENCY,
    PastWindows,
    canary_window,
    slow_bin,
    turned_worse,
)
from controlplane.collector.lifecycle import ExperimentLifecycle
from controlplane.collector.pacing import check_publish_every, held_back
from controlplane.collector.pending_page import PendingPage
from controlplane.collector.screening import (
    DROP_REASONS,
    INTERNAL_ERROR,
    MAX_VARIANTS_PER_EXPERIMENT,
    TOO_MANY_VARIANTS,
    DropLog,
    excerpt,
    experiment_of,
    screen_entry,
)
from controlplane.collector.second_partials import (
    COMPACT_VERSION,
    SECOND_PARTIAL_VERSIONS,
    SlotLedger,
    export_head_and_seconds,
    own_fields,
)
from controlplane.collector.sharding import (
    MALFORMED,
    PART_PREFIX,
    PARTIAL_VERSION,
    Partial,
    expired_partials,
    export_partial,
    last_second,
    merge_snapshots,
    parse_partials,
    part_field,
    unacked_elsewhere,
)
from controlplane.collector.windows import (
    DEFAULT_SKEW_SEC,
    ExperimentWindow,
    LogMapping,
    WindowConfig,
)
from controlplane.kernel.alarms import Alarms
from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import BatchMeta, RawBatch
from controlplane.kernel.errors import BackendError, CanaryError, CodecError, ValidationFailed
from controlplane.kernel.informer import PrefixInformer
from controlplane.kernel.keys import (
    COLLECTOR_GROUP,
    EtcdKeys,
    is_experiment_id,
    is_service_name,
)
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.log_limit import EveryInterval
from controlplane.kernel.routes import parse_route
from controlplane.kernel.rules import parse_rule
from controlplane.kernel.sample_auth import SampleVerifier
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.streams import (
    NOTHING_PENDING,
    SampleStream,
    SnapshotBoard,
    StreamEntry,
)
from controlplane.kernel.window_rules import parse_window_rule

log = logging.getLogger("canary.collector")
ALARM_KINDS = (FAILURES, ABOVE, LATENCY)
# an experiment's alarm is raised again at most this often while its canary stays
# worse: the controller looks at most once a tick, and a ZADD a publish is waste
ALARM_EVERY_SEC = 0.5

CONFIG_SOURCES = ("rules", "routes", "windows")
DEDUP_HORIZON = 65_536  # batches per source remembered below its high-water mark
HEARTBEAT_SEC = 5.0  # republish an unchanged experiment this often, so age stays low
# the merged plain `<variant>` view and its `canary:decisions` entry, per experiment, at
# most this often (an idle experiment's heartbeat carries it each time): the partial,
# what counts and what the controller reads, goes out with every publish
# (docs/decisions/0031-round-cost-at-scale.md, "The collector's publish")
MERGED_EVERY_SEC = HEARTBEAT_SEC
# The loop is shared with the admin endpoint (/healthz, /metrics): ingest and publish
# give it a turn after this many entries applied / experiments exported, so a probe
# is answered within a few tens of milliseconds however much is waiting (decision
# 0058; at N = 1,000 a tick's exports held the loop for seconds, and a probe timed out)
APPLY_SLICE = 32
EXPORT_SLICE = 16
# a tick's partials are written this many experiments at a time (one round trip each)
PUBLISH_CHUNK = 64
BACKEND_RETRY = BackoffPolicy(initial=0.05, maximum=2.0)


class SourceDedup:
    """Has (src, seq) been applied? A high-water mark per source plus the recent seqs.

    seq increases per source, but several collectors share a source's batches and
    claims deliver old ones late, so seqs below the mark are still possible: each
    source remembers the seqs within DEDUP_HORIZON of its mark. Older than that is
    treated as a re-delivery. The number of sources is bounded too (LRU).
    """

    def __init__(self, *, horizon: int = DEDUP_HORIZON, max_sources: int = 100_000) -> None:
        self._horizon = horizon
        self._max_sources = max_sources
        self._sources: OrderedDict[str, tuple[int, set[int]]] = OrderedDict()

    def seen(self, source: str, seq: int) -> bool:
        state = self._sources.get(source)
        if state is None:
            return False
        mark, recent = state
        return seq <= mark - self._horizon or seq in recent

    def add(self, source: str, seq: int) -> None:
        mark, recent = self._sources.pop(source, (seq, set()))
        recent.add(seq)
        mark = max(mark, seq)
        if len(recent) > 2 * self._horizon:
            recent = {s for s in recent if s > mark - self._horizon}
        self._sources[source] = (mark, recent)
        if len(self._sources) > self._max_sources:
            self._sources.popitem(last=False)


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ingested = Counter(
            "canary_collector_samples_ingested", "samples applied to windows", registry=registry
        )
        self.late = Counter(
            "canary_collector_samples_late", "samples older than the window, dropped",
            registry=registry,
        )  # fmt: skip
        self.clamped = Counter(
            "canary_collector_samples_clamped", "samples ahead of the clock, clamped to now",
            registry=registry,
        )  # fmt: skip
        self.shed = Counter(
            "canary_collector_shed",
            "requests the sidecars shed, from their tallies (never latency samples)",
            ["service"],
            registry=registry,
        )
        self.without_first_byte = Counter(
            "canary_collector_samples_without_first_byte",
            "samples from batches older than version 2: in the total window only",
            registry=registry,
        )
        self.corrupt = Counter(
            "canary_collector_entries_corrupt",
            "stream entries dropped for any reason (acked); by reason: batches_dropped",
            registry=registry,
        )
        self.dropped = Counter(
            "canary_collector_batches_dropped",
            "sample batches dropped and acked, by reason (unsigned, bad_signature, …)",
            ["reason"], registry=registry,
        )  # fmt: skip
        for reason in DROP_REASONS:
            self.dropped.labels(reason)  # every reason shows, at 0, before its first drop
        self.authenticated = Gauge(
            "canary_collector_samples_authenticated",
            "1: only batches signed with a configured key are counted; 0: unsigned accepted",
            registry=registry,
        )
        self.duplicates = Counter(
            "canary_collector_batches_duplicate", "re-delivered batches not counted again",
            registry=registry,
        )  # fmt: skip
        self.claimed = Counter(
            "canary_collector_entries_claimed", "idle entries claimed from other consumers",
            registry=registry,
        )  # fmt: skip
        self.config_rejected = Counter(
            "canary_collector_config_rejected",
            "malformed rules, routes or window rules in etcd, ignored",
            registry=registry,
        )  # fmt: skip
        # written beside the registry's families (`exposition`, pending_page.py)
        self.pending = PendingPage()
        self.publishes_paced = Counter(
            "canary_collector_publishes_paced",
            "ticks at which a changed experiment was not published: published less than "
            "--publish-every ago, and its canary did not turn worse",
            registry=registry,
        )  # fmt: skip
        self.snapshot_age = Gauge(
            "canary_collector_snapshot_age_seconds", "seconds since the last publish",
            registry=registry,
        )  # fmt: skip
        self.alarms = Counter(
            "canary_collector_alarms",
            "alarms raised: an experiment's canary turned worse in its last seconds "
            "(judged at the controller's next tick), by what it turned worse on",
            ["on"], registry=registry,
        )  # fmt: skip
        for kind in ALARM_KINDS:
            self.alarms.labels(kind)
        self.alarm_errors = Counter(
            "canary_collector_alarm_errors",
            "alarms not written (the board failed): the round judges those experiments",
            registry=registry,
        )  # fmt: skip
        self.forgotten = Counter(
            "canary_collector_experiments_forgotten",
            "ended experiments whose windows and partial were dropped after their grace",
            registry=registry,
        )
        self.experiments = Gauge(
            "canary_collector_experiments", "experiments with windows held in memory",
            registry=registry,
        )  # fmt: skip
        self.publishes = Counter(
            "canary_collector_publishes", "experiment snapshots published", registry=registry
        )
        self.published_bytes = Counter(
            "canary_collector_published_bytes",
            "bytes of partial-window fields written to the stats hashes",
            registry=registry,
        )
        self.malformed_partials = Counter(
            "canary_collector_malformed_partials",
            "merged views built without the other collectors' partials, one of them damaged",
            registry=registry,
        )
        self.partials_removed = Counter(
            "canary_collector_partials_removed",
            "other collectors' partial windows removed from stats hashes, out of every window",
            registry=registry,
        )
        self.admin_unauthorized = Counter(
            "canary_collector_admin_unauthorized",
            "admin requests refused for a missing or wrong bearer token",
            registry=registry,
        )
        self.config_relists = Counter(
            "canary_collector_config_relists",
            "rules, routes or window rules read again from etcd after a lost watch, by source",
            ["source"], registry=registry,
        )  # fmt: skip
        self.backend_errors = Counter(
            "canary_collector_backend_errors",
            "rounds failed because Redis was unreachable or refused (then retried)",
            registry=registry,
        )
        self.config_watch_errors = Counter(
            "canary_collector_config_watch_errors",
            "failed reads or lost watches of rules, routes or window rules, by source",
            ["source"], registry=registry,
        )  # fmt: skip
        for source in CONFIG_SOURCES:
            self.config_relists.labels(source)
            self.config_watch_errors.labels(source)

    def exposition(self) -> bytes:
        """The collector's /metrics page: the registry's families, then the pending
        gauge's page."""
        return generate_latest(self.registry) + self.pending.text()


class _ConfigFeed:
    """One etcd prefix (rules, routes or windows) fed to the collector, with metrics hooks."""

    def __init__(
        self,
        source: str,
        prefix: str,
        apply: Callable[[str, bytes | None], None],
        metrics: CollectorMetrics,
    ) -> None:
        self.source = source
        self.prefix = prefix
        self._apply = apply
        self._metrics = metrics

    def on_put(self, key: str, value: bytes, mod_revision: int) -> None:
        self._apply(key[len(self.prefix) :], value)

    def on_delete(self, key: str) -> None:
        self._apply(key[len(self.prefix) :], None)

    def listed(self, *, relist: bool) -> None:
        if relist:
            self._metrics.config_relists.labels(self.source).inc()

    def failed(self, error: Exception, *, retry_in: float) -> None:
        self._metrics.config_watch_errors.labels(self.source).inc()


@dataclass
class _Held:
    """What an experiment has applied since its last publish: acked after the next one."""

    entries: list[tuple[str, str]] = field(default_factory=list)  # (service, entry id)


class Collector:
    """Consumes samples streams through the `collectors` group; publishes snapshots."""

    def __init__(
        self,
        streams: SampleStream,
        board: SnapshotBoard,
        kv: KeyValueStore,
        keys: EtcdKeys,
        *,
        consumer_name: str,
        clock: Clock,
        tick: float = 0.1,
        publish_every: float = 0.0,
        coalesce: bool = False,
        block_ms: int = 50,
        count: int = 200,
        claim_idle_ms: int = 30_000,
        claim_every: float = 1.0,
        services_every: float = 2.0,
        skew_sec: float = DEFAULT_SKEW_SEC,
        alpha: float = 0.01,
        default_window_sec: int = 60,
        registry: CollectorRegistry | None = None,
        sample_keys: SampleKeys | None = None,
        partial_format: int = COMPACT_VERSION,
    ) -> None:
        if partial_format not in (PARTIAL_VERSION, *SECOND_PARTIAL_VERSIONS):
            raise ValueError(f"partial format: 1, 2, 3 or 4, not {partial_format!r}")
        # 4: 3 with its unit rows and distinct units written smaller (decision 0080);
        # 3: the head and the seconds that changed, a paired first byte without what
        # it shares with its total (decision 0072); 2: the same with it (decision
        # 0058); 1: the whole window in one field; 3, 2 and 1 for readers not upgraded
        # yet in a rolling upgrade
        self.partial_format = partial_format
        self._ledgers: dict[str, SlotLedger] = {}
        self.streams = streams
        self.board = board
        # a board that keeps alarms (Redis, in-process) is told of canaries turned worse
        self._alarm_board = board if isinstance(board, Alarms) else None
        self._alarms_due: dict[str, float] = {}
        self._alarmed_at: dict[str, float] = {}
        # per experiment, the screen's slow bin and the second it was found in
        self._slow_bins: dict[str, tuple[int, int | None]] = {}
        self._past_windows = PastWindows()
        self._screened_at: dict[str, float] = {}
        self.kv = kv
        self.keys = keys
        self.name = consumer_name
        self.clock = clock
        self.tick = tick
        # a changed experiment at most this often, but for one that turned worse (pacing.py)
        self.publish_every = check_publish_every(publish_every)
        # an experiment's batches of a tick applied together at the tick (pacing.py)
        self.coalesce = coalesce
        self._unapplied: dict[str, list[RawBatch]] = {}
        self.block_ms = block_ms
        self.count = count
        self.claim_idle_ms = claim_idle_ms
        self.claim_every = claim_every
        self.services_every = services_every
        self.skew_sec = skew_sec
        self.mapping = LogMapping(alpha)
        self.default_config = WindowConfig(window_sec=default_window_sec)
        self.metrics = CollectorMetrics(registry or CollectorRegistry())
        # with keys, unsigned and badly signed batches are refused; without, accepted
        self.verifier = SampleVerifier(sample_keys) if sample_keys is not None else None
        self.metrics.authenticated.set(1 if self.verifier is not None else 0)
        self._drop_log = DropLog(log, clock)
        # a damaged partial is counted always, logged once a minute per experiment
        self._malformed_logged = EveryInterval()
        self.configs: dict[str, WindowConfig] = {}
        # experiments with a rule of their own: theirs, in place of the service's
        self.experiment_configs: dict[str, WindowConfig] = {}
        self.route_services: set[str] = set()
        self.windows: dict[str, ExperimentWindow] = {}
        self.experiment_service: dict[str, str] = {}
        self.lifecycle = ExperimentLifecycle()
        # called with an ended experiment's window just before it is dropped
        self.on_forget: Callable[[str, ExperimentWindow], None] | None = None
        self._held: dict[str, _Held] = {}
        self._ack_now: dict[str, list[str]] = {}  # corrupt entries: ack without a publish
        self._dedup = SourceDedup()
        self._grouped: set[str] = set()
        self._stream_services: set[str] = set()
        self._last_publish: dict[str, float] = {}
        self._last_merged: dict[str, float] = {}
        self._last_tick = -math.inf
        self._last_claim = -math.inf
        self._last_services = -math.inf
        self.informers: list[PrefixInformer] = []
        # the next read, started before applying a full one (a backlog), so that Redis
        # prepares it while this process applies the previous one
        self._prefetch: asyncio.Task[list[StreamEntry]] | None = None
        self.config_loaded = asyncio.Event()
        self.last_loop_ok: float | None = None

    # --- configuration ------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        """Are sample batches verified (keys configured)? /readyz and a gauge say so."""
        return self.verifier is not None

    @property
    def services(self) -> set[str]:
        # service names from etcd keys and stream keys become Redis keys: only
        # well-formed ones (keys.is_service_name)
        found = set(self.configs) | self.route_services | self._stream_services
        return {service for service in found if is_service_name(service)}

    def config_for(self, service: str) -> WindowConfig:
        return self.configs.get(service, self.default_config)

    def config_of_experiment(self, experiment: str) -> WindowConfig:
        """The experiment's window rule if it has one; else its service's rule."""
        own = self.experiment_configs.get(experiment)
        if own is not None:
            return own
        return self.config_for(self.experiment_service.get(experiment, ""))

    def _apply_rule(self, service: str, value: bytes | None) -> None:
        if value is None:
            self.configs.pop(service, None)
        else:
            try:
                rule = parse_rule(value)
            except ValidationFailed as exc:
                self.metrics.config_rejected.inc()
                log.warning("rejected rule for %s: %s", service, exc)
                return
            if rule.service != service:
                self.metrics.config_rejected.inc()
                log.warning("rejected rule under %s: it names service %s", service, rule.service)
                return
            self.configs[service] = WindowConfig.from_rule(rule)
        now = self.clock.now()
        for experiment, window in self.windows.items():
            if self.experiment_service.get(experiment) == service:
                window.reconfigure(self.config_of_experiment(experiment), now)

    def _apply_window(self, experiment: str, value: bytes | None) -> None:
        """An experiment's window rule: a bad one is counted and ignored, as if absent
        (its service's rule applies, which is what the controller falls back to)."""
        if value is not None and not is_experiment_id(experiment):
            self.metrics.config_rejected.inc()
            log.warning("rejected window rule under a malformed experiment id")
            value = None
        elif value is not None:
            try:
                self.experiment_configs[experiment] = WindowConfig.from_rule(
                    parse_window_rule(value)
                )
            except ValidationFailed as exc:
                self.metrics.config_rejected.inc()
                log.warning("rejected window rule for experiment %s: %s", experiment, exc)
                value = None
        if value is None:
            self.experiment_configs.pop(experiment, None)
        window = self.windows.get(experiment)
        if window is not None:
            window.reconfigure(self.config_of_experiment(experiment), self.clock.now())

    def _apply_route(self, service: str, value: bytes | None) -> None:
        if value is None:
            self.route_services.discard(service)
            self.lifecycle.route(service, None, None, self.clock.now())
            return
        try:
            route = parse_route(value)
        except ValidationFailed as exc:
            self.metrics.config_rejected.inc()
            log.warning("rejected route for %s: %s", service, exc)
            return
        self.route_services.add(service)
        self.lifecycle.route(service, str(route.experiment), route.state, self.clock.now())

    async def load_config(self) -> None:
        """Read rules, routes and window rules, then follow them (the shared
        list-then-watch loop).

        Returns once all were read; while etcd does not answer it keeps trying, with
        backoff, and /readyz says not ready.
        """
        if not self.informers:
            for source, prefix, apply in (
                ("rules", self.keys.rules_prefix, self._apply_rule),
                ("routes", self.keys.routes_prefix, self._apply_route),
                ("windows", self.keys.windows_prefix, self._apply_window),
            ):
                feed = _ConfigFeed(source, prefix, apply, self.metrics)
                informer = PrefixInformer(
                    self.kv, prefix, feed, name=f"collector-{source}", observer=feed,
                    clock=self.clock,
                )  # fmt: skip
                informer.start()
                self.informers.append(informer)
        for informer in self.informers:
            await informer.wait_synced()
        self.config_loaded.set()

    async def stop_watching(self) -> None:
        """Stop following the configuration; what was read stays in force."""
        informers, self.informers = self.informers, []
        for informer in informers:
            await informer.stop()

    # --- the loop -----------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set; then publish and ack what is held, and return."""
        try:
            if not self.config_loaded.is_set():
                # etcd may not answer yet: a stop must still end the wait for it
                loading = asyncio.create_task(self.load_config())
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for waiting in (loading, stopping):
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
            backoff = Backoff(BACKEND_RETRY)
            while not stop.is_set():
                try:
                    await self.step()
                except BackendError as exc:
                    # Redis away or failing over: what was read and not published
                    # stays held (listed as unacked) and what was not read stays in
                    # the stream, so the next round resumes exactly
                    self.metrics.backend_errors.inc()
                    delay = backoff.next_delay()
                    log.warning("round failed, retrying in %.2f s: %s", delay, exc)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await stop.wait()
                else:
                    backoff.reset()
        finally:
            await self.flush()
            await self.stop_watching()

    async def step(self) -> None:
        """One round: refresh services, claim, read, apply, and publish when due."""
        mono = self.clock.monotonic()
        if mono - self._last_services >= self.services_every:
            self._last_services = mono
            await self._refresh_services()
        if mono - self._last_claim >= self.claim_every:
            self._last_claim = mono
            await self._claim()
        services = sorted(self._grouped)
        if self._prefetch is not None:
            entries = await self._take_prefetch()
            self._start_prefetch(services, entries)
            await self.apply_in_slices(entries)
        elif services:
            # block no longer than until the next tick, so a publish is never late by
            # a whole empty read
            until_tick = self.tick - (self.clock.monotonic() - self._last_tick)
            block = math.ceil(min(max(0.0, until_tick * 1000), float(self.block_ms)))
            entries = await self.streams.read_group(
                services, COLLECTOR_GROUP, self.name, count=self.count, block_ms=block
            )
            self._start_prefetch(services, entries)
            await self.apply_in_slices(entries)
        else:
            await asyncio.sleep(self.block_ms / 1000)  # nothing to read yet: wait for discovery
        if self.clock.monotonic() - self._last_tick >= self.tick:
            await self.publish_due()
        self.last_loop_ok = self.clock.monotonic()

    def _start_prefetch(self, services: list[str], entries: Sequence[StreamEntry]) -> None:
        """After a full read, start the next one (non-blocking) before applying this one."""
        if services and len(entries) >= self.count:
            self._prefetch = asyncio.create_task(
                self.streams.read_group(
                    services, COLLECTOR_GROUP, self.name, count=self.count, block_ms=0
                )
            )

    async def _take_prefetch(self) -> list[StreamEntry]:
        task, self._prefetch = self._prefetch, None
        return [] if task is None else await task

    async def _refresh_services(self) -> None:
        self._stream_services = set(await self.streams.services())
        for service in self.services - self._grouped:
            await self.streams.ensure_group(service, COLLECTOR_GROUP)
            self._grouped.add(service)

    async def _claim(self) -> None:
        """Claim other consumers' idle entries. One pipelined look at every stream
        says which have any (and sets the pending gauges); only those are claimed
        from: a look then a claim per stream, one stream after the other, took
        2,000 round trips a second over 1,000 streams (decision 0033)."""
        services = sorted(self._grouped)
        summaries = await self.streams.pending_many(
            COLLECTOR_GROUP, services, min_idle_ms=self.claim_idle_ms
        )
        self.metrics.pending.set_all(
            {service: summaries.get(service, NOTHING_PENDING).pending for service in services}
        )
        for service in services:
            if summaries.get(service, NOTHING_PENDING).idle:
                await self._claim_from(service)

    async def _claim_from(self, service: str) -> None:
        while True:
            entries = await self.streams.claim_idle(
                service, COLLECTOR_GROUP, self.name,
                min_idle_ms=self.claim_idle_ms, count=self.count,
            )  # fmt: skip
            if not entries:
                break
            self.metrics.claimed.inc(len(entries))
            listed: set[str] = set()
            # only well-formed ids are looked up (a key is made of them); the
            # entries themselves are screened in apply like any others
            for experiment in {experiment_of(e) for e in entries} - {None}:
                assert experiment is not None
                listed |= unacked_elsewhere(await self.board.read(experiment), own=self.name)
            self.apply(entries, claimed_unacked=frozenset(listed))
            if len(entries) < self.count:
                break

    async def apply_in_slices(self, entries: Sequence[StreamEntry]) -> None:
        """`apply` a read APPLY_SLICE entries at a time, the loop served in between."""
        for i in range(0, len(entries), APPLY_SLICE):
            if i:
                await asyncio.sleep(0)
            self.apply(entries[i : i + APPLY_SLICE], claimed_unacked=frozenset())

    def apply(self, entries: Sequence[StreamEntry], *, claimed_unacked: frozenset[str]) -> None:
        """Screen, de-duplicate and apply entries; nothing here awaits.

        A bad entry is dropped on its own (counted, acked with the next publish); the
        good ones of the same read are applied exactly as if it had not been there.
        """
        if not entries:
            return
        now = self.clock.now()
        # columns stay views into the payloads; each experiment's batches are
        # concatenated and ingested once per read (see ExperimentWindow.record_many)
        by_experiment: dict[str, list[RawBatch]] = {}
        for entry in entries:
            try:
                meta, batch = screen_entry(entry, now, self.verifier)
                self._check_variants(meta.experiment, batch, by_experiment)
            except CodecError as exc:
                self._drop(entry, exc.reason, str(exc))
                continue
            self.experiment_service.setdefault(meta.experiment, entry.service)
            self._window(meta.experiment, now)  # so a publish (and the ack) follows
            held = self._held.setdefault(meta.experiment, _Held())
            # a handled entry is held (and listed as unacked) until the next publish
            held.entries.append((entry.service, entry.entry_id))
            if self._is_duplicate(entry, meta, claimed_unacked):
                self.metrics.duplicates.inc()
                continue
            self._dedup.add(meta.source, meta.seq)
            by_experiment.setdefault(meta.experiment, []).append(batch)
        for experiment, batches in by_experiment.items():
            if self.coalesce:
                self._unapplied.setdefault(experiment, []).extend(batches)
            else:
                self._ingest(experiment, batches, now)

    def _ingest_unapplied(self, experiment: str, now: float) -> None:
        """An experiment's batches read since its last tick, into its window at once."""
        batches = self._unapplied.pop(experiment, None)
        if batches:
            self._ingest(experiment, batches, now)

    def _ingest(self, experiment: str, batches: list[RawBatch], now: float) -> None:
        """Screened batches into their experiment's window, counted."""
        window = self._window(experiment, now)
        counters = window.counters
        before = (
            counters.ingested, counters.late, counters.clamped, counters.without_first_byte,
            counters.shed,
        )  # fmt: skip
        try:
            window.record_many(batches, now)
        except Exception as exc:  # a bug, not bad input (screened): never stop the loop
            self.metrics.dropped.labels(INTERNAL_ERROR).inc(len(batches))
            log.exception("experiment %s: %d batches not applied", experiment, len(batches))
            self._drop_log.dropped(INTERNAL_ERROR, "-", "-", type(exc).__name__)
        self.metrics.ingested.inc(window.counters.ingested - before[0])
        self.metrics.late.inc(window.counters.late - before[1])
        self.metrics.clamped.inc(window.counters.clamped - before[2])
        self.metrics.without_first_byte.inc(window.counters.without_first_byte - before[3])
        if window.counters.shed > before[4]:
            service = self.experiment_service.get(experiment, "")
            self.metrics.shed.labels(service).inc(window.counters.shed - before[4])

    def _check_variants(
        self, experiment: str, batch: RawBatch, pending: Mapping[str, list[RawBatch]]
    ) -> None:
        """Refuse a batch that would give its experiment too many variants (a ring each)."""
        window = self.windows.get(experiment)
        known = set(window.variants) if window is not None else set()
        if known.issuperset(batch.variants):
            return
        for other in (*pending.get(experiment, ()), *self._unapplied.get(experiment, ())):
            known.update(other.variants)
        if len(known | set(batch.variants)) > MAX_VARIANTS_PER_EXPERIMENT:
            raise CodecError(
                f"batch would give experiment {experiment} more than "
                f"{MAX_VARIANTS_PER_EXPERIMENT} variants",
                TOO_MANY_VARIANTS,
            )

    def _drop(self, entry: StreamEntry, reason: str, detail: str) -> None:
        self.metrics.corrupt.inc()
        self.metrics.dropped.labels(reason).inc()
        self._drop_log.dropped(reason, entry.service, entry.entry_id, detail)
        self._ack_now.setdefault(entry.service, []).append(entry.entry_id)

    def _is_duplicate(
        self, entry: StreamEntry, meta: BatchMeta, claimed_unacked: frozenset[str]
    ) -> bool:
        if f"{entry.service}/{entry.entry_id}" in claimed_unacked:
            return True
        return self._dedup.seen(meta.source, meta.seq)

    def _window(self, experiment: str, now: float) -> ExperimentWindow:
        window = self.windows.get(experiment)
        if window is None:
            window = self.windows[experiment] = ExperimentWindow(
                experiment,
                self.config_of_experiment(experiment),
                clock_now=now,
                mapping=self.mapping,
                skew_sec=self.skew_sec,
            )
            self.lifecycle.revived(experiment, now)
        return window

    # --- publishing ---------------------------------------------------------

    async def publish_due(self) -> None:
        """Publish every experiment that changed (or is due a heartbeat); then ack."""
        self._last_tick = self.clock.monotonic()
        now = self.clock.now()
        # the last read was full (a next one is prefetched): entries are waiting. Then
        # no heartbeat and no merged view, only the partials of what was applied: a
        # collector behind its streams that republished every experiment it had not
        # heard from for HEARTBEAT_SEC, merged, spent its time on those and read less
        # and less (docs/decisions/0031-round-cost-at-scale.md)
        behind = self._prefetch is not None
        partial_only: list[str] = []
        for index, (experiment, window) in enumerate(list(self.windows.items())):
            if index and index % (EXPORT_SLICE * 4) == 0:
                await asyncio.sleep(0)
            self._ingest_unapplied(experiment, now)
            window.advance(now)
            held = self._held.get(experiment)
            quiet_for = now - self._last_publish.get(experiment, -math.inf)
            heartbeat = quiet_for >= HEARTBEAT_SEC and not behind
            changed = window.changed or bool(held and held.entries)
            if held_back(
                changed=changed, heartbeat=heartbeat, quiet_for=quiet_for,
                publish_every=self.publish_every,
                alarmed_ago=now - self._alarmed_at.get(experiment, -math.inf),
            ) and not self._screen(experiment, window, now):  # fmt: skip
                # paced: what changed goes out with its next publish, or at once
                # should the screen find its canary turned worse meanwhile
                self.metrics.publishes_paced.inc()
                continue
            if changed or heartbeat:
                if not behind and self._merged_due(experiment, now):
                    await self.publish(experiment, now, merged=True)
                else:
                    partial_only.append(experiment)
        # a canary that just turned worse goes out first, with its alarm; the rest in
        # chunks, each on the board as soon as it is written: one write for a
        # thousand experiments held them all back for the seconds their export took
        hot = [e for e in partial_only if self._screen(e, self.windows[e], now)]
        if hot:
            await self.publish_partials(hot, now)
        first = set(hot)
        rest = [e for e in partial_only if e not in first]
        for start in range(0, len(rest), PUBLISH_CHUNK):
            await self.publish_partials(rest[start : start + PUBLISH_CHUNK], now)
        for service, ids in list(self._ack_now.items()):
            if ids:
                await self.streams.ack(service, COLLECTOR_GROUP, ids)
        self._ack_now.clear()
        await self.forget_ended(now)
        self.metrics.experiments.set(len(self.windows))
        if self._last_publish:
            self.metrics.snapshot_age.set(max(0.0, now - max(self._last_publish.values())))

    async def publish(
        self, experiment: str, now: float, *, merged: bool | None = None
    ) -> dict[str, WindowSnapshot]:
        """Write this collector's partial window of `experiment`, then ack what it holds.

        With it (`merged`; by default when MERGED_EVERY_SEC has passed since the last
        one) the merged plain view over every collector's partial and a decisions
        entry: they cost a read of the hash and most of the CPU, and only readers
        without the partials' merge use them. Returns the merged view, or {} without.
        """
        if not (self._merged_due(experiment, now) if merged is None else merged):
            await self.publish_partials([experiment], now)
            return {}
        window = self.windows[experiment]
        held, included, own = self._own_partial(experiment, now)
        others = {
            name: raw
            for name, raw in (await self.board.read(experiment)).items()
            if name.startswith(PART_PREFIX) and name != part_field(self.name)
        }
        partials = parse_partials(others)
        expired = expired_partials(partials, now, own=self.name, retained_sec=window.retained_sec)
        gone = {p.collector for p in expired}  # they add nothing to any window: skip them
        try:
            snapshots = merge_snapshots(
                experiment,
                [p for p in partials if p.collector not in gone],
                now,
                local=window,
                local_collector=self.name,
            )
        except MALFORMED as exc:
            # another collector's partial is damaged: the merged view (a fallback for
            # readers that take no partial) holds this collector's window alone, and
            # the partials, which readers judge and report, go out as ever
            self.metrics.malformed_partials.inc()
            if self._malformed_logged.due(experiment, self.clock.monotonic()):
                log.warning("experiment %s: another collector's partial window is malformed "
                            "(%s: %s); the merged view holds this collector's window alone",
                            excerpt(experiment), type(exc).__name__, excerpt(str(exc)))  # fmt: skip
            snapshots = merge_snapshots(experiment, [], now, local=window,
                                        local_collector=self.name)  # fmt: skip
        fields = {name: snap.to_json() for name, snap in snapshots.items()} | own
        await self.board.publish(experiment, fields, decision_entry(experiment, snapshots, now))
        self._published(experiment, window, now)
        await self._raise_alarms(now)
        self._last_merged[experiment] = now
        await self._ack_included({experiment: (held, included)})
        if expired:
            await self._remove_expired(experiment, expired, others, now)
        return snapshots

    async def publish_partials(self, experiments: Sequence[str], now: float) -> None:
        """This collector's partial windows of `experiments` alone, in one round trip,
        then their entries acked in one more (a tick's publishes without the merged
        view): the same order as `publish`, every partial on the board before any ack.
        """
        if not experiments:
            return
        fields: dict[str, dict[str, str]] = {}
        included: dict[str, tuple[_Held, list[tuple[str, str]]]] = {}
        for index, experiment in enumerate(experiments):
            if index and index % EXPORT_SLICE == 0:
                await asyncio.sleep(0)
            held, entries, fields[experiment] = self._own_partial(experiment, now)
            included[experiment] = (held, entries)
        await self.board.write_many(fields)
        for experiment in experiments:
            self._published(experiment, self.windows[experiment], now)
        await self._raise_alarms(now)
        await self._ack_included(included)

    def _own_partial(
        self, experiment: str, now: float
    ) -> tuple[_Held, list[tuple[str, str]], dict[str, str]]:
        """What this collector holds of `experiment` now, and its partial's field."""
        # every held entry's samples in the window before it is listed for the ack
        self._ingest_unapplied(experiment, now)
        # held until published and acked: entries a failed publish or ack left
        # pending stay listed as unacked in the next partial, so no claimer counts
        # them again (a second ack of an entry is harmless)
        held = self._held.get(experiment, _Held())
        included = list(held.entries)
        unacked = [f"{service}/{entry_id}" for service, entry_id in included]
        window = self.windows[experiment]
        if self.partial_format in SECOND_PARTIAL_VERSIONS:
            ledger = self._ledgers.setdefault(experiment, SlotLedger())
            ledger.failed()  # seconds a write left unconfirmed (it failed) go again
            fields = export_head_and_seconds(
                window, now, head=part_field(self.name), collector=self.name,
                unacked=unacked, ledger=ledger, version=self.partial_format,
            )  # fmt: skip
        else:
            partial = export_partial(window, now, collector=self.name, unacked=unacked)
            fields = {part_field(self.name): json.dumps(partial, separators=(",", ":"))}
        self.metrics.published_bytes.inc(sum(len(k) + len(v) for k, v in fields.items()))
        self._screen(experiment, window, now)
        return held, included, fields

    def _screen(self, experiment: str, window: ExperimentWindow, now: float) -> bool:
        """An alarm for the next write if the canary just turned worse (decision 0070);
        whether one is due. Once a publish: a screen at `now` is not made again."""
        if self._alarm_board is None or not window.changed:
            return False
        if self._screened_at.get(experiment) == now:
            return experiment in self._alarms_due
        self._screened_at[experiment] = now
        if now - self._alarmed_at.get(experiment, -math.inf) < ALARM_EVERY_SEC:
            return False
        second = math.floor(now)
        cached = self._slow_bins.get(experiment)
        if cached is None or cached[0] != second:
            cached = self._slow_bins[experiment] = (second, slow_bin(window))
        past = self._past_windows.past(experiment, now)
        kind = turned_worse(window, now, cached[1], past)
        self._past_windows.keep(experiment, now, canary_window(window, cached[1]))
        if kind is None:
            return False
        self._alarms_due[experiment] = now
        self._alarmed_at[experiment] = now
        self.metrics.alarms.labels(kind).inc()
        return True

    async def _raise_alarms(self, now: float) -> None:
        """Written after the partials they are about: a controller that looks at once
        reads the seconds that raised them. A failure loses only the hint."""
        if self._alarm_board is None or not self._alarms_due:
            return
        due, self._alarms_due = self._alarms_due, {}
        try:
            await self._alarm_board.raise_alarms(due, now)
        except BackendError as exc:
            self.metrics.alarm_errors.inc()
            log.debug("alarms not written: %s", exc)

    def _merged_due(self, experiment: str, now: float) -> bool:
        return now - self._last_merged.get(experiment, -math.inf) >= MERGED_EVERY_SEC

    def _published(self, experiment: str, window: ExperimentWindow, now: float) -> None:
        ledger = self._ledgers.get(experiment)
        if ledger is not None:
            ledger.sent()
        window.changed = False
        self._last_publish[experiment] = now
        self.metrics.publishes.inc()

    async def _ack_included(
        self, included: Mapping[str, tuple[_Held, Sequence[tuple[str, str]]]]
    ) -> None:
        """Ack the entries partials now on the board contain (never before: 0004), and
        stop holding them; a failed ack keeps them held, listed in the next partial."""
        by_service: dict[str, list[str]] = {}
        for _, entries in included.values():
            for service, entry_id in entries:
                by_service.setdefault(service, []).append(entry_id)
        await self.streams.ack_many(COLLECTOR_GROUP, by_service)
        for experiment, (held, entries) in included.items():
            del held.entries[: len(entries)]
            if not held.entries:
                self._held.pop(experiment, None)

    def grace_sec(self, experiment: str) -> float:
        """How long an ended experiment is kept: every window it was judged on is over."""
        window = self.windows.get(experiment)
        return 0.0 if window is None else float(window.retained_sec)

    async def forget_ended(self, now: float) -> list[str]:
        """Drop the windows and the partial of experiments ended for their grace period.

        One still holding entries waits: they are acked with its next publish first.
        A partial that cannot be removed now (Redis failing) keeps the window for the
        next round, so no partial of this collector is left behind unowned.
        """
        dropped: list[str] = []
        for experiment in self.lifecycle.due(now, self.grace_sec):
            held = self._held.get(experiment)
            if held is not None and held.entries:
                continue
            if experiment in self.windows and not await self._remove_own_partial(experiment):
                continue
            window = self.windows.pop(experiment, None)
            if window is not None and self.on_forget is not None:
                self.on_forget(experiment, window)
            self.experiment_service.pop(experiment, None)
            self._last_publish.pop(experiment, None)
            self._last_merged.pop(experiment, None)
            self._ledgers.pop(experiment, None)
            self._alarmed_at.pop(experiment, None)
            self._slow_bins.pop(experiment, None)
            self._screened_at.pop(experiment, None)
            self._past_windows.forget(experiment)
            self._held.pop(experiment, None)
            self._unapplied.pop(experiment, None)
            self.lifecycle.forgotten(experiment)
            self.metrics.forgotten.inc()
            dropped.append(experiment)
        if dropped:
            log.info("forgot %d ended experiments", len(dropped))
        return dropped

    async def _remove_own_partial(self, experiment: str) -> bool:
        own = part_field(self.name)
        try:
            mine = own_fields(await self.board.read(experiment), own)
            if mine:
                await self.board.remove_if_unchanged(experiment, mine)
        except BackendError as exc:
            log.warning("experiment %s: partial window not removed: %s", experiment, exc)
            return False
        return True

    async def _remove_expired(
        self, experiment: str, expired: Sequence[Partial], raw: Mapping[str, str], now: float
    ) -> None:
        """Delete dead collectors' partials from the stats hash (sharding.expired_partials).

        Only a field still holding the value read and judged is deleted (an atomic
        compare-and-delete), so an owner that is alive after all and republished in
        between keeps its field. One paused for longer than the horizon, its field
        removed, simply writes it again with its next publish (its window, evicted to
        its `now`, holds nothing older). Housekeeping only: a failure waits for the
        next publish.
        """
        expected: dict[str, str] = {}
        for partial in expired:
            expected |= own_fields(raw, part_field(partial.collector))
        try:
            removed = set(await self.board.remove_if_unchanged(experiment, expected))
        except BackendError as exc:
            log.warning("experiment %s: expired partial windows not removed: %s", experiment, exc)
            return
        for partial in expired:
            if part_field(partial.collector) not in removed:
                continue
            self.metrics.partials_removed.inc()
            newest = last_second(partial)
            log.info(
                "experiment %s: removed the partial window of collector %s, out of every "
                "window (its newest second %ss before now)",
                experiment,
                partial.collector,
                "?" if newest is None else math.floor(now) - newest,
            )

    async def flush(self) -> None:
        """Publish and ack everything held (SIGTERM): nothing read stays pending."""
        if self._prefetch is not None:
            try:
                self.apply(await self._take_prefetch(), claimed_unacked=frozenset())
            except CanaryError as exc:  # never delivered, or left pending for a claimer
                log.warning("read in flight at shutdown failed: %s", exc)
        now = self.clock.now()
        for experiment in list(self.windows):
            await self.publish(experiment, now, merged=True)
        for service, ids in list(self._ack_now.items()):
            if ids:
                await self.streams.ack(service, COLLECTOR_GROUP, ids)
        self._ack_now.clear()


def decision_entry(
    experiment: str, snapshots: dict[str, WindowSnapshot], now: float
) -> dict[str, str]:
    """One `canary:decisions` entry: the numbers the controller decides on."""
    variants = {
        name: {
            "count": s.count,
            "failures": s.failures,
            "failure_ratio": s.failure_ratio,
            "mean_ms": s.mean_ms,
            "p50_ms": s.p50_ms,
            "p90_ms": s.p90_ms,
            "p95_ms": s.p95_ms,
            "p99_ms": s.p99_ms,
            "p999_ms": s.p999_ms,
            "threshold_ms": s.threshold_ms,
            "above_threshold": s.above_threshold,
            "above_threshold_fraction": s.above_threshold_fraction,
            "threshold_exact": s.threshold_exact,
            "sample_lag_ms": s.sample_lag_ms,
            "shed": s.shed,
            "shed_share": s.shed_share,
        }
        for name, s in snapshots.items()
    }
    any_snap = next(iter(snapshots.values()), None)
    lags = [s.sample_lag_ms for s in snapshots.values() if s.sample_lag_ms is not None]
    return {
        "kind": "snapshot",
        "experiment": experiment,
        "ts": repr(now),
        "window_start": repr(any_snap.window_start if any_snap else now),
        "window_end": repr(now),
        "window_sec": str(any_snap.window_sec if any_snap else 0),
        "sample_lag_ms": repr(min(lags)) if lags else "",
        "variants": json.dumps(variants, separators=(",", ":")),
    }
