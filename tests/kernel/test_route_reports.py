"""What the data planes' route reports say, as pure functions (decision 0053)."""

from __future__ import annotations

import math

import pytest

from controlplane.kernel.route_reports import (
    CLOCK_SKEW_SEC,
    FRESH_SEC,
    RouteReport,
    confirm,
    parse_member,
    report_member,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("member", "score", "expected"), [
    ("sc-1@5", NOW, RouteReport("sc-1", 5, NOW)),
    ("host-12-a1b2@0", NOW, RouteReport("host-12-a1b2", 0, NOW)),
    ("a@b@7", NOW, None),  # '@' is not an instance character
    ("sc-1@", NOW, None),
    ("sc-1@-3", NOW, None),
    ("sc-1@1e3", NOW, None),
    ("sc-1@99999999999999999999", NOW, None),  # past the bound
    ("@5", NOW, None),
    ("sc 1@5", NOW, None),
    ("sc-1@5", math.nan, None),
    ("sc-1@5", math.inf, None),
    ("sc-1@5", -1.0, None),
    ("x" * 161 + "@5", NOW, None),
])
def test_a_member_parses_only_as_a_reporter_writes_it(
    member: str, score: float, expected: RouteReport | None
) -> None:
    assert parse_member(member, score) == expected


def test_a_member_written_is_a_member_read() -> None:
    assert parse_member(report_member("sc-1", 42), NOW) == RouteReport("sc-1", 42, NOW)
    with pytest.raises(ValueError):
        report_member("sc 1", 1)
    with pytest.raises(ValueError):
        report_member("sc-1", -1)


@pytest.mark.parametrize(("reports", "revision", "planes", "confirmed", "words"), [
    ([], 3, 0, 0, "published, not yet confirmed: no data plane reported"),
    ([RouteReport("a", 2, NOW)], 3, 1, 0, "published, not yet confirmed: none of 1"),
    ([RouteReport("a", 3, NOW)], 3, 1, 1, "confirmed by 1 of 1 data plane(s)"),
    ([RouteReport("a", 4, NOW)], 3, 1, 1, "confirmed by 1 of 1"),  # a later revision
    # one instance counts once, at its newest fresh revision
    ([RouteReport("a", 3, NOW), RouteReport("a", 2, NOW - 3)], 3, 1, 1, "confirmed by 1 of 1"),
    ([RouteReport("a", 3, NOW), RouteReport("b", 2, NOW)], 3, 2, 1, "confirmed by 1 of 2"),
    # a report older than FRESH_SEC is a data plane gone
    ([RouteReport("a", 3, NOW - FRESH_SEC - 1)], 3, 0, 0, "no data plane reported"),
])
def test_confirmation_counts_fresh_data_planes_at_the_revision_or_later(
    reports: list[RouteReport], revision: int, planes: int, confirmed: int, words: str
) -> None:
    found = confirm(reports, revision=revision, now=NOW)
    assert (found.data_planes, found.confirmed) == (planes, confirmed)
    assert words in found.sentence


def test_a_report_dated_ahead_of_the_clock_skew_is_not_counted_and_is_said() -> None:
    ahead = RouteReport("sc-ahead", 9, NOW + CLOCK_SKEW_SEC + 1)
    slightly = RouteReport("sc-1", 9, NOW + CLOCK_SKEW_SEC - 1)
    got = confirm([ahead, slightly], revision=9, now=NOW)
    assert (got.data_planes, got.confirmed, got.future) == (1, 1, 1)
    assert got.sentence.startswith("confirmed by 1 of 1 data plane(s); 1 report(s) dated")
    # only the forged one: nothing confirmed, however long its date stays ahead
    alone = confirm([ahead], revision=9, now=NOW + 1000)
    assert (alone.data_planes, alone.confirmed) == (0, 0)
