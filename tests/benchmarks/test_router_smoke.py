"""`canary bench router`'s pieces, small: the loss arithmetic, the rate limiter, and a
steered HAProxy with its agent on the real services, where a route change is timed,
a request counted by HAProxy and its sample counted by the agent. Figures are not
checked: on a shared machine they belong to the recorded full run."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.benchmarks import router
from controlplane.benchmarks.sidecar import (
    _NGINX_UPSTREAM,
    HOST,
    _free_port,
    _nginx_args,
    _nginx_conf,
    _process,
)
from controlplane.cli.bench import BENCHMARKS

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
WRK = shutil.which("wrk") or "/usr/bin/wrk"


def test_the_router_benchmark_is_registered() -> None:
    assert BENCHMARKS["router"] == "controlplane.benchmarks.router:run"


def test_loss_is_requests_less_counted_and_each_part_is_placed() -> None:
    before = dict.fromkeys(
        ("requests", "received", "dropped_kernel", "refused", "refused_unattributed", "sent",
         "dropped", "unattributed", "collector_ingested", "collector_late"), 0.0,
    )  # fmt: skip
    after = {**before, "requests": 1000, "received": 990, "dropped_kernel": 10, "refused": 1,
             "refused_unattributed": 1, "sent": 989, "collector_ingested": 985,
             "collector_late": 2}  # fmt: skip
    figures = router.sample_accounting(before, after)
    assert figures["counted"] == 987
    assert figures["lost"] == 13
    assert figures["refused_by_reason"] == {"unattributed": 1}
    assert figures["lost_explained"] == {
        "never_received": 10, "of_which_kernel": 10, "received_not_sent": 1,
        "sent_not_counted": 2,
    }  # fmt: skip


def test_ratios_are_medians_of_paired_rounds() -> None:
    assert router.median_ratio([9.0, 8.0, None], [10.0, 10.0, 10.0]) == {
        "median": 0.85, "rounds": [0.9, 0.8, None],
    }  # fmt: skip
    assert router.median_ratio([None], [1.0])["median"] is None


def test_the_rate_limiter_has_the_asked_ceiling() -> None:
    # 20,000/s with a 10 ms wait per request: 200 connections, 5 % more for the answer
    assert router.rate_connections(20_000, 10) == 210
    assert "return 10" in router.delay_script(10)
    p = router.percentiles_ms([0.001, 0.002, 0.003])
    assert p["changes"] == 3 and p["p50_ms"] == 2.0


def test_wrk_reports_are_read_in_any_unit() -> None:
    minute = "  427933 requests in 1.00m, 83.91MB read\nRequests/sec:   7119.72\n"
    assert router.wrk_counts(minute) == (427933, 60.0, 0)
    short = "  4227 requests in 1.00s, 1MB read\n  Non-2xx or 3xx responses: 3\n"
    assert router.wrk_counts(short) == (4227, 1.0, 3)


def test_the_stub_status_count_is_its_requests_figure() -> None:
    page = "Active connections: 1 \nserver accepts handled requests\n 10 10 25 \n"
    assert router.stub_count(page + "Reading: 0 Writing: 1 Waiting: 0 \n") == 25


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[int, int]]:
    port = _free_port()
    conf = _nginx_conf(tmp_path, "upstream", _NGINX_UPSTREAM.format(host=HOST, port=port))
    with _process(_nginx_args(NGINX, tmp_path, conf), cpu=None, port=port,
                  log=tmp_path / "upstream.log") as proc:  # fmt: skip
        yield port, proc.pid


@pytest.mark.real
def test_a_fixed_rate_run_counts_its_requests(tmp_path: Path, upstream: tuple[int, int]) -> None:
    load = router._wrk_rate(WRK, upstream[0], rate=100, seconds=1, cpu=None,
                            script=tmp_path / "delay.lua", delay_ms=50)
    assert load["wrk_requests"] > 0 and load["non_2xx"] == 0
    assert load["wrk"].startswith("wrk -t1 -c6 ")


@pytest.mark.real
@pytest.mark.e2e
def test_a_steered_haproxy_takes_routes_and_logs_requests(
    tmp_path: Path, upstream: tuple[int, int], etcd_endpoint: str, etcd_prefix: str,
    redis_url: str, redis_namespace: str,
) -> None:
    canary = str(Path(sys.executable).with_name("canary"))
    svc = router.Services(etcd_endpoint, redis_url, redis_namespace, etcd_prefix, canary)
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: asyncio.run(router._clean(svc)))
        front = router._start_haproxy(stack, tmp_path, svc, HAPROXY, upstream[0], None)
        key = svc.key(front.service)
        times = asyncio.run(router._changes(front, svc.etcd, key, changes=2, spacing=0.0))
        assert len(times) == 2 and all(t > 0 for t in times)
        assert asyncio.run(front.in_force()) == front.revision

        served = front.requests()
        before = router._metrics(front.admin, router.AGENT_METRICS)["received"]
        assert router._get(front.port, "/")[0] == 200
        assert front.requests() == served + 1

        async def logged() -> None:
            while router._metrics(front.admin, router.AGENT_METRICS)["received"] <= before:
                await asyncio.sleep(0.05)

        asyncio.run(asyncio.wait_for(logged(), timeout=10))
