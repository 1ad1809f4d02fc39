"""Publishing a service's route (architecture §4) with compare-and-swap.

Shared by the API (lifecycle actions) and the controller (steps, trips, probes), so it
knows neither FastAPI nor SQL: it takes plain values and a KeyValueStore.

Every write is a compare-and-swap on the etcd mod revision the writer read, so a
writer that decided on an older route can never overwrite a newer one: it gets
RevisionConflict and must decide again from fresh state. The route's own `revision`
is the previous route's + 1 (never below what the experiment last published), so it
only grows, even across experiments on one service.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.errors import RevisionConflict, ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import Fence, KeyValue, KeyValueStore
from controlplane.kernel.routes import Route, RouteState, Sticky, parse_route, two_way_variants


@dataclass(frozen=True)
class RouteSource:
    """What a route is built from: the experiment's identity, upstreams and stickiness."""

    experiment: int | str
    service: str
    salt: str
    sticky: Sticky
    baseline_upstream: str
    canary_upstream: str
    # the last route revision this experiment published (0: none)
    route_revision: int = 0


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


def previous_revision(current: KeyValue | None) -> int:
    """The revision of the stored route; 0 when there is none or it is unreadable.

    An unreadable value is superseded, not trusted: the next route repairs the key.
    """
    if current is None:
        return 0
    try:
        return parse_route(current.value).revision
    except ValidationFailed:
        return 0


async def publish_route(
    kv: KeyValueStore,
    keys: EtcdKeys,
    *,
    experiment: RouteSource,
    canary_bp: int,
    state: RouteState,
    fence: Fence | None = None,
    retries: int = 0,
) -> Route:
    """Write the service's route; return what was written.

    `retries`: how many times to re-read and write again after a RevisionConflict.
    Only a caller whose decision does not depend on the route it read may retry (the
    API, which decides under the experiment's SQL row version); the controller keeps
    the default 0 and re-decides from fresh state instead.
    """
    key = keys.route(experiment.service)
    for attempt in range(retries + 1):
        current = await kv.get(key)
        revision = max(previous_revision(current), experiment.route_revision) + 1
        route = build_route(experiment, canary_bp=canary_bp, state=state, revision=revision)
        try:
            await kv.compare_and_swap(
                key,
                route.to_json().encode(),
                expected_mod_revision=current.mod_revision if current else 0,
                fence=fence,
            )
        except RevisionConflict:
            if attempt == retries:
                raise
            continue
        return route
    raise AssertionError("unreachable")  # pragma: no cover
