"""Which experiments the collector may forget: ended ones, once their window is over.

Routes in etcd name each service's experiment and its state. An experiment is live
while some service's route names it in a live state (running, paused, tripped,
half_open); it ends when the last such route moves on (promoted, rolled back, deleted,
or replaced by another experiment's). Once it has been over for a grace period (its
longest window, so the last samples it judged have left every window) the collector
drops its windows and its partial: memory follows the live experiments, not every
experiment the collector ever saw.

Samples of an experiment already forgotten (late ones, a sidecar still sending) make a
window again; `revived` ends it again at once, so it is forgotten again after its grace
rather than kept for good. The forgotten ids remembered for that are bounded (LRU).

Pure bookkeeping: route events and the time come in as arguments, nothing is read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from controlplane.kernel.routes import RouteState

LIVE_STATES = frozenset(
    {RouteState.RUNNING, RouteState.PAUSED, RouteState.TRIPPED, RouteState.HALF_OPEN}
)
REMEMBER_FORGOTTEN = 65_536


class ExperimentLifecycle:
    """Live experiments from route events; ended ones and when they ended."""

    def __init__(self, *, remember_forgotten: int = REMEMBER_FORGOTTEN) -> None:
        self._named_by: dict[str, str] = {}  # service -> experiment its route names
        self._live_in: dict[str, set[str]] = {}  # experiment -> services running it
        self._ended: dict[str, float] = {}  # experiment -> when it ended
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_forgotten

    def route(
        self, service: str, experiment: str | None, state: RouteState | None, now: float
    ) -> None:
        """Service's route now names `experiment` in `state` (None, None: deleted)."""
        previous = self._named_by.pop(service, None)
        if previous is not None:
            services = self._live_in.get(previous)
            if services is not None:
                services.discard(service)
                if not services:
                    del self._live_in[previous]
            if previous != experiment and previous not in self._live_in:
                self._ended.setdefault(previous, now)
        if experiment is None:
            return
        self._named_by[service] = experiment
        if state in LIVE_STATES:
            self._live_in.setdefault(experiment, set()).add(service)
            self._ended.pop(experiment, None)
            self._forgotten.pop(experiment, None)
        elif experiment not in self._live_in:
            self._ended.setdefault(experiment, now)

    def is_live(self, experiment: str) -> bool:
        return experiment in self._live_in

    def ended_at(self, experiment: str) -> float | None:
        return self._ended.get(experiment)

    def revived(self, experiment: str, now: float) -> None:
        """A window was made for `experiment`: if it was forgotten, it is over again."""
        if experiment in self._forgotten and experiment not in self._live_in:
            self._ended.setdefault(experiment, now)

    def due(self, now: float, grace_of: Callable[[str], float]) -> list[str]:
        """Ended experiments whose grace period has passed at `now`."""
        return [e for e, at in self._ended.items() if now - at >= grace_of(e)]

    def forgotten(self, experiment: str) -> None:
        """The collector dropped `experiment`'s state: stop tracking its end."""
        self._ended.pop(experiment, None)
        self._forgotten[experiment] = None
        self._forgotten.move_to_end(experiment)
        while len(self._forgotten) > self._remember:
            self._forgotten.popitem(last=False)

    @property
    def ended_count(self) -> int:
        return len(self._ended)
