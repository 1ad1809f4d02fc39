"""Building a service's route (architecture §4) from an experiment's plain values.

Used where a desired route is committed (db.routes: the API's actions, the
controller's decisions); knows neither FastAPI nor SQL nor etcd. The revision is the
caller's: one above the service's previous desired route, so it only grows, even
across the experiments of one service. Only the leader's reconciler writes routes to
etcd (controller.reconciler).
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants


@dataclass(frozen=True)
class RouteSource:
    """What a route is built from: the experiment's identity, upstreams and stickiness."""

    experiment: int | str
    service: str
    salt: str
    sticky: Sticky
    baseline_upstream: str
    canary_upstream: str


def build_route(
    source: RouteSource, *, canary_bp: int, state: RouteState, revision: int
) -> Route:
    return Route(
        experiment=source.experiment,
        revision=revision,
        salt=source.salt,
        sticky=source.sticky,
        variants=two_way_variants(source.baseline_upstream, source.canary_upstream, canary_bp),
        state=state,
    )
