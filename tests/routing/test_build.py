"""build_route: the §4 route an experiment's values and a weight stand for."""

from __future__ import annotations

import pytest

from controlplane.kernel.routes import RouteState, Sticky, parse_route
from controlplane.routing.build import RouteSource, build_route


def source() -> RouteSource:
    return RouteSource(
        experiment=7,
        service="payment-api",
        salt="s4lt",
        sticky=Sticky(header=None, cookie="uid"),
        baseline_upstream="http://v1:80",
        canary_upstream="http://v2:80",
    )


def test_the_route_carries_the_weights_the_state_and_the_callers_revision() -> None:
    route = build_route(source(), canary_bp=500, state=RouteState.RUNNING, revision=12)
    assert (route.experiment, route.revision, route.salt) == (7, 12, "s4lt")
    assert route.sticky == Sticky(header=None, cookie="uid")
    assert [(v.name, v.upstream, v.weight) for v in route.variants] == [
        ("baseline", "http://v1:80", 9_500),
        ("canary", "http://v2:80", 500),
    ]
    assert parse_route(route.to_json()) == route


@pytest.mark.parametrize("canary_bp", [-1, 10_001])
def test_a_weight_outside_the_total_is_refused(canary_bp: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        build_route(source(), canary_bp=canary_bp, state=RouteState.RUNNING, revision=1)


@pytest.mark.parametrize(
    ("state", "stable"),
    [(RouteState.PROMOTED, "http://v2:80"), (RouteState.ROLLED_BACK, "http://v1:80")],
)
@pytest.mark.parametrize("canary_bp", [0, 500, 10_000])
def test_a_finished_experiment_leaves_the_stable_version_alone_in_the_route(
    state: RouteState, stable: str, canary_bp: int
) -> None:
    """Promoted: the canary is the stable version; rolled back: the baseline stays it.
    Either way one variant, `baseline`, whatever weight the canary had last."""
    route = build_route(source(), canary_bp=canary_bp, state=state, revision=3)
    assert [(v.name, v.upstream, v.weight) for v in route.variants] == [
        ("baseline", stable, 10_000)
    ]
    assert route.weight_of("canary") == 0 and route.state is state
    assert parse_route(route.to_json()) == route


@pytest.mark.parametrize(
    "state", [RouteState.RUNNING, RouteState.PAUSED, RouteState.TRIPPED, RouteState.HALF_OPEN]
)
def test_a_live_experiment_keeps_both_variants_even_at_weight_0(state: RouteState) -> None:
    route = build_route(source(), canary_bp=0, state=state, revision=3)
    assert [(v.name, v.weight) for v in route.variants] == [("baseline", 10_000), ("canary", 0)]
