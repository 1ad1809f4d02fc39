"""The controller loop: lead, then evaluate every active experiment, again and again,
while the route reconciler makes etcd follow the database.

    campaign → ┬ record rejected rules → (load → rule → snapshots → decide → commit)
               │   per experiment → write the round's history points → wait
               └ reconcile routes (controller.reconciler), woken by every commit

Only the elected leader evaluates and reconciles, and every route it writes is fenced
by its leadership, so a deposed leader can never write. A decision commits to SQL
only; the reconciler, woken by the commit, publishes its route at once. Losing etcd
means stepping down. The wait between rounds ends at the earliest `next_check_at`
any decision asked for, and at the latest after one tick.

Sharded (`shards` > 0, decision 0057), every replica judges the experiments of the
shards it holds (controller.ownership), each decision fenced by its shard in etcd and
in SQL, while the elected leader only reconciles and records rejected rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client.registry import Collector

from controlplane.controller.apply import apply_decision, decided_state
from controlplane.controller.board_page import BoardPage
from controlplane.controller.experiment_metrics import ExperimentBoard
from controlplane.controller.known_rows import KnownRows
from controlplane.controller.metrics import ControllerMetricsCollector, ControllerStats
from controlplane.controller.ownership import OwnershipStats, ShardFence, ShardOwnership
from controlplane.controller.reconciler import RouteReconciler
from controlplane.controller.rulebook import RuleBook, RuleRejection
from controlplane.controller.shards import shard_of
from controlplane.controller.suspects import Alarmed, Suspects
from controlplane.decision.model import Decision, RolloutState
from controlplane.decision.rollout import decide, fast_window_sec
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import ACTIVE, TERMINAL, ExperimentState
from controlplane.experiments.memory_parts import same_evidence
from controlplane.experiments.rollout_state import inline_rule, rollout_state_of, steps_of
from controlplane.experiments.store import ExperimentRecord
from controlplane.history.recorder import HistoryRecorder
from controlplane.kernel.alarms import Alarms
from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import (
    BackendError,
    BackendUnavailable,
    CanaryError,
    CodecError,
    NotFound,
    NotLeader,
    RevisionConflict,
)
from controlplane.kernel.kv import Fence, Leadership
from controlplane.kernel.log_limit import EveryInterval
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.kernel.routes import BASELINE, CANARY
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.tasks import cancel_and_wait
from controlplane.providers.evidence import MetricEvidence
from controlplane.runtime import Backends

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from controlplane.collector.second_partials import PartialCache

log = logging.getLogger(__name__)

RULE_REJECTED = EventKind.RULE_REJECTED
# experiments whose stats hashes one pipelined read fetches, just before they are
# judged: a window is merged to end at the moment it is judged, so with one read for
# a whole round of 1,000 experiments (seconds of CPU) the last ones were judged on
# hashes read many seconds earlier, their samples mostly out of the window by then
# (decision 0033)
READ_AHEAD = 64
# decided states built between two turns of the loop when a round commits its memory
MEMORY_SLICE = 32
# suspects judged again in one pass between a round's experiments, the longest
# waiting first: when every canary breaches at once, the round still goes on
SUSPECTS_PER_PASS = 64
# of them, experiments a collector raised an alarm for (decision 0070): an alarm
# raised in vain costs a look, and forged ones must not take the round's time
ALARMS_PER_PASS = 8
STEP_DOWN_BACKOFF = BackoffPolicy(initial=1.0, maximum=10.0)  # before campaigning again


class MetricBoardLike(Protocol):
    """What the controller needs of a metric board (providers/board.py `MetricBoard`):
    which experiments' metrics to read, and their latest evidence, never awaited."""

    def track(
        self,
        experiment_id: str,
        service: str,
        specs: Sequence[MetricSpec],
        window_sec: int,
        variants: tuple[str, str],
    ) -> None: ...

    def forget(self, experiment_id: str) -> None: ...

    def latest(self, experiment_id: str) -> Mapping[str, MetricEvidence]: ...


SnapshotReader = Callable[[Backends, str, int], Awaitable[Mapping[str, WindowSnapshot]]]


async def board_snapshots(
    backends: Backends, experiment: str, window_sec: int
) -> Mapping[str, WindowSnapshot]:
    """Every collector's per-second partials merged exactly over `window_sec` seconds.

    The window is the rule's (or the fast window's), not whatever the collectors were
    last configured with, so an inline rule or a rule just reloaded is judged on its
    own window length.
    """
    from controlplane.collector.sharding import read_merged_snapshots

    if backends.board is None:
        return {}
    return await read_merged_snapshots(
        backends.board, experiment, backends.clock.now(), window_sec=window_sec
    )


def _partial_cache() -> PartialCache:
    from controlplane.collector.second_partials import PartialCache

    return PartialCache()


@dataclass
class Round:
    """What one round shares across its experiments (decisions 0031, 0033).

    `hashes`: the stats hashes of its next `read_ahead` running experiments, read in
    one round trip just before they are judged;
    None: not read ahead (`Controller.batched_round` off, or no board). `error` set:
    that read failed, and every experiment it was for is judged as no data, as a
    failed read of one experiment is. `memory`: decisions that change nothing but the
    rollout's memory (looks, tallies), committed together when the round ends.
    """

    hashes: Mapping[str, Mapping[str, str]] | None = None
    error: BackendError | None = None
    memory: list[tuple[ExperimentRecord, Decision]] = field(default_factory=list)


def only_memory(state: RolloutState, decision: Decision) -> bool:
    """Does the decision change nothing but the rollout's memory (pure)? No effect
    (route or event), and the same status, breaker, step and weight: such a write can
    wait for the round's end, where one transaction commits them all."""
    new = decision.new_state
    return not decision.effects and (
        new.status, new.breaker, new.step_index, new.canary_bp
    ) == (state.status, state.breaker, state.step_index, state.canary_bp)


def only_look_time(state: RolloutState, decision: Decision) -> bool:
    """Does the decision move nothing but the time of the snapshot last judged (pure)?
    A look at a window built at `now` does at every look, and such a decision is kept
    in the controller's memory, not written (decision 0077): judging that snapshot
    again, as a leader reading the row after a failover would, changes nothing else
    either."""
    new = decision.new_state
    return (
        not decision.effects
        and new.last_snapshot_ts != state.last_snapshot_ts
        and new.with_changes(last_snapshot_ts=state.last_snapshot_ts) == state
    )


@dataclass
class Controller:
    """A BackgroundService for the API's lifespan (see controlplane.runtime)."""

    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    tick: float = 0.25
    lease_ttl: int = 5
    # after a backend outage, the pause before the lead resumes on the same fence
    outage_pause: float = 0.5
    snapshot_reader: SnapshotReader = board_snapshots
    # judge the last few seconds too (decision.rollout.fast_window_sec); False: off
    fast_window: bool = True
    # None: judge the rule's window only
    # True: read every running experiment's stats hash in one pipelined round trip
    # per round, and commit the round's memory-only decisions in one transaction
    # (decision 0031); False: one read per experiment and window, and one transaction
    # per decision, as before, kept as the scale benchmark's same-run reference
    batched_round: bool = True
    # a batched round reads the hashes this many experiments at a time (READ_AHEAD)
    read_ahead: int = READ_AHEAD
    # what the rounds decoded and merged of the stats hashes, kept for the next look
    # (decision 0058): a second is decoded once, a window unchanged is not merged again
    partial_cache: PartialCache = field(default_factory=lambda: _partial_cache())
    stats: ControllerStats = field(default_factory=ControllerStats)
    reconciler: RouteReconciler = field(default_factory=RouteReconciler)
    # records what each round judged, for the dashboard's plots
    history: HistoryRecorder = field(default_factory=HistoryRecorder)
    # each experiment's standing and last look, for /metrics (experiment_metrics.py)
    experiment_board: ExperimentBoard = field(default_factory=ExperimentBoard)
    # a span per evaluation when tracing is on (controlplane.tracer)
    tracer: Tracer | None = None
    # provider metrics read in the background (providers/board.py); None: no provider
    # is configured, and a rule's metrics are judged under their no-data policy
    metric_board: MetricBoardLike | None = None
    # 0: judge every experiment while elected; N: judge the experiments of the shards
    # this replica holds among N (decision 0057)
    shards: int = 0
    ownership: OwnershipStats = field(default_factory=OwnershipStats)
    # per experiment the board reads for: what it was told to read
    _tracked: dict[str, tuple[tuple[MetricSpec, ...], int]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _rulebook: RuleBook | None = None
    _owner: ShardOwnership | None = None
    _no_rule_reported: set[int] = field(default_factory=set)
    _unexpected_logged: EveryInterval = field(default_factory=EveryInterval)
    _error_logged: EveryInterval = field(default_factory=EveryInterval)
    # per service, the rejected rule value known to be in the events table
    _rejections_recorded: dict[str, RuleRejection] = field(default_factory=dict)
    # the active experiments as last read or written, reloaded when their version
    # moves (decision 0059)
    known_rows: KnownRows = field(default_factory=KnownRows)
    # judge the experiments whose breach streak has begun again at the next tick,
    # between a long round's experiments (decision 0069); False: at the next round
    suspect_lane: bool = True
    suspects: Suspects = field(init=False)
    # judge the experiments a collector raised an alarm for in the same passes
    # (decision 0070); False: when the round reaches them
    alarm_lane: bool = True
    alarmed: Alarmed = field(init=False)
    board_page: BoardPage = field(init=False)
    # where alarms are read; None: the snapshot board, when it keeps them
    alarm_source: Alarms | None = None
    # each running experiment's last look (the controller's clock)
    _looked_at: dict[int, float] = field(default_factory=dict)
    # the last round took longer than the tick: the next one begins with a pass
    _long_rounds: bool = False

    def __post_init__(self) -> None:
        self.reconciler.stats = self.stats  # one set of counters on /metrics
        self.suspects = Suspects(self.tick)
        self.alarmed = Alarmed(self.tick)
        self.board_page = BoardPage(self.experiment_board)

    def metrics_collector(self) -> Collector:
        """Its counters for the API's /metrics (the app registers it)."""
        return ControllerMetricsCollector(
            self.stats, history=self.history.stats, ownership=self.ownership,
            shards=self.shards, board_page=self.board_page,
        )

    def metrics_text(self) -> str:
        """Each experiment's series for the API's /metrics, written as text
        (`board_exposition`: ~17,000 samples at N = 1,000), once a round at most
        while rounds run (`BoardPage`)."""
        return self.board_page.text()

    async def start(self, backends: Backends) -> None:
        await self.open(backends)
        run = self._run_sharded(backends) if self.shards else self._run(backends)
        self._task = asyncio.create_task(run, name="controller")

    async def open(self, backends: Backends) -> None:
        """Follow the rules in etcd; `start` also campaigns and runs the loop."""
        self._rulebook = RuleBook(backends.kv, backends.keys)
        await self._rulebook.start()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._rulebook is not None:
            await self._rulebook.stop()

    # ------------------------------------------------------------- leadership

    async def _run(self, backends: Backends) -> None:
        backoff = Backoff(STEP_DOWN_BACKOFF)
        while True:
            leadership = backends.kv.leadership(
                backends.keys.election, identity=self.identity, ttl=self.lease_ttl
            )
            try:
                fence = await leadership.campaign()
                backoff.reset()
                self.stats.leader = True
                self.stats.terms += 1
                self.history.new_term()
                log.info("controller %s leads (fence revision %d)", self.identity,
                         fence.create_revision)
                await self._lead_until_lost(backends, fence, leadership)
            except BackendError as exc:
                log.warning("controller %s steps down: %s", self.identity, exc)
                await asyncio.sleep(backoff.next_delay())
            except Exception:
                # a bug must not end the loop for good while the process looks healthy
                log.exception("controller %s steps down after an unexpected error",
                              self.identity)
                await asyncio.sleep(backoff.next_delay())
            finally:
                self.stats.leader = False
                if not self.shards:
                    self._forget_untracked(set())  # only the leader reads provider metrics
                    # a replica that does not lead exports no experiment series: its
                    # last look would go stale while another leads
                    self.experiment_board.clear()
                with contextlib.suppress(Exception):
                    await asyncio.shield(leadership.resign())

    async def _lead_until_lost(
        self, backends: Backends, fence: Fence, leadership: Leadership
    ) -> None:
        """Lead until the lease is lost. A store or database out of reach while the
        lease still holds (an etcd member lost mid-call) is ridden out: the lead
        resumes on the same fence, so a member's loss costs no election."""
        watch = asyncio.ensure_future(leadership.lost())
        try:
            while True:
                lead = asyncio.create_task(self._lead(backends, fence))
                try:
                    done, _ = await asyncio.wait(
                        {lead, watch}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    # cancel_and_wait: a cancellation lost in a client library would
                    # otherwise keep a deposed lead running, and this replica waiting
                    # for it, for ever; and only the task's errors are suppressed
                    # here, never this caller's own cancellation (a stop)
                    if not lead.done():
                        with contextlib.suppress(Exception):
                            await cancel_and_wait(lead)
                if lead not in done:
                    log.warning("controller %s lost its leadership", self.identity)
                    return
                try:
                    lead.result()  # re-raise NotLeader / BackendError
                except BackendUnavailable as exc:
                    if not leadership.is_leader:
                        raise
                    self.stats.outages_ridden += 1
                    log.warning("controller %s keeps the lead through: %s; resuming in %.1f s",
                                self.identity, exc, self.outage_pause)
                await asyncio.wait({watch}, timeout=self.outage_pause)
                if watch.done():
                    log.warning("controller %s lost its leadership", self.identity)
                    return
        finally:
            with contextlib.suppress(Exception):
                await cancel_and_wait(watch)

    async def _lead(self, backends: Backends, fence: Fence) -> None:
        reconcile = asyncio.create_task(self.reconciler.run(backends, fence), name="reconciler")
        evaluate = asyncio.create_task(
            self._record_rejections_forever(backends) if self.shards
            else self._evaluate_forever(backends, fence)
        )
        try:
            done, _ = await asyncio.wait(
                {reconcile, evaluate}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # re-raise NotLeader / BackendError
        finally:
            # both at once, each cancelled once (a second cancel would cut into its
            # cleanup); their errors were reported by the round that failed
            with contextlib.suppress(Exception):
                await cancel_and_wait(reconcile, evaluate)

    async def _evaluate_forever(self, backends: Backends, fence: Fence) -> None:
        while True:
            next_at = await self.evaluate_all(backends, fence)
            now = backends.clock.now()
            wait = self.tick if next_at is None else min(self.tick, max(next_at - now, 0.0))
            await asyncio.sleep(max(wait, 0.01))

    async def _record_rejections_forever(self, backends: Backends) -> None:
        """Sharded, the leader judges nothing: it records rejected rules, once a tick."""
        while True:
            await self._record_rejections(backends)
            await asyncio.sleep(self.tick)

    # ------------------------------------------------------------- shards

    async def _run_sharded(self, backends: Backends) -> None:
        """Lead the reconciler when elected and, all along, judge the shards held."""
        await asyncio.gather(self._run(backends), self._judge_shards(backends))

    async def _judge_shards(self, backends: Backends) -> None:
        backoff = Backoff(STEP_DOWN_BACKOFF)
        while True:
            owner = ShardOwnership(
                kv=backends.kv, keys=backends.keys, store=backends.store,
                clock=backends.clock, identity=self.identity, shards=self.shards,
                ttl=self.lease_ttl, stats=self.ownership,
            )
            self._owner = owner
            self.history.new_term()
            holding = asyncio.create_task(owner.run(), name="controller-shards")
            judging = asyncio.create_task(self._judge_forever(backends, owner))
            try:
                done, _ = await asyncio.wait(
                    {holding, judging}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    task.result()
            except BackendError as exc:
                log.warning("controller %s gives up its shards: %s", self.identity, exc)
                await asyncio.sleep(backoff.next_delay())
            except Exception:
                log.exception("controller %s gives up its shards after an unexpected error",
                              self.identity)
                await asyncio.sleep(backoff.next_delay())
            else:
                backoff.reset()
            finally:
                self._owner = None
                with contextlib.suppress(Exception):
                    await cancel_and_wait(judging, holding)
                self._forget_untracked(set())
                # shards given up: their experiments' series are another replica's now
                self.experiment_board.clear()

    async def _judge_forever(self, backends: Backends, owner: ShardOwnership) -> None:
        while True:
            try:
                next_at = await self.evaluate_all(backends, None)
            except NotLeader as exc:
                # a shard taken over mid-round: its decision did not commit
                log.info("controller %s: %s", self.identity, exc)
                next_at = None
            except BackendUnavailable as exc:
                self.stats.outages_ridden += 1
                log.warning("controller %s: round failed: %s; again in %.1f s",
                            self.identity, exc, self.outage_pause)
                await asyncio.sleep(self.outage_pause)
                continue
            now = backends.clock.now()
            wait = self.tick if next_at is None else min(self.tick, max(next_at - now, 0.0))
            owner.moved.clear()
            # a shard just claimed is judged at once, not after the tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(owner.moved.wait(), max(wait, 0.01))

    def _shard_fence(self, experiment: ExperimentRecord) -> ShardFence | None:
        return None if self._owner is None else self._owner.fence_of(experiment.id)

    def _judged_here(self, experiment: ExperimentRecord) -> bool:
        return not self.shards or self._shard_fence(experiment) is not None

    # ------------------------------------------------------------- evaluation

    async def evaluate_all(self, backends: Backends, fence: Fence | None) -> float | None:
        """One round over the active experiments; the earliest time to look again."""
        self.board_page.round_began()
        try:
            return await self._round(backends, fence)
        finally:
            self.board_page.round_ended()

    async def _round(self, backends: Backends, fence: Fence | None) -> float | None:
        if not self.shards:
            await self._record_rejections(backends)
        # sharded, only the experiments of the shards held are read, not all of them
        selection = self._owner.selection() if self._owner is not None else None
        async with backends.store.transaction() as tx:
            listed = await tx.list_versions(states=ACTIVE, shards=selection)
            stale = self.known_rows.stale(listed)
            loaded = await tx.load_experiments(ids=stale) if stale else []
        self.stats.rows_loaded += len(loaded)
        current = self.known_rows.refresh(listed, loaded, ACTIVE)
        experiments = [e for e in current if self._judged_here(e)]
        memory: list[tuple[ExperimentRecord, Decision]] = []
        reads = Round(memory=memory)
        earliest: float | None = None
        began = last_pass = backends.clock.now()
        judged_early: set[int] = set()
        alarms_on = self._alarms_read(backends)
        if alarms_on and self._long_rounds:
            # after a long round's end (its memory, history and listing take seconds
            # at N = 1,000), the alarms raised meanwhile are judged first
            judged_early |= await self._judge_suspects(backends, fence, [], began, alarms=True)
        for index, experiment in enumerate(experiments):
            if index % max(1, self.read_ahead) == 0:
                ahead = experiments[index : index + max(1, self.read_ahead)]
                reads = await self._read_round(backends, ahead, memory)
            if experiment.id in judged_early:
                continue  # judged as a suspect since the round began, on newer data
            next_at = await self._judge(backends, experiment, fence, reads)
            if next_at is not None:
                earliest = next_at if earliest is None else min(earliest, next_at)
            if (self.suspect_lane and self.suspects) or alarms_on:
                now = backends.clock.now()
                if now - last_pass >= self.tick:
                    last_pass = now
                    judged_early |= await self._judge_suspects(
                        backends, fence, memory, now, alarms=alarms_on
                    )
            # a batched round has nothing to wait for between experiments: let the
            # lease's keep-alive, the reconciler and the watches run (decision 0031)
            await asyncio.sleep(0)
        await self._commit_memory(backends, memory)
        self._long_rounds = backends.clock.now() - began >= self.tick
        await self._board_finished(backends, {str(e.id) for e in experiments})
        running = {str(e.id) for e in experiments if e.state is ExperimentState.RUNNING}
        self._forget_untracked(running)
        judged = {int(i) for i in running}
        self.suspects.keep(judged)
        self.alarmed.keep(judged)
        for gone in [i for i in self._looked_at if i not in judged]:
            del self._looked_at[gone]
        self.stats.suspects = len(self.suspects)
        self.partial_cache.keep(running)
        await self.history.flush(backends.history)
        if selection is not None:
            # experiments of shards let go run on under another replica: not ended
            self.history.hand_over([i for i in self.history.seen
                                    if shard_of(i, selection.count) not in selection.shards])
        await self.history.keep(
            backends.history, [e.id for e in experiments], backends.clock.now()
        )
        return earliest

    async def _judge(
        self, backends: Backends, experiment: ExperimentRecord, fence: Fence | None,
        reads: Round,
    ) -> float | None:
        """One look; an error of this experiment's own is counted and logged, and the
        round goes on. A lost lead or a backend's failure ends the round."""
        try:
            return await self.evaluate(backends, experiment, fence, reads)
        except NotLeader:
            raise
        except RevisionConflict as exc:
            # someone (the API) moved the experiment: decide again
            self.stats.conflicts += 1
            log.info("experiment %d changed under the controller: %s", experiment.id, exc)
        except BackendError:
            raise
        except CanaryError as exc:
            # counted every time; logged once a minute per experiment and kind: a
            # damaged stats hash stays damaged for as many rounds as it is there
            self.stats.errors += 1
            key = (experiment.id, type(exc).__name__)
            if self._error_logged.due(key, backends.clock.monotonic()):
                log.warning("experiment %d not evaluated (logged once a minute per "
                            "experiment): %s", experiment.id, exc)  # fmt: skip
        except Exception:
            # an error of this experiment's own that no check foresaw (a bug, data no
            # parser caught): it must not stop every other experiment's judgment, as
            # stepping down and leading again would meet it at every round
            self.stats.errors += 1
            self.stats.unexpected_errors += 1
            if self._unexpected_logged.due(experiment.id, backends.clock.monotonic()):
                log.exception("experiment %d not evaluated after an unexpected error "
                              "(logged once a minute per experiment)", experiment.id)
        return None

    async def _judge_suspects(
        self,
        backends: Backends,
        fence: Fence | None,
        memory: list[tuple[ExperimentRecord, Decision]],
        now: float,
        *,
        alarms: bool = False,
    ) -> set[int]:
        """The suspects a tick past their last look, judged between a long round's
        experiments (decision 0069); the ids judged. The round's memory so far is
        committed first, so that a suspect the round judged already is judged on the
        memory that look left, as the next round would."""
        due = self.suspects.due(now)[:SUSPECTS_PER_PASS] if self.suspect_lane else []
        alarmed: set[int] = set()
        if alarms:
            await self._read_alarms(backends)
            fresh = [i for i in self.alarmed.due(self._looked_at, now, ALARMS_PER_PASS)
                     if i not in due][: SUSPECTS_PER_PASS - len(due)]  # fmt: skip
            alarmed = set(fresh)
            due += fresh
        if not due:
            return set()
        await self._commit_memory(backends, memory)
        memory.clear()
        # the records as that commit left them
        records = [
            record for i in due
            if (record := self.known_rows.record(i)) is not None and self._judged_here(record)
        ]
        for unknown in set(due) - {record.id for record in records}:
            self.alarmed.forget(unknown)  # not one of ours (ended, another shard's, forged)
        self.stats.suspect_passes += 1
        looked: list[tuple[ExperimentRecord, Decision]] = []
        reads = await self._read_round(backends, records, looked)
        for record in records:
            if record.id in alarmed:
                self.stats.alarm_looks += 1
            else:
                self.stats.suspect_looks += 1
            await self._judge(backends, record, fence, reads)
            await asyncio.sleep(0)
        await self._commit_memory(backends, looked)
        return {record.id for record in records}

    def _alarm_source(self, backends: Backends) -> Alarms | None:
        if not self.alarm_lane or not self.batched_round:
            return None
        if self.alarm_source is not None:
            return self.alarm_source
        return backends.board if isinstance(backends.board, Alarms) else None

    def _alarms_read(self, backends: Backends) -> bool:
        return self._alarm_source(backends) is not None

    async def _read_alarms(self, backends: Backends) -> None:
        """The alarms raised since the last read; a failed read loses only the hint
        (the round judges those experiments when it reaches them)."""
        source = self._alarm_source(backends)
        if source is None:
            return
        try:
            found, dropped = await source.alarms_since(self.alarmed.since())
        except BackendError as exc:
            self.stats.alarm_read_errors += 1
            log.debug("alarms not read: %s", exc)
            return
        self.stats.alarms_read += len(found)
        self.stats.alarms_dropped += dropped
        self.alarmed.add(found, backends.clock.now())

    async def _board_finished(self, backends: Backends, active: set[str]) -> None:
        """Experiments on the metrics board that are no longer active: ended by a
        decision or a user. Their final rows are read once, so that a promotion or
        rollback by either is counted (experiment_metrics.py)."""
        board = self.experiment_board
        now = backends.clock.now()
        gone = board.active_keys() - active
        if gone:
            async with backends.store.transaction() as tx:
                for key in sorted(gone):
                    try:
                        record = await tx.load_experiment(experiment_id=int(key))
                    except NotFound:
                        board.drop(key)  # deleted: nothing to show
                        continue
                    if record.state not in TERMINAL:
                        # still running: its shard moved to another replica, which
                        # exports it from now on
                        board.drop(key)
                        continue
                    board.finish(record, now)
        board.expire(now)

    async def _read_round(
        self,
        backends: Backends,
        experiments: list[ExperimentRecord],
        memory: list[tuple[ExperimentRecord, Decision]],
    ) -> Round:
        """The stats hashes of the running ones of `experiments` (the next
        `read_ahead` of the round) in one round trip (decisions 0031, 0033): a read per
        experiment made a round's time grow with N round trips to Redis."""
        running = [str(e.id) for e in experiments if e.state is ExperimentState.RUNNING]
        if not self.batched_round or backends.board is None or not running:
            return Round(memory=memory)
        try:
            hashes = await backends.board.read_many(running)
        except BackendError as exc:
            return Round({}, exc, memory)
        # parsed one by one as each is judged, so that the round yields in between
        return Round(dict(zip(running, hashes, strict=True)), memory=memory)

    async def evaluate(
        self,
        backends: Backends,
        experiment: ExperimentRecord,
        fence: Fence | None,
        reads: Round | None = None,
    ) -> float | None:
        if experiment.state is not ExperimentState.RUNNING:
            self.experiment_board.observe(experiment, None, backends.clock.now())
            return None
        reads = reads if reads is not None else Round()
        if self.tracer is None:
            return await self._evaluate(backends, experiment, fence, None, reads)
        attributes = {
            "canary.experiment": str(experiment.id),
            "canary.service": experiment.service,
        }
        with self.tracer.start_as_current_span(
            "controller.evaluate", attributes=attributes
        ) as span:
            return await self._evaluate(backends, experiment, fence, span, reads)

    async def _evaluate(
        self,
        backends: Backends,
        experiment: ExperimentRecord,
        fence: Fence | None,
        span: Span | None,
        reads: Round,
    ) -> float | None:
        shard = self._shard_fence(experiment)
        if self.shards and shard is None:
            return None  # the shard moved on since the round began
        rule = inline_rule(experiment)
        if rule is None and self._rulebook is not None:
            in_force = self._rulebook.get(experiment.service)
            rule = in_force.rule if in_force else None
        if rule is None:
            await self._report_no_rule(backends, experiment)
            return None
        now = backends.clock.now()
        try:
            state = rollout_state_of(experiment, now, self.known_rows.stored_state(experiment))
        except (KeyError, TypeError, ValueError) as exc:
            # one unreadable row must not stop the evaluation of every other one
            raise CodecError(
                f"stored rollout state unreadable ({type(exc).__name__}: {exc})"
            ) from exc
        snapshots, fast = await self._read_windows(backends, str(experiment.id), rule, reads)
        self.history.observe(experiment.id, snapshots, rule, experiment.canary_weight_bp, now)
        metrics = self._metric_evidence(experiment, rule)
        self.history.observe_metrics(experiment.id, rule.metrics, metrics or {})
        decision = decide(state, snapshots, rule, steps_of(experiment), now, fast, metrics)
        self.stats.evaluations += 1
        self._looked_at[experiment.id] = now
        self.alarmed.looked(experiment.id)
        changed = decision.new_state != state or bool(decision.effects)
        if span is not None:
            span.set_attributes(decision_attributes(decision, changed))
        if changed and only_look_time(state, decision):
            # most looks move only this (3,200 in 3,400 in the round rig): none is written
            self.known_rows.remember(experiment, decision.new_state)
            self.stats.looks_kept += 1
            changed = False
        if not changed:
            self.suspects.observe(experiment.id, decision.new_state, now)
            self.experiment_board.observe(experiment, decision.evidence, now)
            return decision.next_check_at
        if self.batched_round and only_memory(state, decision):
            reads.memory.append((experiment, decision))
            self.suspects.observe(experiment.id, decision.new_state, now)
            self.experiment_board.observe(experiment, decision.evidence, now)
            return decision.next_check_at
        # written now, and read again at its new version by the next listing
        self.suspects.forget(experiment.id)
        self.alarmed.forget(experiment.id)
        await apply_decision(
            backends,
            experiment_id=experiment.id,
            version=experiment.version,
            decision=decision,
            rule=rule,
            fence=shard.fence if shard is not None else fence,
            shard=shard,
            owner=self.identity,
        )
        self.stats.decisions_applied += 1
        self.experiment_board.observe(
            decided_state(experiment, decision, utc_now(backends.clock)), decision.evidence, now
        )
        return decision.next_check_at

    def _metric_evidence(
        self, experiment: ExperimentRecord, rule: BreakerRule
    ) -> Mapping[str, MetricEvidence] | None:
        """The latest evidence of the rule's provider metrics, never awaited; None
        without a board (no provider configured). Tells the board what to read when
        the rule's metrics change."""
        key = str(experiment.id)
        if not rule.metrics:
            if key in self._tracked and self.metric_board is not None:
                self.metric_board.forget(key)
            self._tracked.pop(key, None)
            return {}
        if self.metric_board is None:
            return None
        wanted = (tuple(rule.metrics), rule.window_sec)
        if self._tracked.get(key) != wanted:
            self.metric_board.track(
                key, experiment.service, rule.metrics, rule.window_sec, (BASELINE, CANARY)
            )
            self._tracked[key] = wanted
        return self.metric_board.latest(key)

    def _forget_untracked(self, running: set[str]) -> None:
        """Stop reading the metrics of experiments no longer running."""
        for key in [k for k in self._tracked if k not in running]:
            if self.metric_board is not None:
                self.metric_board.forget(key)
            del self._tracked[key]

    async def _read_windows(
        self, backends: Backends, experiment: str, rule: BreakerRule, reads: Round
    ) -> tuple[Mapping[str, WindowSnapshot], Mapping[str, WindowSnapshot] | None]:
        """The rule's window and the fast one; no data at all while Redis is away.

        A snapshot store outage is judged by the rule's no-data policy (hold, or fail
        after its timeout) for this experiment; it is no reason to give up leadership.
        """
        fast_sec = fast_window_sec(rule.window_sec) if self.fast_window else None
        if reads.error is not None:
            self.stats.snapshot_errors += 1
            log.warning("experiment %s: snapshots unavailable (%s); judged as no data",
                        experiment, reads.error)
            return {}, None
        if reads.hashes is not None:
            return self._windows_of(backends, experiment, rule, reads.hashes, fast_sec)
        try:
            snapshots = await self.snapshot_reader(backends, experiment, rule.window_sec)
            fast = (
                await self.snapshot_reader(backends, experiment, fast_sec)
                if fast_sec is not None
                else None
            )
        except BackendError as exc:
            self.stats.snapshot_errors += 1
            log.warning("experiment %s: snapshots unavailable (%s); judged as no data",
                        experiment, exc)
            return {}, None
        return snapshots, fast

    async def _commit_memory(
        self, backends: Backends, memory: list[tuple[ExperimentRecord, Decision]]
    ) -> None:
        """The round's memory-only decisions in one transaction: one commit a round
        rather than one per experiment (decision 0031). Each row is written only at
        the version it was decided on; a row that moved meanwhile keeps its new state
        and is decided again next round. What was written is known at its new version
        and not read again (decision 0059). A database error propagates, as the write
        of a single decision's does."""
        if not memory:
            return
        at = utc_now(backends.clock)
        saved = 0
        shards: dict[int, ShardFence] = {}
        if self.shards:
            fenced = [(e, d, self._shard_fence(e)) for e, d in memory]
            # a shard let go since: its new owner decides again
            memory = [(e, d) for e, d, f in fenced if f is not None]
            shards = {f.shard: f for _, _, f in fenced if f is not None}
        # built before the transaction, giving the loop a turn between slices: at
        # N = 1,000 building them all at once held the loop (and the lease's
        # keep-alive) for up to seconds, and held the database's write lock meanwhile
        states: list[ExperimentRecord] = []
        for index, (experiment, decision) in enumerate(memory):
            if index and index % MEMORY_SLICE == 0:
                await asyncio.sleep(0)
            states.append(decided_state(experiment, decision, at))
        async with backends.store.transaction() as tx:
            if self.shards:
                for held in shards.values():
                    await tx.hold_shard(shard=held.shard, fence=held.token,
                                        owner=self.identity, now=at)
            # the step's evidence is written only when a window changed it (0068)
            written = await tx.save_states(
                experiments=states,
                evidence_stored=[
                    same_evidence(experiment.rollout_state, state.rollout_state)
                    for (experiment, _), state in zip(memory, states, strict=True)
                ],
            )
        for (_, decision), record in zip(memory, written, strict=True):
            if record is None:
                self.stats.conflicts += 1
                continue
            saved += 1
            self.known_rows.wrote(record, decision.new_state)
        self.stats.decisions_applied += saved

    def _windows_of(
        self,
        backends: Backends,
        experiment: str,
        rule: BreakerRule,
        hashes: Mapping[str, Mapping[str, str]],
        fast_sec: int | None,
    ) -> tuple[Mapping[str, WindowSnapshot], Mapping[str, WindowSnapshot] | None]:
        """Both windows from the hash read this round, its partials parsed once."""
        from controlplane.collector.sharding import parse_partials, snapshots_of_fields

        fields = hashes.get(experiment, {})
        cache = self.partial_cache
        partials = parse_partials(fields, cache=cache, experiment=experiment)
        now = backends.clock.now()
        snapshots = snapshots_of_fields(
            experiment, fields, partials, now, window_sec=rule.window_sec, cache=cache
        )
        if fast_sec is None:
            return snapshots, None
        return snapshots, snapshots_of_fields(
            experiment, fields, partials, now, window_sec=fast_sec, cache=cache
        )

    async def _report_no_rule(self, backends: Backends, experiment: ExperimentRecord) -> None:
        if experiment.id in self._no_rule_reported:
            return
        self._no_rule_reported.add(experiment.id)
        reason = (
            f"no breaker rule for service {experiment.service!r}: the rollout holds "
            "until one is applied (PUT /v1/services/{service}/rule)"
        )
        log.warning("experiment %d: %s", experiment.id, reason)
        async with backends.store.transaction() as tx:
            await tx.append_event(
                experiment_id=experiment.id, service=experiment.service,
                at=utc_now(backends.clock), actor="controller", kind=EventKind.NO_RULE,
                reason=reason,
            )

    async def _record_rejections(self, backends: Backends) -> None:
        """Record each invalid stored rule as one `rule_rejected` event, as the leader.

        Done each round rather than when the rule book reads the value, so that a
        value rejected before this replica led is recorded too; the latest event of
        the service says whether a previous leader (or this one before a restart)
        recorded that very value already.
        """
        if self._rulebook is None:
            return
        for rejection in self._rulebook.rejections():
            done = self._rejections_recorded.get(rejection.service)
            if done is not None and done.same_value(rejection):
                continue
            try:
                await self._record_rejection(backends, rejection)
            except CanaryError as exc:
                log.warning("could not record a rejected rule: %s", exc)
                continue  # tried again next round
            self._rejections_recorded[rejection.service] = rejection

    async def _record_rejection(self, backends: Backends, rejection: RuleRejection) -> None:
        async with backends.store.transaction() as tx:
            latest, _ = await tx.list_events(
                service=rejection.service, kind=RULE_REJECTED, newest_first=True, limit=1
            )
            if latest and rejection.recorded_in(latest[0].payload):
                return
            await tx.append_event(
                service=rejection.service, at=utc_now(backends.clock),
                actor="controller", kind=RULE_REJECTED,
                reason=f"invalid rule at etcd revision {rejection.revision} ignored; "
                f"the last valid rule stays in force: {rejection.error}",
                payload=rejection.event_payload(),
            )


def decision_attributes(decision: Decision, changed: bool) -> dict[str, str | int | bool]:
    """What a decision's span says of it: the state it leads to and why."""
    state = decision.new_state
    return {
        "canary.decision.reason": decision.reason[:256],
        "canary.decision.changed": changed,
        "canary.decision.events": ",".join(e.kind.value for e in decision.events),
        "canary.state": state.status.value,
        "canary.breaker": state.breaker.value,
        "canary.step": state.step_index,
        "canary.canary_bp": state.canary_bp,
    }
