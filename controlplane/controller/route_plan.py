"""What the leader does about one service's route: desired (SQL) vs stored (etcd) → a RouteOp.

Pure: the reconciler (controller.reconciler) reads both sides, asks `plan_route`, and
does what it says. Level-triggered: the answer depends only on what is there now,
plus the revision this leader last wrote for the service (which tells a route it
simply has not published yet from one somebody else changed).

    stored ≡ desired                          → nothing
    stored newer, or same revision, other     → publish the desired route (sidecars hold
      content (a foreign write)                  the route etcd delivered last, whatever
                                                 its revision says)
    stored unreadable                         → publish the desired route
    stored older or missing                   → publish; a repair (recorded) unless it is
                                                 the route this leader wrote last, or the
                                                 one just before the desired revision
    no desired route, stored sends canary     → neutralise: baseline only, at its own
      traffic                                    revision (nothing watches that canary)
    no desired route otherwise                → leave it

The desired revision only ever grows by its own commits: nothing written to etcd
moves it (decision 0043), so a route pinned at the largest revision is superseded
like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from controlplane.kernel.routes import (
    BASELINE,
    CANARY,
    TOTAL_WEIGHT,
    Route,
    RouteState,
    RouteVariant,
)


class Found(StrEnum):
    """What the reconciler found in etcd, as `route_reconciled` events name it."""

    IN_SYNC = "in_sync"
    PENDING = "pending"  # a committed route not published yet: the ordinary path
    MISSING = "missing"
    OLDER = "older"
    NEWER = "newer"
    FOREIGN = "foreign"  # the desired revision with other content
    UNREADABLE = "unreadable"
    UNOWNED = "unowned"  # a route on a service the database has none for


class RouteOp(StrEnum):
    NOTHING = "nothing"
    PUBLISH = "publish"
    NEUTRALISE = "neutralise"


@dataclass(frozen=True)
class Stored:
    """The service's key in etcd: its route (None: unreadable) and mod revision."""

    route: Route | None
    mod_revision: int


@dataclass(frozen=True)
class RoutePlan:
    """The reconciler's verdict on one service: what to do, what it found, what to write."""

    op: RouteOp
    found: Found
    route: Route | None = None  # what to write

    @property
    def repair(self) -> bool:
        """Whether etcd held something it should not: worth a `route_reconciled` event."""
        return self.found not in (Found.IN_SYNC, Found.PENDING) and self.op is not RouteOp.NOTHING


def baseline_only(route: Route, revision: int) -> Route | None:
    """`route` with everything sent to its baseline; None when it has none."""
    if not any(v.name == BASELINE for v in route.variants):
        return None
    variants = tuple(
        RouteVariant(name=v.name, upstream=v.upstream,
                     weight=TOTAL_WEIGHT if v.name == BASELINE else 0)
        for v in route.variants
    )
    return route.model_copy(
        update={"variants": variants, "state": RouteState.ROLLED_BACK, "revision": revision}
    )


def plan_route(
    desired: Route | None, stored: Stored | None, *, last_written: int | None
) -> RoutePlan:
    """The operation that makes the stored route equal the desired one.

    `stored`: None when the key is missing. `last_written`: the revision this leader
    last wrote (or saw in sync) for the service; None when it has not yet.
    """
    current = stored.route if stored is not None else None
    if desired is None:
        if current is None or current.weight_of(CANARY) == 0:
            return RoutePlan(RouteOp.NOTHING, Found.UNOWNED)
        neutral = baseline_only(current, current.revision)
        if neutral is None:
            return RoutePlan(RouteOp.NOTHING, Found.UNOWNED)
        return RoutePlan(RouteOp.NEUTRALISE, Found.UNOWNED, neutral)
    if stored is not None and current is None:
        return RoutePlan(RouteOp.PUBLISH, Found.UNREADABLE, desired)
    if current is not None and current.revision >= desired.revision:
        if current == desired:
            return RoutePlan(RouteOp.NOTHING, Found.IN_SYNC)
        found = Found.NEWER if current.revision > desired.revision else Found.FOREIGN
        return RoutePlan(RouteOp.PUBLISH, found, desired)
    held = current.revision if current is not None else 0
    # what etcd should hold while the route waits to be published
    expected = last_written if last_written is not None else desired.revision - 1
    if held == expected:
        return RoutePlan(RouteOp.PUBLISH, Found.PENDING, desired)
    return RoutePlan(RouteOp.PUBLISH, Found.MISSING if current is None else Found.OLDER, desired)


def moved_services(seen: Mapping[str, int], now: Mapping[str, int]) -> frozenset[str]:
    """The services whose desired revision differs from the one last reconciled, or
    that appeared or disappeared since: what a poll of revisions has to look at."""
    return frozenset(
        service for service in seen.keys() | now.keys() if seen.get(service) != now.get(service)
    )
