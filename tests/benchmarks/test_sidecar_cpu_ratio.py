"""The CPU-per-request ratio `canary bench sidecar` reports beside requests/s."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.benchmarks.sidecar import cpu_vs_reference, requests_served


def rounds(*cpu: float | None) -> list[dict[str, Any]]:
    return [{"cpu_us_per_request": value, "max_rps": 1000} for value in cpu]


@pytest.mark.parametrize(
    ("ours", "nginx", "median", "per_round", "best"),
    [
        # round by round: 10/20, 12/20, 10/25 -> median 0.5
        (rounds(20, 20, 25), rounds(10, 12, 10), 0.5, [0.5, 0.6, 0.4], 0.5),
        # a burst of load in one round moves that round, not the median
        (rounds(20, 60, 20), rounds(10, 10, 10), 0.5, [0.5, 0.167, 0.5], 0.5),
        # a round without a figure on either side is left out
        (rounds(20, None, 40), rounds(10, 10, None), 0.5, [0.5], 0.5),
    ],
)
def test_cpu_ratio_is_the_median_of_paired_rounds(
    ours: list[dict[str, Any]],
    nginx: list[dict[str, Any]],
    median: float,
    per_round: list[float],
    best: float,
) -> None:
    ratio = cpu_vs_reference(ours, nginx)
    assert ratio == {
        "cpu_vs_nginx": median,
        "cpu_vs_nginx_rounds": per_round,
        "cpu_vs_nginx_best": best,
    }


def test_no_cpu_figures_give_no_ratio() -> None:
    assert cpu_vs_reference(rounds(None), rounds(10))["cpu_vs_nginx"] is None
    assert cpu_vs_reference([], [])["cpu_vs_nginx_rounds"] == []


def test_requests_are_counted_by_wrk_when_it_says() -> None:
    assert requests_served({"max_rps": 1000, "wrk_requests": 3123}, 3.0) == 3123
    assert requests_served({"max_rps": 1000}, 3.0) == 3000
