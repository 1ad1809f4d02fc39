"""`GET /overload`: the guard's state as JSON on the admin endpoint, behind the admin
token like /metrics; a supervisor's merge of its workers' views; level changes
counted, logged at most once per interval, and on /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from controlplane.kernel.keys import COLLECTOR_GROUP, EtcdKeys
from controlplane.kernel.kv_memory import MemoryKV
from controlplane.kernel.streams_memory import MemoryStreams
from sidecar.choice import Upstream
from sidecar.main import Sidecar
from sidecar.overload.gate import LevelCounts, QueuePolicy, ShedCounts, UpstreamGate
from sidecar.overload.levels import Level
from sidecar.overload.limit import GradientLimit, LimitSettings
from sidecar.overload.view import MAX_VIEW_BYTES, OverloadView, merge_views, parse_view
from sidecar.proxy.limits import RateLimitedLog
from tests.sidecar import upstreams

SERVICE = "shop"
LOCAL = ("127.0.0.1", 0)
TOKEN = "admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def gate_view(upstream: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "upstream": upstream, "level": "normal", "limit": 4, "estimate": 4.4,
        "phase": "adapting", "min_rtt_ms": 10.0, "sample_rtt_ms": 11.0, "in_flight": 1,
        "queued": 0, "admitted": 10, "queued_total": 2, "level_changes": 3,
    }  # fmt: skip
    return base | fields


def view(*gates: dict[str, Any], enabled: bool = True, shed: int = 0) -> OverloadView:
    return OverloadView.model_validate(
        {
            "enabled": enabled,
            "config": {"max_limit": 50} if enabled else None,
            "upstreams": list(gates),
            "shed": [
                {"variant": "baseline", "reason": "queue_full", "priority": "normal", "count": shed}
            ]
            if shed
            else [],
        }
    )


def test_merge_sums_the_workers_and_keeps_the_highest_level() -> None:
    a = view(gate_view("http://a:1", level="heavy", limit=5, in_flight=5, queued=3), shed=7)
    b = view(gate_view("http://a:1", level="light", limit=4), gate_view("http://b:1"), shed=2)
    merged = merge_views([(0, a), (1, b), (2, "no answer within 2 s")])
    assert merged["enabled"] is True
    assert merged["config"] == {"max_limit": 50}
    first, second = merged["upstreams"]
    assert first == {
        "upstream": "http://a:1", "level": "heavy", "limit": 9, "estimate": 8.8,
        "in_flight": 6, "queued": 3, "admitted": 20, "queued_total": 4, "level_changes": 6,
        "workers": 2, "pressure_level": "normal", "rate_level": "normal", "rate_rps": None,
    }  # fmt: skip
    assert (second["upstream"], second["workers"], second["limit"]) == ("http://b:1", 1, 4)
    assert merged["shed"] == [
        {"variant": "baseline", "reason": "queue_full", "priority": "normal", "count": 9}
    ]
    assert [w["worker"] for w in merged["workers"]] == [0, 1, 2]
    assert merged["workers"][1]["upstreams"][1]["upstream"] == "http://b:1"
    assert merged["workers"][2] == {"worker": 2, "error": "no answer within 2 s"}


@pytest.mark.parametrize(
    ("views", "enabled"),
    [
        ([view(), view(enabled=False)], False),  # one worker has not followed the key yet
        ([view(enabled=False)], False),
        ([view(), view()], True),
    ],
)
def test_enabled_only_when_every_answering_worker_is(
    views: list[OverloadView], enabled: bool
) -> None:
    assert merge_views(list(enumerate(views)))["enabled"] is enabled


def test_no_worker_answering_is_not_enabled() -> None:
    merged = merge_views([(0, "not running"), (1, "status 500")])
    assert (merged["enabled"], merged["config"], merged["upstreams"]) == (False, None, [])


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        json.dumps({"enabled": True, "config": None, "upstreams": [], "shed": [], "x": 1}),
        json.dumps({"enabled": 1, "config": None, "upstreams": [], "shed": []}),
        json.dumps(
            {"enabled": True, "config": None, "upstreams": [gate_view("u", limit=-1)], "shed": []}
        ),
        json.dumps(
            {"enabled": True, "config": None, "upstreams": [gate_view("u", level="x")], "shed": []}
        ),
        json.dumps(
            {"enabled": True, "config": None, "upstreams": [gate_view("u", in_flight="3")]}
            | {"shed": []}
        ),
        b" " * (MAX_VIEW_BYTES + 1),
    ],
)
def test_a_worker_answer_that_is_not_a_view_is_refused(body: bytes | str) -> None:
    raw = body.encode() if isinstance(body, str) else body
    with pytest.raises(ValueError, match="overload view"):
        parse_view(raw)


class _Waiter:
    def __init__(self) -> None:
        self.admitted = 0

    def admit(self, gate: UpstreamGate, degrade: bool) -> None:
        self.admitted += 1

    def shed(self, gate: UpstreamGate, reason: str) -> None:
        pass


async def test_level_changes_are_counted_and_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    now = [100.0]
    settings = LimitSettings(min_limit=2, max_limit=2, min_rtt_concurrency=2)
    counts = LevelCounts()
    logger = logging.getLogger("tests.overload.levels")
    gate = UpstreamGate(
        "http://u:1",
        GradientLimit(settings, now[0]),
        QueuePolicy(size=10, timeout=30.0),
        monotonic=lambda: now[0],
        call_later=lambda delay, callback: loop.call_later(3600, callback),  # never due here
        shed_counts=ShedCounts(),
        level_counts=counts,
        level_log=RateLimitedLog(logger, lambda: now[0], 10.0),
    )
    waiter = _Waiter()
    with caplog.at_level(logging.WARNING, logger="tests.overload.levels"):
        gate.enter(waiter, "baseline", False)  # 0 of 2: normal, no change
        gate.enter(waiter, "baseline", False)  # 1 of 2: normal
        gate.enter(waiter, "baseline", False)  # 2 of 2: light (queued)
        assert gate.level is Level.LIGHT
        gate.release(now[0])  # the queued one goes on
        gate.release(now[0])
        gate.release(now[0])
        gate.enter(waiter, "baseline", False)  # 0 of 2 on entry: normal again
        now[0] += 10.0
        gate.enter(waiter, "baseline", False)  # 1 of 2: still normal
        gate.enter(waiter, "baseline", False)  # 2 of 2: light, logged again
    gate.release_all()
    assert counts.counts == {("http://u:1", "light"): 2, ("http://u:1", "normal"): 1}
    assert gate.level_changes == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("overload level of http://u:1: light, was normal (limit 2")
    assert lines[1].endswith("(1 more like it since the last report)")


@pytest.fixture
async def upstream() -> AsyncIterator[upstreams.Upstream]:
    server = upstreams.Upstream("baseline")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_one_sidecar_answers_its_guard_state_behind_the_admin_token(
    upstream: upstreams.Upstream,
) -> None:
    kv, stream = MemoryKV(), MemoryStreams()
    await stream.ensure_group(SERVICE, COLLECTOR_GROUP)
    sidecar = Sidecar(
        service=SERVICE, kv=kv, stream=stream, admin_token=TOKEN,
        default_upstream=Upstream.parse(upstream.url),
    )  # fmt: skip
    await sidecar.start(LOCAL, LOCAL)
    admin = f"http://127.0.0.1:{sidecar.admin.port}"
    proxy = f"http://127.0.0.1:{sidecar.proxy.port}"
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            refused = await client.get(f"{admin}/overload")
            assert refused.status_code == 401
            off = await client.get(f"{admin}/overload", headers=AUTH)
            assert off.status_code == 200
            assert off.headers["content-type"] == "application/json"
            assert off.json() == {
                    "enabled": False, "config": None, "upstreams": [], "shed": [], "external": None
                }  # fmt: skip

            config = {"min_limit": 2, "max_limit": 2, "min_rtt_concurrency": 2}
            await kv.put(EtcdKeys().overload(SERVICE), json.dumps(config).encode())
            async with asyncio.timeout(5):
                while sidecar.proxy.overload is None:
                    await asyncio.sleep(0.01)
            assert [(await client.get(f"{proxy}/echo")).status_code for _ in range(3)] == [200] * 3

            on = parse_view((await client.get(f"{admin}/overload", headers=AUTH)).content)
            assert on.enabled
            assert on.config is not None and on.config["max_limit"] == 2
            (gate,) = on.upstreams
            assert (gate.upstream, gate.limit, gate.admitted, gate.in_flight) == (
                upstream.url, 2, 3, 0)  # fmt: skip
            assert on.shed == []
            metrics = (await client.get(f"{admin}/metrics", headers=AUTH)).text
            assert "canary_sidecar_overload_level_changes_total" in metrics
    finally:
        await sidecar.stop()
        await kv.close()


def signal_view(level: str, value: float, **gate: Any) -> dict[str, Any]:
    external = {
        "source": "file:/run/q", "value": value, "age_s": 0.2, "fresh": True, "level": level,
        "reads": 3, "failing": False, "last_error": None, "failures": {"timeout": 1},
    }  # fmt: skip
    return {"enabled": True, "config": {}, "upstreams": [gate_view("http://a:1", **gate)],
            "shed": [], "external": external}  # fmt: skip


def test_merge_sums_the_rates_and_shows_the_signal_at_its_highest_level() -> None:
    a = signal_view("light", 60.0, rate_rps=120.5, rate_level="light")
    b = signal_view("heavy", 250.0, rate_rps=80.0, pressure_level="heavy")
    merged = merge_views(
        [(0, parse_view(json.dumps(a).encode())), (1, parse_view(json.dumps(b).encode()))]
    )
    gate = merged["upstreams"][0]
    assert (gate["rate_rps"], gate["rate_level"], gate["pressure_level"]) == (
        200.5,
        "light",
        "heavy",
    )
    assert merged["external"]["level"] == "heavy" and merged["external"]["value"] == 250.0
    b["external"]["failures"] = {"surprise": 1}  # a reason no worker counts
    with pytest.raises(ValueError, match="not an overload view"):
        parse_view(json.dumps(b).encode())
