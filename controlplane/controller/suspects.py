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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.decision.model import RolloutState
from controlplane.experiments.lifecycle import ExperimentState


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
