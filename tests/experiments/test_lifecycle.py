"""The lifecycle table: every (state, action) pair, legal or named as illegal."""

from __future__ import annotations

import pytest

from controlplane.experiments.lifecycle import (
    ExperimentState,
    LifecycleAction,
    route_after,
    route_state_of,
    transition,
)
from controlplane.kernel.errors import IllegalTransition
from controlplane.kernel.routes import RouteState

S, A = ExperimentState, LifecycleAction

LEGAL = {
    (S.DRAFT, A.START): S.RUNNING,
    (S.DRAFT, A.ABORT): S.ABORTED,
    (S.RUNNING, A.PAUSE): S.PAUSED,
    (S.RUNNING, A.PROMOTE): S.PROMOTED,
    (S.RUNNING, A.ROLLBACK): S.ROLLED_BACK,
    (S.RUNNING, A.ABORT): S.ABORTED,
    (S.PAUSED, A.RESUME): S.RUNNING,
    (S.PAUSED, A.PROMOTE): S.PROMOTED,
    (S.PAUSED, A.ROLLBACK): S.ROLLED_BACK,
    (S.PAUSED, A.ABORT): S.ABORTED,
}


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("action", list(A))
def test_transition_follows_the_table_and_names_the_current_state(
    state: ExperimentState, action: LifecycleAction
) -> None:
    expected = LEGAL.get((state, action))
    if expected is not None:
        assert transition(state, action) is expected
        return
    with pytest.raises(IllegalTransition) as caught:
        transition(state, action)
    assert caught.value.current == state.value
    assert f"'{state.value}'" in str(caught.value)


@pytest.mark.parametrize(
    ("action", "previous", "expected"),
    [
        (A.START, S.DRAFT, (500, RouteState.RUNNING, 0)),
        (A.PAUSE, S.RUNNING, (2500, RouteState.PAUSED, 2)),
        (A.RESUME, S.PAUSED, (2500, RouteState.RUNNING, 2)),
        (A.PROMOTE, S.RUNNING, (10_000, RouteState.PROMOTED, 2)),
        (A.ROLLBACK, S.PAUSED, (0, RouteState.ROLLED_BACK, 2)),
        (A.ABORT, S.RUNNING, (0, RouteState.ROLLED_BACK, 2)),
        (A.ABORT, S.DRAFT, None),
    ],
)
def test_route_after_each_action(
    action: LifecycleAction, previous: ExperimentState, expected: tuple[int, RouteState, int] | None
) -> None:
    plan = route_after(action, previous=previous, first_step_bp=500, canary_bp=2500, step=2)
    if expected is None:
        assert plan is None
    else:
        assert plan is not None
        assert (plan.canary_bp, plan.state, plan.step) == expected


@pytest.mark.parametrize(
    ("state", "breaker", "expected"),
    [
        (S.DRAFT, "closed", None),
        (S.RUNNING, "closed", RouteState.RUNNING),
        (S.RUNNING, "open", RouteState.TRIPPED),
        (S.RUNNING, "half_open", RouteState.HALF_OPEN),
        (S.PAUSED, "open", RouteState.PAUSED),
        (S.PROMOTED, "closed", RouteState.PROMOTED),
        (S.ROLLED_BACK, "open", RouteState.ROLLED_BACK),
        (S.ABORTED, "closed", RouteState.ROLLED_BACK),
    ],
)
def test_route_state_of_each_state_and_breaker(
    state: ExperimentState, breaker: str, expected: RouteState | None
) -> None:
    assert route_state_of(state, breaker) is expected


@pytest.mark.parametrize("breaker", ["closed", "open", "half_open"])
@pytest.mark.parametrize(("source", "action"), sorted(LEGAL))
def test_route_state_of_agrees_with_what_each_action_publishes(
    source: ExperimentState, action: LifecycleAction, breaker: str
) -> None:
    plan = route_after(
        action, previous=source, first_step_bp=500, canary_bp=2500, step=2, breaker=breaker
    )
    if plan is None:  # a draft aborted: it never had a route to stand for
        assert (source, action) == (S.DRAFT, A.ABORT)
        return
    # a start resets the breaker (closed); every other action keeps it
    kept = "closed" if action is A.START else breaker
    assert plan.state is route_state_of(transition(source, action), kept)
