"""A suspect (a breach streak begun) is judged again a tick later, not a round later
(decision 0069), and so is an experiment a collector raised an alarm for (0070): the
sets as pure functions, then rounds longer than the tick on PostgreSQL + etcd + Redis
and on SQLite + memory, with a clock the looks advance."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import pytest

from controlplane.benchmarks.scale import THRESHOLD_MS, _create
from controlplane.controller.runner import ALARMS_PER_PASS, Controller
from controlplane.controller.suspects import Alarmed, Suspects, streak_begun
from controlplane.db.migrate import upgrade
from controlplane.decision.model import MetricStreak
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.store import ExperimentRecord
from controlplane.kernel.alarms import Alarms
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.settings import Settings
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.streams_factory import open_streams
from controlplane.runtime import Backends, open_backends
from tests.decision.factory import healthy, slow, state

TICK = 0.25
LOOK_COST = 0.1  # what a look costs, on the fake clock: 8 looks make a 0.8 s round
N = 8
WEIGHT_BP = 1000  # the experiments' first step


# ---------------------------------------------------------------- the set, pure


def test_a_streak_of_the_samples_or_of_a_metric_makes_a_suspect() -> None:
    assert not streak_begun(state())
    assert streak_begun(state(consecutive_breaches=1))
    assert streak_begun(state(metric_streaks={"errors": MetricStreak(1.0, 1, 0)}))
    assert not streak_begun(state(metric_streaks={"errors": MetricStreak(1.0, 0, 3)}))
    # a paused experiment is judged by nobody: no suspect
    assert not streak_begun(state(status=ExperimentState.PAUSED, consecutive_breaches=1))


def test_suspects_are_due_a_tick_after_their_last_look_the_oldest_first() -> None:
    suspects = Suspects(TICK)
    suspects.observe(1, state(consecutive_breaches=1), now=10.0)
    suspects.observe(2, state(consecutive_breaches=1), now=9.9)
    suspects.observe(3, state(), now=9.0)  # no streak: not a suspect
    assert len(suspects) == 2
    assert suspects.due(10.1) == []
    assert suspects.due(10.2) == [2]
    assert suspects.due(10.25) == [2, 1]
    suspects.observe(2, state(consecutive_breaches=2), now=10.25)  # looked at again
    assert suspects.due(10.3) == [1]
    suspects.observe(1, state(), now=10.3)  # the streak ended
    suspects.keep({1, 3})  # 2 is no longer judged here
    assert len(suspects) == 0


def test_an_alarm_is_due_at_once_then_watched_each_tick_for_a_while() -> None:
    alarmed = Alarmed(TICK, watch_sec=1.0)
    assert alarmed.since() == -float("inf")
    alarmed.add({1: 100.0, 2: 101.0, 3: 99.0}, now=10.0)
    looked_at = {1: 10.0, 2: 10.0, 3: 9.9}
    assert alarmed.due(looked_at, 10.16, limit=8) == [3]  # 1 and 2 looked at a moment ago
    assert alarmed.due(looked_at, 10.3, limit=8) == [2, 1, 3]  # the newest alarm first
    assert alarmed.due(looked_at, 10.3, limit=2) == [2, 1]
    alarmed.looked(2)
    looked_at[2] = 10.3
    alarmed.add({2: 101.0}, now=10.3)  # the same alarm read again: already answered
    assert alarmed.due(looked_at, 10.4, limit=8) == [1, 3]
    # answered, 2 is still watched: due again a tick after its look, behind the others
    assert alarmed.due(looked_at, 10.6, limit=8) == [1, 3, 2]
    alarmed.looked(1)
    alarmed.looked(3)
    looked_at.update({1: 10.6, 3: 10.6})
    assert alarmed.due(looked_at, 10.9, limit=8) == [2, 1, 3]  # the longest unseen first
    assert alarmed.due(looked_at, 11.1, limit=8) == []  # watched for watch_sec only
    alarmed.add({2: 102.0}, now=11.1)  # raised again since: due at once, watched again
    assert alarmed.due(looked_at, 11.1, limit=8) == [2]
    assert alarmed.since() == 102.0 - 10.0  # collectors' clocks a little behind still read
    alarmed.forget(2)
    alarmed.add({1: 103.0, 4: 103.0}, now=11.2)
    alarmed.keep({1})  # 4 is no longer judged here
    assert set(alarmed.pending) == {1} and set(alarmed.watched) == {1}
    assert 4 not in alarmed.seen and len(alarmed) == 1


# ---------------------------------------------------------------- rounds


@dataclass
class Rig:
    backends: Backends
    clock: FakeClock
    controller: Controller
    ids: list[int]
    alarms: Alarms
    bad: set[int] = field(default_factory=set)
    looks: list[tuple[int, float]] = field(default_factory=list)

    async def reader(
        self, backends: Backends, experiment: str, window_sec: int
    ) -> Mapping[str, WindowSnapshot]:
        """Every look costs LOOK_COST of the clock; a bad experiment's canary is slow."""
        now = self.clock.now()
        if window_sec == 10:
            self.looks.append((int(experiment), now))
            self.clock.advance(LOOK_COST)
            now = self.clock.now()
        made = slow if int(experiment) in self.bad else healthy
        return made(now, bp=WEIGHT_BP, threshold_ms=THRESHOLD_MS, window_sec=window_sec)

    async def round(self) -> None:
        self.clock.advance(TICK)
        await self.controller.evaluate_all(self.backends, None)

    async def stored(self) -> dict[int, ExperimentRecord]:
        async with self.backends.store.transaction() as tx:
            found, _ = await tx.list_experiments()
        return {r.id: r for r in found}

    def looks_at(self, experiment_id: int) -> list[float]:
        return [at for i, at in self.looks if i == experiment_id]

    async def order(self) -> list[int]:
        """The order a round judges the experiments in, from a healthy round."""
        await self.round()
        judged = [i for i, _ in self.looks]
        assert sorted(judged) == sorted(self.ids)
        self.looks.clear()
        return judged


async def _rig(settings: Settings, lane: bool) -> AsyncIterator[Rig]:
    upgrade(settings.database_url)
    clock = FakeClock()
    backends = await open_backends(settings, clock=clock, streams=False)
    # the alarms on the settings' Redis (or the in-process twin), the windows from
    # the rig's reader
    _, board = open_streams(settings.redis_url, namespace=settings.redis_namespace,
                            clock=clock)  # fmt: skip
    assert isinstance(board, Alarms)
    try:
        ids = [int(e) for e, _ in await _create(backends, N, False)]
        controller = Controller(identity="suspects", tick=TICK, suspect_lane=lane,
                                alarm_lane=lane, alarm_source=board)  # fmt: skip
        rig = Rig(backends, clock, controller, ids, board)
        controller.snapshot_reader = rig.reader
        await controller.open(backends)
        try:
            yield rig
        finally:
            await controller.stop()
    finally:
        await board.close()
        await backends.close()


@pytest.fixture
async def rig(backend_settings: Settings) -> AsyncIterator[Rig]:
    async for made in _rig(backend_settings, lane=True):
        yield made


@pytest.fixture
async def rig_without_lane(backend_settings: Settings) -> AsyncIterator[Rig]:
    async for made in _rig(backend_settings, lane=False):
        yield made


async def test_a_streak_begun_early_in_a_long_round_trips_within_that_round(rig: Rig) -> None:
    order = await rig.order()
    bad = order[0]
    rig.bad.add(bad)
    await rig.round()
    stored = await rig.stored()
    assert stored[bad].breaker_state is BreakerState.OPEN
    assert stored[bad].canary_weight_bp == 0
    first, second = rig.looks_at(bad)
    # the second look came a tick after the first, not sooner, and not a round later
    assert TICK <= second - first < N * LOOK_COST
    # on the memory the first look left (the round's memory committed before it)
    assert rig.controller.stats.suspect_passes >= 1
    exported = {f.name: f.samples[0].value for f in rig.controller.metrics_collector().collect()
                if f.samples}
    assert exported["canary_controller_suspect_looks"] >= 1
    assert exported["canary_controller_suspects"] == 0  # tripped: no longer a suspect
    for other in order[1:]:
        assert len(rig.looks_at(other)) == 1, other
        assert stored[other].breaker_state is BreakerState.CLOSED
    assert rig.controller.stats.conflicts == 0
    assert len(rig.controller.suspects) == 0  # tripped: no longer a suspect


async def test_without_the_lane_the_second_look_waits_for_the_next_round(
    rig_without_lane: Rig,
) -> None:
    rig = rig_without_lane
    bad = (await rig.order())[0]
    rig.bad.add(bad)
    await rig.round()
    assert (await rig.stored())[bad].breaker_state is BreakerState.CLOSED
    await rig.round()
    assert (await rig.stored())[bad].breaker_state is BreakerState.OPEN
    first, second = rig.looks_at(bad)
    assert second - first >= N * LOOK_COST


async def test_a_suspect_judged_between_the_experiments_is_not_judged_again_in_that_round(
    rig: Rig,
) -> None:
    bad = (await rig.order())[-1]  # the round's last: its streak begins as it ends
    rig.bad.add(bad)
    await rig.round()
    assert (await rig.stored())[bad].breaker_state is BreakerState.CLOSED
    assert list(rig.controller.suspects.looked_at) == [bad]
    await rig.round()
    stored = await rig.stored()
    assert stored[bad].breaker_state is BreakerState.OPEN
    # tripped in a pass early in the second round; the round's own turn skipped it
    assert len(rig.looks_at(bad)) == 2
    assert Counter(i for i, _ in rig.looks).most_common(1)[0][1] == 2
    assert rig.controller.stats.conflicts == 0


async def test_many_suspects_at_once_all_trip_and_every_experiment_is_judged(rig: Rig) -> None:
    rig.bad.update(rig.ids)  # every canary breaches: a shared dependency failed
    await rig.round()
    await rig.round()
    stored = await rig.stored()
    assert {stored[i].breaker_state for i in rig.ids} == {BreakerState.OPEN}
    # a breach, its trip, and the second round's look at those tripped in the first:
    # no experiment looked at twice within a tick, none left out
    assert set(Counter(i for i, _ in rig.looks).values()) <= {2, 3}
    for experiment_id in rig.ids:
        times = rig.looks_at(experiment_id)
        assert all(b - a >= TICK for a, b in itertools.pairwise(times)), times
    assert rig.controller.stats.conflicts == 0


# ---------------------------------------------------------------- alarms (0070)


async def test_an_alarm_raised_for_the_last_experiment_has_it_judged_within_a_tick(
    rig: Rig,
) -> None:
    order = await rig.order()
    last = order[-1]
    rig.bad.add(last)
    # a collector raised an alarm as the round began: the round's last experiment
    # is judged a tick into the round, not at its end
    await rig.alarms.raise_alarms({str(last): 1_000.0}, 1_000.0)
    began = rig.clock.now() + TICK
    await rig.round()
    looks = rig.looks_at(last)
    assert looks[0] - began < 2 * TICK + LOOK_COST
    assert rig.controller.stats.alarm_looks == 1
    # its streak began at that look: a suspect, judged again a tick later, tripped
    # within the round that began with the alarm
    assert (await rig.stored())[last].breaker_state is BreakerState.OPEN
    assert len(looks) == 2 and looks[1] - looks[0] >= TICK
    for other in order[:-1]:
        assert len(rig.looks_at(other)) == 1, other
    # the same alarm, read again at the next pass, is answered: no look of its own
    rig.looks.clear()
    await rig.round()
    assert rig.controller.stats.alarm_looks == 1
    assert rig.controller.stats.conflicts == 0


async def test_without_the_lane_an_alarm_waits_for_the_round(rig_without_lane: Rig) -> None:
    rig = rig_without_lane
    last = (await rig.order())[-1]
    await rig.alarms.raise_alarms({str(last): 1_000.0}, 1_000.0)
    began = rig.clock.now() + TICK
    await rig.round()
    assert rig.looks_at(last)[0] - began >= (N - 1) * LOOK_COST - 1e-6
    assert rig.controller.stats.alarm_looks == 0


async def test_alarms_for_other_experiments_and_forged_ones_cost_no_look(rig: Rig) -> None:
    await rig.order()
    forged = {"999999": 1_000.0, "0": 1_000.0}
    await rig.alarms.raise_alarms(forged, 1_000.0)
    await rig.round()
    assert rig.controller.stats.alarm_looks == 0
    assert rig.controller.stats.alarms_read >= len(forged)  # read at every pass
    assert Counter(i for i, _ in rig.looks).most_common(1)[0][1] == 1
    assert len(rig.controller.alarmed) == 0


async def test_a_flood_of_alarms_takes_a_bounded_share_of_each_pass(rig: Rig) -> None:
    await rig.order()
    # every experiment raised at once (a forger, or a shared failure): each pass
    # looks at ALARMS_PER_PASS at most, and no experiment twice within a tick
    await rig.alarms.raise_alarms({str(i): 1_000.0 + i for i in rig.ids}, 1_000.0)
    passes = rig.controller.stats.suspect_passes
    await rig.round()
    looked = rig.controller.stats.alarm_looks
    assert 0 < looked <= ALARMS_PER_PASS * (rig.controller.stats.suspect_passes - passes)
    for experiment_id in rig.ids:
        # judged early by a pass, or by the round; the round's first ones, judged before
        # the first pass read the alarms, may be judged again, a tick later or more
        times = rig.looks_at(experiment_id)
        assert len(times) <= 2 and all(b - a >= TICK for a, b in itertools.pairwise(times))
    exported = {f.name: f.samples[0].value for f in rig.controller.metrics_collector().collect()
                if f.samples}
    assert exported["canary_controller_alarm_looks"] == looked


async def test_after_a_long_round_an_alarm_raised_meanwhile_is_judged_first(rig: Rig) -> None:
    last = (await rig.order())[-1]  # a round of N looks: longer than the tick
    # raised while that round ended: the next round begins with a pass, before its
    # first experiment, rather than a tick into the round
    await rig.alarms.raise_alarms({str(last): 1_000.0}, 1_000.0)
    await rig.round()
    assert rig.looks[0][0] == last
    # then watched at each pass (healthy, it is not tripped), a tick apart at least,
    # the round's own turn skipped
    times = rig.looks_at(last)
    assert rig.controller.stats.alarm_looks == len(times) > 1
    assert all(b - a >= TICK for a, b in itertools.pairwise(times))
