"""The data plane's report of the route it holds: when it is due, what a failure does."""

from __future__ import annotations

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.route_reports import REPORT_EVERY_SEC, RouteReport
from controlplane.kernel.streams_memory import MemoryStreams
from sidecar.route_report import RouteReporter, due


@pytest.mark.parametrize(("held", "reported", "last_at", "now", "expected"), [
    (3, None, None, 0.0, True),  # never reported
    (3, 3, 10.0, 10.0 + REPORT_EVERY_SEC - 0.01, False),
    (3, 3, 10.0, 10.0 + REPORT_EVERY_SEC, True),  # getting old
    (4, 3, 10.0, 10.1, True),  # the route changed
    (0, 3, 10.0, 10.1, True),  # the route was removed
])
def test_a_report_is_due_on_change_or_age(
    held: int, reported: int | None, last_at: float | None, now: float, expected: bool
) -> None:
    assert due(held=held, reported=reported, last_at=last_at, now=now) is expected


async def test_the_reporter_reports_changes_at_once_and_refreshes_on_age() -> None:
    clock = FakeClock()
    bus = MemoryStreams(clock=clock)
    held = [0]
    reporter = RouteReporter(bus, service="shop", instance="sc-1", held=lambda: held[0],
                             clock=clock)
    await reporter.look()
    held[0] = 7
    await reporter.look()
    await reporter.look()  # nothing changed, not old: no report
    assert reporter.sent == 2
    clock.advance(REPORT_EVERY_SEC)
    await reporter.look()
    assert reporter.sent == 3
    assert await bus.route_reports("shop") == [
        RouteReport("sc-1", 7, clock.now()), RouteReport("sc-1", 0, clock.now() - REPORT_EVERY_SEC),
    ]


async def test_a_failed_report_is_counted_and_tried_again() -> None:
    clock = FakeClock()
    bus = MemoryStreams(clock=clock)
    reporter = RouteReporter(bus, service="shop", instance="sc-1", held=lambda: 2, clock=clock)
    await bus.close()
    await reporter.look()
    await reporter.look()
    assert (reporter.sent, reporter.failed) == (0, 2)
    with pytest.raises(BackendUnavailable):
        await bus.route_reports("shop")
