"""HaproxyRouter against a real HAProxy 2.6: assignment, ramp, forcing, headers, no
route, changes in force without reload and without half routes, a lost socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from controlplane.kernel.routes import Route, RouteState, RouteVariant, Sticky, two_way_variants
from routers.haproxy.router import HaproxyRouter
from routers.haproxy.split import variant_of
from routers.samples.token import LogToken
from routers.seam import InForce, RouterError
from tests.support.haproxy_proc import HaproxyProcess, VariantUpstream, fetch_all

Start = Callable[..., HaproxyProcess]
Upstreams = dict[str, VariantUpstream]
TOKEN = LogToken.generate()


def two_way(ups: Upstreams, canary_bp: int, *, experiment: int | str = 42, revision: int = 1,
            salt: str = "salt-a") -> Route:  # fmt: skip
    return Route(
        experiment=experiment,
        revision=revision,
        salt=salt,
        variants=two_way_variants(ups["baseline"].url, ups["canary"].url, canary_bp),
        state=RouteState.RUNNING,
    )


async def no_sleep(_: float) -> None:
    return None


async def test_assignment_matches_split_and_the_ramp_is_monotonic(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    router = HaproxyRouter(proc.cfg, log_token=TOKEN)
    units = [f"user-{i}" for i in range(2000)]
    in_canary: list[set[str]] = []
    for revision, weight in enumerate((500, 3000, 7000), start=1):
        route = two_way(upstreams, weight, revision=revision)
        await router.apply(route)
        replies = await fetch_all(proc.port, [{"x-user-id": u} for u in units])
        predicted = [variant_of(route, u) for u in units]
        served = [r.served_by for r in replies]
        assert served == predicted
        assert [r.headers["x-canary-variant"] for r in replies] == predicted
        canary = {u for u, v in zip(units, served, strict=True) if v == "canary"}
        # the split is the weight's, give or take sampling (2000 units)
        assert abs(len(canary) / len(units) - weight / 10_000) < 0.05
        in_canary.append(canary)
    assert in_canary[0] <= in_canary[1] <= in_canary[2]
    assert in_canary[0] < in_canary[2]


async def test_the_cookie_is_the_unit_when_the_header_is_absent(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy(sticky_cookie="sid")
    route = Route(
        experiment=5,
        revision=1,
        salt="c00k",
        sticky=Sticky(header="x-user-id", cookie="sid"),
        variants=two_way_variants(upstreams["baseline"].url, upstreams["canary"].url, 5000),
        state=RouteState.RUNNING,
    )
    await HaproxyRouter(proc.cfg, log_token=TOKEN).apply(route)
    units = [f"c{i}" for i in range(200)]
    replies = await fetch_all(proc.port, [{"cookie": f"a=1; sid={u}"} for u in units])
    assert [r.served_by for r in replies] == [variant_of(route, u) for u in units]
    # the header wins over the cookie
    both = await fetch_all(proc.port, [{"x-user-id": u, "cookie": "sid=zz"} for u in units])
    assert [r.served_by for r in both] == [variant_of(route, u) for u in units]


async def test_forced_variant_only_when_enabled_and_in_the_route(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    forcing = start_haproxy(allow_force=True)
    plain = start_haproxy()
    route = two_way(upstreams, 0)  # every unit in the baseline
    for proc in (forcing, plain):
        await HaproxyRouter(proc.cfg, log_token=TOKEN).apply(route)
    asks = [{"x-user-id": "u1", "x-canary-force": name} for name in ("canary", "green", "nope")]
    forced = await fetch_all(forcing.port, asks)
    # canary has weight 0 but is in the route; green is declared nowhere in it
    assert [r.served_by for r in forced] == ["canary", "baseline", "baseline"]
    assert [r.served_by for r in await fetch_all(plain.port, asks)] == ["baseline"] * 3


async def test_variant_headers_towards_the_upstream_and_on_the_response(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    route = two_way(upstreams, 10_000, experiment="exp-7")
    await HaproxyRouter(proc.cfg, log_token=TOKEN).apply(route)
    spoofed = {"x-user-id": "u", "x-canary-variant": "baseline", "x-canary-experiment": "x"}
    (reply,) = await fetch_all(proc.port, [spoofed])
    assert reply.served_by == "canary"
    assert (reply.headers["x-canary-variant"], reply.headers["x-canary-experiment"]) == (
        "canary",
        "exp-7",
    )
    seen = reply.body.decode()
    assert '"seen_variant": "canary"' in seen and '"seen_experiment": "exp-7"' in seen


async def test_no_route_is_503(start_haproxy: Start, upstreams: Upstreams) -> None:
    proc = start_haproxy()
    router = HaproxyRouter(proc.cfg, log_token=TOKEN)
    assert await router.in_force() == InForce(None, None)
    (reply,) = await fetch_all(proc.port, [{"x-user-id": "u"}])
    assert (reply.status, reply.served_by) == (503, None)
    await router.apply(two_way(upstreams, 100, revision=9))
    assert await router.in_force() == InForce("42", 9)
    await router.apply(None)
    assert await router.in_force() == InForce(None, None)
    (reply,) = await fetch_all(proc.port, [{"x-user-id": "u"}])
    assert (reply.status, reply.served_by) == (503, None)
    assert upstreams["baseline"].seen + upstreams["canary"].seen == 0


async def test_changes_are_in_force_without_reload_and_never_half_applied(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    pid = proc.pid
    router = HaproxyRouter(proc.cfg, log_token=TOKEN)
    # two routes that differ in experiment, salt and weights: a request that mixed
    # them would land where neither route sends its unit
    routes = {
        "1": two_way(upstreams, 2000, experiment=1, salt="first"),
        "2": two_way(upstreams, 8000, experiment=2, salt="second", revision=2),
    }
    await router.apply(routes["1"])
    units = [f"u{i}" for i in range(300)]
    done = asyncio.Event()
    replies = []

    async def load() -> None:
        while not done.is_set():
            replies.extend(await fetch_all(proc.port, [{"x-user-id": u} for u in units]))

    async def flip() -> None:
        for i in range(30):
            route = routes["2" if i % 2 == 0 else "1"]
            await router.apply(route)
            assert await router.in_force() == InForce(str(route.experiment), route.revision)
        done.set()

    await asyncio.gather(load(), flip())
    assert proc.pid == pid and proc.proc is not None and proc.proc.poll() is None
    assert len(replies) >= len(units)
    seen = set()
    for unit, reply in zip(units * (len(replies) // len(units)), replies, strict=True):
        experiment = reply.headers["x-canary-experiment"]
        seen.add(experiment)
        expected = variant_of(routes[experiment], unit)
        assert (reply.served_by, reply.headers["x-canary-variant"]) == (expected, expected)
    assert seen == {"1", "2"}


async def test_refused_routes_leave_the_route_in_force(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    router = HaproxyRouter(proc.cfg, log_token=TOKEN)
    good = two_way(upstreams, 1000, revision=3)
    await router.apply(good)
    base = upstreams["baseline"].url
    bad_routes = {
        "green": good.model_copy(
            update={
                "variants": (
                    RouteVariant(name="baseline", upstream=base, weight=9000),
                    RouteVariant(name="green", upstream=upstreams["green"].url, weight=1000),
                )
            }
        ),
        "h2c://": good.model_copy(
            update={"variants": two_way_variants(base, "h2c://127.0.0.1:9", 1000)}
        ),
        "https://": good.model_copy(
            update={"variants": two_way_variants(base, "https://127.0.0.1:9", 1000)}
        ),
        "sticky cookie": Route.model_validate(
            {**good.model_dump(), "sticky": {"header": None, "cookie": "other"}}
        ),
    }
    for needle, route in bad_routes.items():
        with pytest.raises(RouterError, match=needle.split()[0]) as caught:
            await router.apply(route)
        assert "\n" not in str(caught.value)
    assert await router.in_force() == InForce("42", 3)


async def test_a_lost_socket_raises_after_retries_and_a_restart_recovers(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)

    router = HaproxyRouter(
        proc.cfg, log_token=TOKEN, attempts=3, sleep=sleep, draw=lambda: 0.0
    )
    await router.apply(two_way(upstreams, 1000))
    proc.stop()
    with pytest.raises(RouterError, match="after 3 attempts"):
        await router.apply(two_way(upstreams, 2000, revision=2))
    assert waits == [0.1, 0.2]  # the project's backoff, no jitter drawn
    with pytest.raises(RouterError):
        await router.in_force()
    proc.start()  # a fresh HAProxy: its map file is empty again
    assert await router.in_force() == InForce(None, None)
    route = two_way(upstreams, 2000, revision=2)
    await router.apply(route)
    assert await router.in_force() == InForce("42", 2)
    units = [f"r{i}" for i in range(100)]
    replies = await fetch_all(proc.port, [{"x-user-id": u} for u in units])
    assert [r.served_by for r in replies] == [variant_of(route, u) for u in units]


async def test_a_variant_moved_to_another_upstream_is_served_there(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    router = HaproxyRouter(proc.cfg, log_token=TOKEN)
    base = upstreams["baseline"].url
    await router.apply(
        two_way(upstreams, 10_000).model_copy(
            update={"variants": two_way_variants(base, upstreams["canary"].url, 10_000)}
        )
    )
    first = await fetch_all(proc.port, [{"x-user-id": "u"}] * 20, concurrency=4)
    assert {r.served_by for r in first} == {"canary"}
    # the canary variant's server now points at another upstream (the one that says
    # "green"): pooled connections to the old address must not be reused
    moved = two_way(upstreams, 10_000, revision=2).model_copy(
        update={"variants": two_way_variants(base, upstreams["green"].url, 10_000)}
    )
    await router.apply(moved)
    then = await fetch_all(proc.port, [{"x-user-id": "u"}] * 20, concurrency=4)
    assert {(r.served_by, r.headers["x-canary-variant"]) for r in then} == {("green", "canary")}


async def test_an_upstream_name_that_does_not_resolve_is_refused(
    start_haproxy: Start, upstreams: Upstreams
) -> None:
    proc = start_haproxy()
    router = HaproxyRouter(proc.cfg, log_token=TOKEN)
    unknown = two_way(upstreams, 10).model_copy(
        update={
            "variants": two_way_variants(
                upstreams["baseline"].url, "http://no-such-host.invalid:80", 10
            )
        }
    )
    with pytest.raises(RouterError, match="variant canary's upstream host does not resolve"):
        await router.apply(unknown)
    assert await router.in_force() == InForce(None, None)
