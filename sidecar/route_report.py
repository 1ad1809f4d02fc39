"""Tell the control plane which route revision this data plane holds (decision 0053).

A sidecar worker or a router agent reports `(instance, revision)` at once when the
revision it holds changes and every REPORT_EVERY_SEC otherwise, so that the API can
say a route is confirmed rather than only published. Reporting is best effort: a
failed report is counted and tried again at the next look, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.errors import CanaryError
from controlplane.kernel.route_reports import REPORT_EVERY_SEC, RouteReports
from controlplane.kernel.tasks import cancel_and_wait

log = logging.getLogger("canary.sidecar")

LOOK_EVERY_SEC = 0.25  # how soon a changed route is reported


def due(*, held: int, reported: int | None, last_at: float | None, now: float) -> bool:
    """Report now: the revision changed, or the last report is getting old."""
    return reported != held or last_at is None or now - last_at >= REPORT_EVERY_SEC


class RouteReporter:
    def __init__(
        self,
        reports: RouteReports,
        *,
        service: str,
        instance: str,
        held: Callable[[], int],
        clock: Clock | None = None,
        look_every: float = LOOK_EVERY_SEC,
    ) -> None:
        self._reports = reports
        self._service = service
        self._instance = instance
        self._held = held  # the revision in force now, 0 for none
        self._clock: Clock = clock or SystemClock()
        self._look_every = look_every
        self._reported: int | None = None
        self._last_at: float | None = None
        self.sent = 0
        self.failed = 0
        self._task: asyncio.Task[None] | None = None

    async def look(self) -> None:
        """One look: report when due."""
        held = self._held()
        if not due(held=held, reported=self._reported, last_at=self._last_at,
                   now=self._clock.monotonic()):
            return
        try:
            await self._reports.report_route(self._service, self._instance, held,
                                             self._clock.now())
        except (CanaryError, ValueError) as exc:
            self.failed += 1
            if self.failed == 1 or self.failed % 100 == 0:
                log.warning("cannot report the route in force (%d failures): %s",
                            self.failed, exc)
            return
        self.sent += 1
        self._reported, self._last_at = held, self._clock.monotonic()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="route-reporter")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # never let a report end the loop
                await self.look()
            await asyncio.sleep(self._look_every)
