"""The experiment lifecycle (architecture §7): states, actions and the one legal-move
table, and the breaker's states: the one home of these types.

    draft ──start──► running ──pause──► paused
                       ▲  ◄──resume──────┘
    running | paused ──promote──► promoted
    running | paused ──rollback─► rolled_back
    draft | running | paused ──abort──► aborted

Pure: no I/O, no clock. `transition` is the only way to change a state;
`route_after` says what an action publishes, `route_state_of` what route a state
stands for (the controller re-publishes it when etcd and the row disagree).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from controlplane.kernel.errors import IllegalTransition
from controlplane.kernel.routes import TOTAL_WEIGHT, RouteState


class ExperimentState(StrEnum):
    DRAFT = "draft"
    RUNNING = "running"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


class BreakerState(StrEnum):
    """The circuit breaker of a running experiment (architecture §7); the decision core
    moves it (decision.model.BREAKER_TRANSITIONS), the database stores its value."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class LifecycleAction(StrEnum):
    START = "start"
    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    ABORT = "abort"


S = ExperimentState

# action -> (states it may start from, state it leads to)
TRANSITIONS: dict[LifecycleAction, tuple[frozenset[ExperimentState], ExperimentState]] = {
    LifecycleAction.START: (frozenset({S.DRAFT}), S.RUNNING),
    LifecycleAction.PAUSE: (frozenset({S.RUNNING}), S.PAUSED),
    LifecycleAction.RESUME: (frozenset({S.PAUSED}), S.RUNNING),
    LifecycleAction.PROMOTE: (frozenset({S.RUNNING, S.PAUSED}), S.PROMOTED),
    LifecycleAction.ROLLBACK: (frozenset({S.RUNNING, S.PAUSED}), S.ROLLED_BACK),
    LifecycleAction.ABORT: (frozenset({S.DRAFT, S.RUNNING, S.PAUSED}), S.ABORTED),
}

ACTIVE = frozenset({S.RUNNING, S.PAUSED})
TERMINAL = frozenset({S.PROMOTED, S.ROLLED_BACK, S.ABORTED})
EDITABLE = frozenset({S.DRAFT})


class IllegalAction(IllegalTransition):
    """An action the current state does not allow; names the state and what would."""

    def __init__(
        self, action: LifecycleAction, current: ExperimentState, target: ExperimentState
    ) -> None:
        super().__init__("experiment", current.value, target.value)
        self.action = action
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[action][0]))
        self.args = (
            f"cannot {action.value} an experiment in state '{current.value}' "
            f"(only from: {allowed})",
        )


def transition(current: ExperimentState | str, action: LifecycleAction | str) -> ExperimentState:
    """The state `action` leads to from `current`; IllegalAction names both."""
    state = ExperimentState(current)
    act = LifecycleAction(action)
    sources, target = TRANSITIONS[act]
    if state not in sources:
        raise IllegalAction(act, state, target)
    return target


def allowed_actions(current: ExperimentState | str) -> list[LifecycleAction]:
    state = ExperimentState(current)
    return [action for action, (sources, _) in TRANSITIONS.items() if state in sources]


@dataclass(frozen=True)
class RouteAfterAction:
    """What the route must say after an action: the canary's share, the state and the step."""

    canary_bp: int
    state: RouteState
    step: int


def route_after(
    action: LifecycleAction,
    *,
    previous: ExperimentState,
    first_step_bp: int,
    canary_bp: int,
    step: int,
    breaker: BreakerState = BreakerState.CLOSED,
) -> RouteAfterAction | None:
    """The route an action publishes, or None when there is none to publish.

    Aborting a draft publishes nothing: it never had a route. Resuming keeps what the
    breaker says (an experiment paused while tripped resumes tripped, at weight 0).
    """
    match action:
        case LifecycleAction.START:
            return RouteAfterAction(first_step_bp, RouteState.RUNNING, 0)
        case LifecycleAction.PAUSE:
            return RouteAfterAction(canary_bp, RouteState.PAUSED, step)
        case LifecycleAction.RESUME:
            running = _RUNNING_ROUTE.get(breaker, RouteState.RUNNING)
            return RouteAfterAction(canary_bp, running, step)
        case LifecycleAction.PROMOTE:
            return RouteAfterAction(TOTAL_WEIGHT, RouteState.PROMOTED, step)
        case LifecycleAction.ROLLBACK:
            return RouteAfterAction(0, RouteState.ROLLED_BACK, step)
        case LifecycleAction.ABORT:
            if previous is ExperimentState.DRAFT:
                return None
            return RouteAfterAction(0, RouteState.ROLLED_BACK, step)


# the route state of a running experiment, by its breaker state
_RUNNING_ROUTE = {
    BreakerState.OPEN: RouteState.TRIPPED,
    BreakerState.HALF_OPEN: RouteState.HALF_OPEN,
}


def route_state_of(state: ExperimentState | str, breaker: BreakerState) -> RouteState | None:
    """The route state an experiment in `state` stands for; None: a draft has no route.

    A running experiment's route follows its breaker, as the controller writes it
    (open: tripped, half-open: half_open). An aborted experiment sends the canary
    nothing, as `route_after(ABORT)` publishes.
    """
    match ExperimentState(state):
        case ExperimentState.DRAFT:
            return None
        case ExperimentState.RUNNING:
            return _RUNNING_ROUTE.get(breaker, RouteState.RUNNING)
        case ExperimentState.PAUSED:
            return RouteState.PAUSED
        case ExperimentState.PROMOTED:
            return RouteState.PROMOTED
        case ExperimentState.ROLLED_BACK | ExperimentState.ABORTED:
            return RouteState.ROLLED_BACK
