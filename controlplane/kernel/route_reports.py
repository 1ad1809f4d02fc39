"""Data planes confirm the route they hold: the sidecars' and router agents' reports.

A route committed to SQL and written to etcd is *published*; it is *confirmed* once
a data plane (a sidecar worker, a router agent whose proxy holds it) says it serves
that revision or a later one of the service (decision 0053). Each data plane
reports `(instance, revision)` every few seconds and at once when its route changes,
on the channel it already writes to (Redis, beside its samples); readers count the
reports newer than `FRESH_SEC`. A report is evidence for a person, never an input to
a decision: anyone who can write Redis can forge one, so it is parsed strictly and
bounded, and nothing acts on it.

Wire form: one sorted set per service, member `<instance>@<revision>`, score the
reporter's wall-clock time in seconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

REPORT_EVERY_SEC = 5.0  # a data plane's report, when nothing changes
FRESH_SEC = 30.0  # reports older than this are a data plane gone (or a clock far off)
FORGET_SEC = 120.0  # reports older than this are removed by the next writer
# a report dated further ahead than this is a clock far off (or a forgery): it is not
# counted, and the next writer removes it, so it cannot stay "fresh" for ever
CLOCK_SKEW_SEC = 10.0
MAX_REPORTS = 1024  # a reader looks at this many of the newest members at most
MAX_REVISION = 2**62
INSTANCE = re.compile(r"[A-Za-z0-9._:-]{1,160}")


@dataclass(frozen=True)
class RouteReport:
    instance: str
    revision: int  # 0: no route in force
    seen_at: float  # the reporter's clock, seconds since the epoch


def report_member(instance: str, revision: int) -> str:
    if not INSTANCE.fullmatch(instance) or not 0 <= revision <= MAX_REVISION:
        raise ValueError(f"not a reportable data plane: {instance!r} at {revision}")
    return f"{instance}@{revision}"


def parse_member(member: str, score: float) -> RouteReport | None:
    """A report from its wire form; None (dropped) when it is not one we wrote."""
    instance, sep, text = member.rpartition("@")
    if not sep or not INSTANCE.fullmatch(instance) or not text.isdigit() or len(text) > 19:
        return None
    revision = int(text)
    if revision > MAX_REVISION or not math.isfinite(score) or score <= 0:
        return None
    return RouteReport(instance=instance, revision=revision, seen_at=score)


@dataclass(frozen=True)
class Confirmation:
    """What the reports say about one revision of a service's route."""

    data_planes: int  # data planes that reported within FRESH_SEC
    confirmed: int  # of which hold `revision` or a later one
    future: int = 0  # reports dated more than CLOCK_SKEW_SEC ahead: not counted

    @property
    def sentence(self) -> str:
        if self.data_planes == 0:
            said = (f"published, not yet confirmed: no data plane reported within "
                    f"{FRESH_SEC:g} s (is a sidecar or router running for this service?)")
        elif self.confirmed == 0:
            said = (f"published, not yet confirmed: none of {self.data_planes} data "
                    "plane(s) holds it yet")
        else:
            said = f"confirmed by {self.confirmed} of {self.data_planes} data plane(s)"
        if self.future:
            said += (f"; {self.future} report(s) dated more than {CLOCK_SKEW_SEC:g} s ahead "
                     "ignored (a clock far off?)")
        return said


def confirm(reports: Iterable[RouteReport], *, revision: int, now: float) -> Confirmation:
    """Count each instance once, at its newest fresh revision (an instance that moved
    from revision 5 to 6 has both members until the older one is forgotten)."""
    newest: dict[str, int] = {}
    future = 0
    for report in reports:
        if report.seen_at - now > CLOCK_SKEW_SEC:
            future += 1
            continue
        if now - report.seen_at > FRESH_SEC:
            continue
        newest[report.instance] = max(report.revision, newest.get(report.instance, 0))
    return Confirmation(
        data_planes=len(newest),
        confirmed=sum(1 for held in newest.values() if held >= revision),
        future=future,
    )


@runtime_checkable
class RouteReports(Protocol):
    """Implemented by the sample-stream backends (Redis, in-process)."""

    async def report_route(self, service: str, instance: str, revision: int, now: float) -> None:
        """Record that `instance` holds `revision` at `now`; forget reports older than
        FORGET_SEC."""
        ...

    async def route_reports(self, service: str) -> list[RouteReport]:
        """The newest MAX_REPORTS reports of the service, malformed members dropped."""
        ...
