"""Which services hold a route no committed transaction wrote, and what it goes back to.

Table tests of the pure part of controller.orphans; the rounds against the backends
are in test_failed_start.
"""

from __future__ import annotations

import pytest

from controlplane.controller.orphans import (
    FinishedRoute,
    NamedRow,
    OrphanRoute,
    Restore,
    experiment_id_of,
    experiments_to_look_up,
    orphan_route,
    orphan_routes,
    restore_of,
    routes_by_service,
)
from controlplane.kernel.kv import KeyValue
from controlplane.kernel.routes import Route, RouteState
from tests.support.routes import two_way_route

SERVICE = "checkout"
PREFIX = "/canary/routes/"


def stored(
    revision: int = 6,
    *,
    experiment: int | str = 12,
    canary_bp: int = 500,
    state: RouteState = RouteState.RUNNING,
) -> Route:
    return two_way_route(revision, experiment=experiment, canary_bp=canary_bp, state=state)


def row(
    state: str = "draft",
    *,
    route_revision: int = 0,
    experiment: int = 12,
    service: str = SERVICE,
) -> NamedRow:
    return NamedRow(experiment, service, state, route_revision, version=3)


BASELINE_ONLY = {"canary_bp": 0, "state": RouteState.ROLLED_BACK}


@pytest.mark.parametrize(
    ("route", "active", "named", "orphaned"),
    [
        # the failed start of a draft: it knows no revision at all
        (stored(), False, row(), True),
        (stored(1), False, row(), True),
        # the baseline-only route restored for that draft: in line
        (stored(7, **BASELINE_ONLY), False, row(route_revision=7), False),
        # a finished experiment's committed route, and one newer than it knows
        (stored(5, state=RouteState.PROMOTED), False, row("promoted", route_revision=5), False),
        (stored(6), False, row("rolled_back", route_revision=5), True),
        # a service with an active experiment: its row owns the route (reconcile)
        (stored(), True, row(), False),
        (stored(), True, None, False),
        # the named row started after the round read the active ones: reconcile's
        (stored(), False, row("running", route_revision=6), False),
        # nothing (readable) stored
        (None, False, row(), False),
        # a route naming no row of the service: an orphan only while it feeds the canary
        (stored(), False, None, True),
        (stored(**BASELINE_ONLY), False, None, False),
        (stored(), False, row(service="payments"), True),
        (stored(), False, row("running", route_revision=9, service="payments"), True),
        (stored(**BASELINE_ONLY), False, row(service="payments"), False),
    ],
)
def test_an_orphan_is_a_route_no_committed_transaction_of_the_service_wrote(
    route: Route | None, active: bool, named: NamedRow | None, orphaned: bool
) -> None:
    orphan = orphan_route(SERVICE, route, active=active, named=named)
    assert (orphan is not None) is orphaned
    if orphan is not None:
        assert (orphan.service, orphan.stored, orphan.named) == (SERVICE, route, named)


def test_only_a_row_of_the_service_owns_the_orphan() -> None:
    assert OrphanRoute(SERVICE, stored(), row()).owner == row()
    assert OrphanRoute(SERVICE, stored(), row(service="payments")).owner is None
    assert OrphanRoute(SERVICE, stored(), None).owner is None


def test_orphans_are_looked_for_only_on_services_without_an_active_experiment() -> None:
    routes = {
        "checkout": stored(experiment=12),
        "payments": stored(experiment=13),  # active: reconcile's
        "search": stored(experiment="14"),  # a numeric name still names row 14
        "legacy": stored(experiment="hand-written"),  # names no row
        "cart": stored(2, experiment=15, **BASELINE_ONLY),
    }
    active = {"payments"}
    assert experiments_to_look_up(routes, active) == {12, 14, 15}
    rows = {12: row(experiment=12), 14: row(experiment=14, service="search")}
    found = orphan_routes(routes, active_services=active, rows=rows)
    assert [(o.service, o.named) for o in found] == [
        ("checkout", rows[12]),
        ("legacy", None),
        ("search", rows[14]),
    ]


@pytest.mark.parametrize(
    ("route", "expected"),
    [(stored(experiment=7), 7), (stored(experiment="7"), 7), (stored(experiment="demo"), None)],
)
def test_a_route_names_a_row_by_its_numeric_id(route: Route, expected: int | None) -> None:
    assert experiment_id_of(route) == expected


def test_routes_are_read_by_service_and_an_unreadable_one_is_left_alone() -> None:
    def kv(key: str, value: bytes) -> KeyValue:
        return KeyValue(PREFIX + key, value, mod_revision=1, create_revision=1)

    values = [
        kv("checkout", stored().to_json().encode()),
        kv("broken", b"{not json"),
        kv("nested/key", stored().to_json().encode()),
    ]
    assert routes_by_service(values, PREFIX) == {"checkout": stored()}


PROMOTED = FinishedRoute(
    experiment=9,
    experiment_state="promoted",
    route_revision=5,
    canary_bp=10_000,
    state=RouteState.PROMOTED,
)


@pytest.mark.parametrize(
    ("orphan", "finished", "expected"),
    [
        # a finished experiment's route is what the service served: it comes back
        (
            OrphanRoute(SERVICE, stored(), row()),
            PROMOTED,
            Restore(9, 10_000, RouteState.PROMOTED, PROMOTED),
        ),
        (
            OrphanRoute(SERVICE, stored(), None),
            PROMOTED,
            Restore(9, 10_000, RouteState.PROMOTED, PROMOTED),
        ),
        # none ever committed a route: the baseline only, built from the draft
        (OrphanRoute(SERVICE, stored(), row()), None, Restore(12, 0, RouteState.ROLLED_BACK, None)),
        # ... or from the stored route when it names no row of the service
        (
            OrphanRoute(SERVICE, stored(), None),
            None,
            Restore(None, 0, RouteState.ROLLED_BACK, None),
        ),
        (
            OrphanRoute(SERVICE, stored(), row(service="payments")),
            None,
            Restore(None, 0, RouteState.ROLLED_BACK, None),
        ),
    ],
)
def test_an_orphan_gives_way_to_the_last_finished_route_else_the_baseline_only(
    orphan: OrphanRoute, finished: FinishedRoute | None, expected: Restore
) -> None:
    assert restore_of(orphan, finished) == expected
