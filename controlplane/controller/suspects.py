"""Experiments whose breach streak has begun: looked at again at the next tick.

A trip needs `consecutive_breaches` breached looks in a row. While a round is shorter
than the tick, the next look at every experiment comes a tick later. At N = 1,000 a
round takes seconds, and the second breached look came a whole round after the
first: the trip took two rounds (decision 0069). A suspect is a running experiment
whose last look left a streak begun and not yet acted on (the samples' breaker or a
provider metric); between the experiments of a long round, once a tick, the
controller judges its suspects again, each no sooner than a tick after its last look,
so that looks stay as far apart as a short round makes them.

The set is bounded by the experiments judged here, and forgets an experiment at its
first look that leaves no streak, or once its decision was written other than as
memory (the record held is stale until the next listing).

The same passes judge the experiments a collector raised an alarm for (`Alarmed`,
decision 0070): a canary that just turned worse, looked at within a tick rather than
when the round reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.decision.model import RolloutState
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.kernel.alarms import CLOCK_SKEW_SEC, KEEP_SEC

# an alarmed experiment is judged at every tick for this long after its alarm
WATCH_SEC = 5.0


def streak_begun(state: RolloutState) -> bool:
    """Does the next breached look count toward an action (pure)? A running
    experiment with a breach streak of the samples or of a provider metric."""
    if state.status is not ExperimentState.RUNNING:
        return False
    return state.consecutive_breaches > 0 or any(
        streak.breaches > 0 for streak in state.metric_streaks.values()
    )


@dataclass
class Suspects:
    """Suspects by id, with the time of each one's last look."""

    tick: float
    looked_at: dict[int, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.looked_at)

    def observe(self, experiment_id: int, state: RolloutState, now: float) -> None:
        """A look at `experiment_id` left `state` in memory."""
        if streak_begun(state):
            self.looked_at[experiment_id] = now
        else:
            self.looked_at.pop(experiment_id, None)

    def forget(self, experiment_id: int) -> None:
        self.looked_at.pop(experiment_id, None)

    def keep(self, judged: set[int]) -> None:
        """Only experiments still judged here stay suspects."""
        for gone in [i for i in self.looked_at if i not in judged]:
            del self.looked_at[gone]

    def due(self, now: float) -> list[int]:
        """The suspects whose last look is a tick old or more, the oldest first."""
        ready = [(at, i) for i, at in self.looked_at.items() if now - at >= self.tick]
        return [i for _, i in sorted(ready)]


@dataclass
class Alarmed:
    """Experiments a collector raised an alarm for (kernel/alarms.py, decision 0070):
    judged in the same passes as the suspects, each no sooner than a tick after its
    last look; first those no look answered yet, then, for WATCH_SEC after an alarm,
    those watched again at every tick (a collector behind its streams publishes the
    rest of a bad canary's samples seconds after the batch that raised the alarm, and
    the look that answered it may have seen too few of them to breach).

    Alarm times are the collectors' clocks, never compared with the controller's: an
    alarm is new when it is later than the last one of the same experiment read."""

    tick: float
    watch_sec: float = WATCH_SEC
    pending: dict[int, float] = field(default_factory=dict)  # id -> alarm time
    seen: dict[int, float] = field(default_factory=dict)  # id -> newest alarm time read
    watched: dict[int, float] = field(default_factory=dict)  # id -> until (our clock)
    newest: float = -math.inf  # the newest alarm time read

    def __len__(self) -> int:
        return len(self.pending) + len(self.watched.keys() - self.pending.keys())

    def since(self) -> float:
        """Where the next read starts: alarms of a collector whose clock is behind
        the newest one's by up to CLOCK_SKEW_SEC are still read."""
        return self.newest - CLOCK_SKEW_SEC

    def add(self, alarms: Mapping[int, float], now: float) -> None:
        """Alarms read at `now` (our clock)."""
        for experiment_id, at in alarms.items():
            self.newest = max(self.newest, at)
            if at > self.seen.get(experiment_id, -math.inf):
                self.seen[experiment_id] = at
                self.pending[experiment_id] = at
                self.watched[experiment_id] = now + self.watch_sec

    def looked(self, experiment_id: int) -> None:
        """A look at `experiment_id` (by a round or a pass) answers its alarm."""
        self.pending.pop(experiment_id, None)

    def forget(self, experiment_id: int) -> None:
        """Not an experiment judged here (ended, another shard's, forged)."""
        self.pending.pop(experiment_id, None)
        self.watched.pop(experiment_id, None)

    def due(self, looked_at: Mapping[int, float], now: float, limit: int) -> list[int]:
        """Up to `limit` alarmed experiments whose last look is a tick old or more:
        the unanswered ones, the newest alarm first (one raised in vain again and
        again waits behind fresh ones), then the watched ones, the longest unseen
        first."""
        for done in [i for i, until in self.watched.items() if until < now]:
            del self.watched[done]
        ready = [i for i in self.pending.keys() | self.watched.keys()
                 if now - looked_at.get(i, -math.inf) >= self.tick]  # fmt: skip
        unanswered = sorted((-self.pending[i], i) for i in ready if i in self.pending)
        watched = sorted((looked_at.get(i, -math.inf), i) for i in ready
                         if i not in self.pending)  # fmt: skip
        return [i for _, i in unanswered + watched][:limit]

    def keep(self, judged: set[int]) -> None:
        """Only experiments still judged here stay; alarms older than any still on
        the wire are forgotten."""
        horizon = self.newest - KEEP_SEC - CLOCK_SKEW_SEC
        for table in (self.pending, self.watched):
            for gone in [i for i in table if i not in judged]:
                del table[gone]
        for old in [i for i, at in self.seen.items() if i not in judged or at < horizon]:
            del self.seen[old]
