"""plan_route, the reconciler's decision: desired (SQL) vs stored (etcd) → step. A table."""

from __future__ import annotations

import pytest

from controlplane.controller.route_plan import (
    Found,
    RouteOp,
    RoutePlan,
    Stored,
    moved_services,
    plan_route,
)
from controlplane.kernel.routes import Route, RouteState
from tests.support.routes import two_way_route


def route(revision: int, canary_bp: int = 500, experiment: int | str = 7,
          state: RouteState = RouteState.RUNNING) -> Route:
    return two_way_route(revision, experiment=experiment, canary_bp=canary_bp, state=state)


def stored(r: Route | None, mod: int = 40) -> Stored:
    return Stored(r, mod)


DESIRED = route(8)

CASES = [
    # desired, stored, last written → step, found, revision written
    ("in sync", DESIRED, stored(DESIRED), None, RouteOp.NOTHING, Found.IN_SYNC, None),
    ("first route of a service", route(1), None, None, RouteOp.PUBLISH, Found.PENDING, 1),
    ("one commit not yet published", DESIRED, stored(route(7, 100)), None,
     RouteOp.PUBLISH, Found.PENDING, 8),
    ("two commits since this leader wrote", DESIRED, stored(route(6, 100)), 6,
     RouteOp.PUBLISH, Found.PENDING, 8),
    ("wiped key", DESIRED, None, 8, RouteOp.PUBLISH, Found.MISSING, 8),
    ("wiped key, new leader", DESIRED, None, None, RouteOp.PUBLISH, Found.MISSING, 8),
    ("restored from an old snapshot", DESIRED, stored(route(5, 100)), 8,
     RouteOp.PUBLISH, Found.OLDER, 8),
    ("older, new leader", DESIRED, stored(route(3, 100)), None,
     RouteOp.PUBLISH, Found.OLDER, 8),
    ("newer than the database knows", DESIRED, stored(route(11, 9000)), 8,
     RouteOp.PUBLISH, Found.NEWER, 8),
    ("pinned at the largest revision", DESIRED, stored(route(2**31 - 1, 10_000)), 8,
     RouteOp.PUBLISH, Found.NEWER, 8),
    ("pinned, new leader", DESIRED, stored(route(2**31 - 1, 10_000)), None,
     RouteOp.PUBLISH, Found.NEWER, 8),
    ("same revision, other content", DESIRED, stored(route(8, 9000)), 8,
     RouteOp.PUBLISH, Found.FOREIGN, 8),
    ("same revision, other experiment", DESIRED, stored(route(8, experiment="x")), None,
     RouteOp.PUBLISH, Found.FOREIGN, 8),
    ("unreadable", DESIRED, stored(None), 8, RouteOp.PUBLISH, Found.UNREADABLE, 8),
    ("nothing either side", None, None, None, RouteOp.NOTHING, Found.UNOWNED, None),
    ("unowned, no canary traffic", None, stored(route(4, 0)), None,
     RouteOp.NOTHING, Found.UNOWNED, None),
    ("unowned, unreadable", None, stored(None), None, RouteOp.NOTHING, Found.UNOWNED, None),
    ("unowned canary traffic", None, stored(route(4, 2500)), None,
     RouteOp.NEUTRALISE, Found.UNOWNED, 4),
    ("unowned canary traffic, pinned", None, stored(route(2**31 - 1, 2500)), None,
     RouteOp.NEUTRALISE, Found.UNOWNED, 2**31 - 1),
]


@pytest.mark.parametrize(
    ("desired", "actual", "last", "op", "found", "written"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_plan(
    desired: Route | None, actual: Stored | None, last: int | None,
    op: RouteOp, found: Found, written: int | None,
) -> None:
    plan = plan_route(desired, actual, last_written=last)
    assert (plan.op, plan.found) == (op, found)
    assert (plan.route.revision if plan.route else None) == written
    repaired = found not in (Found.IN_SYNC, Found.PENDING) and op is not RouteOp.NOTHING
    assert plan.repair == repaired


def test_what_is_written_is_the_desired_route_whatever_etcd_holds() -> None:
    for held in (stored(route(11, 9000)), stored(route(2**31 - 1, 10_000)), None,
                 stored(None), stored(route(3))):
        assert plan_route(DESIRED, held, last_written=None).route == DESIRED


def test_an_unowned_canary_gets_everything_sent_to_its_baseline() -> None:
    plan = plan_route(None, stored(route(4, 2500)), last_written=None)
    assert plan == RoutePlan(RouteOp.NEUTRALISE, Found.UNOWNED, plan.route)
    assert plan.route is not None
    assert (plan.route.weight_of("baseline"), plan.route.weight_of("canary")) == (10_000, 0)
    assert plan.route.state is RouteState.ROLLED_BACK and plan.route.experiment == 7


def test_no_route_in_etcd_makes_the_plan_raise_the_desired_revision() -> None:
    # the desired revision grows only by commits: etcd cannot push it to its ceiling
    for revision in (9, 1000, 2**31 - 2, 2**31 - 1):
        plan = plan_route(DESIRED, stored(route(revision, 9000)), last_written=8)
        assert plan.route is not None and plan.route.revision == DESIRED.revision


@pytest.mark.parametrize(
    ("seen", "now", "moved"),
    [
        ({}, {}, set()),
        ({"a": 3, "b": 1}, {"a": 3, "b": 1}, set()),
        ({"a": 3, "b": 1}, {"a": 4, "b": 1}, {"a"}),
        ({"a": 3}, {"a": 3, "new": 1}, {"new"}),
        ({"a": 3, "gone": 2}, {"a": 3}, {"gone"}),
        ({"a": 5}, {"a": 4}, {"a"}),  # lower: restored from a backup, still looked at
    ],
)
def test_a_poll_looks_at_the_services_whose_revision_moved(
    seen: dict[str, int], now: dict[str, int], moved: set[str]
) -> None:
    assert moved_services(seen, now) == moved
