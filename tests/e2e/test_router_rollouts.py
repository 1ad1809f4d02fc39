"""The two stories through NGINX and HAProxy instead of our sidecar.

    `canary serve`, two collectors, a baseline and a canary upstream process, and in
    front of them a real nginx or haproxy started from the config `canary router …
    --print-config` prints, steered by `canary router nginx|haproxy` beside it

The collector and the controller see only samples made from the proxy's own access
log. A healthy canary is promoted, users stay where they were put as the canary
grows, a forced variant is honoured; a degraded canary is detected from the proxy's
log, cut (weight 0 in force in the proxy itself) and rolled back; with etcd gone the
proxy keeps the route it holds.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import (
    HOLD,
    MIN_SAMPLES,
    RULE,
    THRESHOLD_MS,
    Launch,
    Stack,
    canary_window,
    controller_events,
    is_subsequence,
    kinds_of,
    metric,
    metric_values,
    poll,
)
from tests.support.processes import EtcdProcess

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(240)]

FRONTS = ["nginx", "haproxy"]
PROBE_USERS = [f"probe-{i}" for i in range(300)]
PROBE_CONCURRENCY = 16


async def probe(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    """GET / once, and once more if the proxy closed the kept-alive connection first.

    A router's reload makes the proxy's old workers close their idle connections; a
    request sent on one as it closes gets no answer at all. Any HTTP/1.1 client retries
    an idempotent request then (RFC 9112 9.3.1), as the load generator does.
    """
    try:
        return await client.get("/", headers=headers)
    except httpx.RemoteProtocolError:
        return await client.get("/", headers=headers)


async def answers_of(
    stack: Stack, users: list[str], header: str, **headers: str
) -> dict[str, str]:
    """Each user's answer through the proxy, its `header`: asked PROBE_CONCURRENCY at a
    time (one after another, 300 users at the upstreams' ~50 ms took 15 s a step)."""
    seen: dict[str, str] = {}
    limit = asyncio.Semaphore(PROBE_CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.sidecar_port}", timeout=10.0, trust_env=False
    ) as client:

        async def ask(user: str) -> None:
            async with limit:
                response = await probe(client, {"x-user-id": user, **headers})
            assert response.status_code == 200, (user, response.status_code, response.text)
            seen[user] = response.headers[header]

        await asyncio.gather(*(ask(user) for user in users))
    return seen


async def variants_of(stack: Stack, users: list[str], **headers: str) -> dict[str, str]:
    """The variant the proxy sends each user to (its X-Canary-Variant answer)."""
    return await answers_of(stack, users, "x-canary-variant", **headers)


async def upstreams_of(stack: Stack, users: list[str]) -> dict[str, str]:
    """The upstream (its X-Upstream name) that answered each user through the proxy."""
    return await answers_of(stack, users, "x-upstream")


async def canary_version_users(stack: Stack, users: list[str]) -> set[str]:
    return {user for user, name in (await upstreams_of(stack, users)).items() if name == "canary"}


def canary_users(seen: dict[str, str]) -> set[str]:
    return {user for user, variant in seen.items() if variant == "canary"}


async def assert_samples_exact(stack: Stack) -> None:
    sent, counted = await stack.quiesce_samples()
    assert sent["sent"] > 1000, sent
    assert sent["dropped"] == 0, f"the agent dropped samples: {sent}"
    assert counted["ingested"] == sent["sent"], (counted, sent)
    text = (await stack.http.get(f"http://127.0.0.1:{stack.sidecar_admin}/metrics")).text
    values = metric_values(text)
    lines = {
        fate: metric(values, "canary_router_log_lines_total", router=stack.front, fate=fate)
        for fate in ("received", "dropped_kernel", "too_long", "handler_errors")
    }
    assert lines["dropped_kernel"] == 0 and lines["too_long"] == 0, lines
    assert lines["handler_errors"] == 0 and lines["received"] >= sent["sent"], lines
    if stack.front == "haproxy":  # HAProxy's own count of lines it could not send
        key = ("canary_router_log_lines_total",
               frozenset({"router": "haproxy", "fate": "dropped_by_proxy"}.items()))
        assert values.get(key) == 0, sorted(k for k in values if "log_lines" in k[0])
    # every request the load made is a sample (the probes' requests come on top)
    assert stack.load is not None
    assert sent["sent"] >= stack.load.stats.completed, (sent, stack.load.stats)


@pytest.mark.parametrize("front", FRONTS)
async def test_healthy_canary_through_the_proxy_is_promoted_and_users_stay_put(
    launch: Launch, front: str
) -> None:
    stack = await launch(front=front)
    await stack.put_rule(RULE)
    experiment = await stack.create_and_start("healthy", [(10, HOLD), (50, HOLD), (100, HOLD)])
    await stack.wait_in_force(experiment)
    # a user sent to the canary at 10 % is in it at every larger weight
    first = await variants_of(stack, PROBE_USERS)
    assert 0 < len(canary_users(first)) < len(PROBE_USERS) // 2, first
    forced = await variants_of(stack, PROBE_USERS[:20], **{"x-canary-force": "canary"})
    assert set(forced.values()) == {"canary"}, forced
    stack.start_load()
    trail: list[set[str]] = [canary_users(first)]
    checked_steps = {0}

    async def check_stickiness(data: dict[str, Any]) -> None:
        step = data["current_step"]
        if data["state"] == "running" and step not in checked_steps:
            checked_steps.add(step)
            await poll(
                lambda: _holds_weight(stack, data["canary_weight_bp"]),
                timeout=10, what=f"step {step}'s weight in force in {front}",
            )
            # who the canary's upstream answers, not the variant's name: asking every
            # user may outlast the last step, and under the promoted route the canary
            # answers everyone as the stable version (`baseline`)
            trail.append(await canary_version_users(stack, PROBE_USERS))

    final = await stack.run_to_end(experiment, timeout=120, on_poll=check_stickiness)

    assert final["state"] == "promoted", final
    assert len(trail) >= 2, "no step was seen running"
    for before, after in itertools.pairwise(trail):
        assert before <= after, f"users left the canary as it grew: {before - after}"
    events = await stack.events(experiment)
    kinds = kinds_of(events)
    assert is_subsequence(["start", "step_advanced", "step_advanced", "promoted"], kinds), kinds
    assert "tripped" not in kinds, kinds
    promoted = controller_events(events, "promoted")[0]
    assert canary_window(promoted)["count"] >= MIN_SAMPLES
    # promoted: the canary is the stable version, alone in the route the proxy holds
    await poll(lambda: _holds_stable(stack), timeout=10, what="the stable version in force")
    assert set((await variants_of(stack, PROBE_USERS[:50])).values()) == {"baseline"}
    served = set((await upstreams_of(stack, PROBE_USERS[:50])).values())
    assert served == {"canary"}, served
    assert stack.load is not None and stack.load.stats.sidecar_failed == 0, (
        dict(stack.load.stats.sidecar_reasons)
    )
    await assert_samples_exact(stack)


@pytest.mark.parametrize("front", FRONTS)
async def test_degraded_canary_behind_the_proxy_is_cut_from_its_log_and_rolled_back(
    launch: Launch, front: str
) -> None:
    stack = await launch(front=front)
    await stack.put_rule(RULE)
    experiment = await stack.create_and_start(
        "degraded", [(10, HOLD), (25, HOLD), (50, HOLD), (100, HOLD)]
    )
    await stack.wait_in_force(experiment)
    routes = await stack.follow_routes()
    stack.start_load()
    degraded_at: list[float] = []
    cut_in_proxy: list[float] = []

    async def degrade_then_watch_the_proxy(data: dict[str, Any]) -> None:
        if not degraded_at and data["state"] == "running" and data["current_step"] >= 1:
            stack.canary.set_factor(5.0)
            degraded_at.append(time.time())
        if degraded_at and not cut_in_proxy and await _holds_weight(stack, 0):
            cut_in_proxy.append(time.time())

    final = await stack.run_to_end(experiment, timeout=150, on_poll=degrade_then_watch_the_proxy)

    assert degraded_at, "the canary never reached its second step"
    assert final["state"] == "rolled_back", final
    events = await stack.events(experiment)
    trip = controller_events(events, "tripped")[0]
    assert canary_window(trip)["p95_ms"] > THRESHOLD_MS, canary_window(trip)
    assert canary_window(trip)["count"] >= MIN_SAMPLES
    cut = routes.first_cut(experiment, degraded_at[0])
    assert cut is not None, "etcd never held a cut route"
    assert cut_in_proxy, f"{front} never held weight 0 for the canary"
    # the last route, rolled back, is what the proxy holds: no user reaches the canary
    await poll(lambda: _holds_weight(stack, 0), timeout=10, what="rolled back in force")
    assert set((await variants_of(stack, PROBE_USERS[:100])).values()) == {"baseline"}
    await assert_samples_exact(stack)


async def test_with_etcd_gone_the_proxy_keeps_the_route_it_holds(
    own_etcd: EtcdProcess, launch: Launch
) -> None:
    stack = await launch(front="nginx", etcd=own_etcd.endpoint)
    experiment = await stack.create_and_start("steady", [(30, 600)])
    await stack.wait_in_force(experiment)
    before = await variants_of(stack, PROBE_USERS[:100])
    own_etcd.stop()
    # the agent reads back what nginx holds every second: three read-backs with etcd
    # gone, and nothing may have moved
    verified = (await stack.router_status())["verified"]
    await poll(
        lambda: _verified_since(stack, verified + 3), timeout=30,
        what="three read-backs of what nginx holds with etcd gone",
    )
    during = await variants_of(stack, PROBE_USERS[:100])
    assert during == before
    status = await stack.router_status()
    assert status["in_step"] is True and status["in_force"]["experiment"] == str(experiment)
    assert status["last_error"] is None, status
    own_etcd.start()
    verified = status["verified"]
    await poll(lambda: _verified_since(stack, verified + 2), timeout=30, what="etcd back")
    assert await variants_of(stack, PROBE_USERS[:100]) == before


async def _holds_weight(stack: Stack, canary_bp: int) -> bool:
    """The route the proxy itself holds gives the canary `canary_bp` (read back from
    the proxy through the agent, compared with etcd's route of that revision)."""
    status = await stack.router_status()
    in_force = status.get("in_force") or {}
    route = await stack.route()
    return (
        route is not None
        and bool(status["in_step"])
        and in_force.get("revision") == route.revision
        and route.weight_of("canary") == canary_bp
    )


async def _holds_stable(stack: Stack) -> bool:
    """The proxy holds the promoted route: the canary's upstream alone, as `baseline`."""
    status = await stack.router_status()
    in_force = status.get("in_force") or {}
    route = await stack.route()
    return (
        route is not None
        and bool(status["in_step"])
        and in_force.get("revision") == route.revision
        and [(v.name, v.upstream, v.weight) for v in route.variants]
        == [("baseline", stack.canary.url, 10_000)]
    )


async def _verified_since(stack: Stack, count: int) -> bool:
    return int((await stack.router_status())["verified"]) >= count
