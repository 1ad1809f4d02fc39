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
