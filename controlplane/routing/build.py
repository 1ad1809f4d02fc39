"""Building a service's route (architecture §4) from an experiment's plain values.

Used where a desired route is committed (db.routes: the API's actions, the
controller's decisions); knows neither FastAPI nor SQL nor etcd. The revision is the
caller's: one above the service's previous desired route, so it only grows, even
across the experiments of one service. Only the leader's reconciler writes routes to
etcd (controller.reconciler).
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.routes import (
    BASELINE,
    TOTAL_WEIGHT,
    Route,
    RouteState,
    RouteVariant,
    Sticky,
    two_way_variants,
)


@dataclass(frozen=True)
class RouteSource:
    """What a route is built from: the experiment's identity, upstreams and stickiness."""

    experiment: int | str
    service: str
    salt: str
    sticky: Sticky
    baseline_upstream: str
    canary_upstream: str


def route_variants(
    source: RouteSource, *, canary_bp: int, state: RouteState
) -> tuple[RouteVariant, ...]:
    """The variants of the route: both while the experiment runs, the stable version
    alone once it has ended (`canary_bp` then says nothing more)."""
    match state:
        case RouteState.PROMOTED:
            return (RouteVariant(name=BASELINE, upstream=source.canary_upstream,
                                 weight=TOTAL_WEIGHT),)
        case RouteState.ROLLED_BACK:
            return (RouteVariant(name=BASELINE, upstream=source.baseline_upstream,
                                 weight=TOTAL_WEIGHT),)
        case _:
            return two_way_variants(source.baseline_upstream, source.canary_upstream,
                                    canary_bp)


def build_route(
    source: RouteSource, *, canary_bp: int, state: RouteState, revision: int
) -> Route:
    return Route(
        experiment=source.experiment,
        revision=revision,
        salt=source.salt,
        sticky=source.sticky,
        variants=route_variants(source, canary_bp=canary_bp, state=state),
        state=state,
    )
