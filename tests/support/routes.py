"""Routes as a test writes them by hand: a two-way split between fixed upstreams."""

from __future__ import annotations

from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants


def two_way_route(
    revision: int,
    *,
    experiment: int | str,
    canary_bp: int,
    state: RouteState,
) -> Route:
    return Route(
        experiment=experiment,
        revision=revision,
        salt="s",
        sticky=Sticky(),
        variants=two_way_variants("http://v1", "http://v2", canary_bp),
        state=state,
    )
