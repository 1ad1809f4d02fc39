"""The traffic-router contract (architecture §9a), on every implementation: our
sidecar's route table, NGINX and HAProxy (real processes).

- `apply(route)` puts it in force: `in_force()` answers its experiment and revision,
  read back from the data plane;
- a route the data plane cannot carry raises RouterError and the route in force
  stays in force;
- `apply(None)` leaves no route in force.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from controlplane.routing.build import RouteSource, build_route
from routers.haproxy.router import HaproxyRouter
from routers.samples.token import LogToken
from routers.seam import InForce, RouterError, TrafficRouter
from routers.sidecar_table import TableRouter
from sidecar.routing import RouteTable
from tests.routers.nginx.rig import nginx_rig
from tests.support.haproxy_proc import HaproxyProcess, variant_upstreams

TOKEN = LogToken.generate()


@dataclass
class Plane:
    router: TrafficRouter
    baseline: str
    canary: str
    # an upstream this data plane cannot proxy to (None: it can carry any valid route)
    unservable: str | None


@contextlib.asynccontextmanager
async def plane(kind: str, tmp: Path) -> AsyncIterator[Plane]:
    if kind == "nginx":
        async with nginx_rig(tmp) as rig:
            served = rig.upstreams
            yield Plane(
                rig.router, served["baseline"].url, served["canary"].url, "h2c://127.0.0.1:1"
            )
        return
    async with variant_upstreams("baseline", "canary") as ups:
        if kind == "sidecar":
            yield Plane(TableRouter(RouteTable()), ups["baseline"].url, ups["canary"].url, None)
            return
        proc = HaproxyProcess()
        proc.start()
        try:
            yield Plane(
                HaproxyRouter(proc.cfg, log_token=TOKEN), ups["baseline"].url,
                ups["canary"].url, "https://127.0.0.1:1",
            )  # fmt: skip
        finally:
            proc.close()


def make_route(p: Plane, revision: int, canary_bp: int, *, canary: str | None = None) -> Route:
    return Route(
        experiment=f"exp-{revision}", revision=revision, salt="s", sticky=Sticky(),
        variants=two_way_variants(p.baseline, canary or p.canary, canary_bp),
        state=RouteState.RUNNING,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["sidecar", "nginx", "haproxy"])
async def test_a_router_keeps_the_contract(kind: str, tmp_path: Path) -> None:
    async with plane(kind, tmp_path) as p:
        router = p.router
        assert router.kind == kind and router.min_interval >= 0
        first = make_route(p, 1, 1000)
        await router.apply(first)
        assert await router.in_force() == InForce("exp-1", 1)
        second = make_route(p, 2, 5000)
        await router.apply(second)
        assert await router.in_force() == InForce("exp-2", 2)
        if p.unservable is not None:
            with pytest.raises(RouterError):
                await router.apply(make_route(p, 3, 5000, canary=p.unservable))
            assert await router.in_force() == InForce("exp-2", 2)
        await router.apply(None)
        assert await router.in_force() == InForce(None, None)
        await router.apply(second)
        assert await router.in_force() == InForce("exp-2", 2)
        await router.close()


@pytest.mark.parametrize("kind", ["sidecar", "nginx", "haproxy"])
async def test_a_router_carries_the_stable_version_alone(kind: str, tmp_path: Path) -> None:
    """A finished experiment's route (decision 0051): one variant, `baseline`, at the
    full weight, on the promoted canary's upstream; and a running route after it."""
    async with plane(kind, tmp_path) as p:
        router = p.router
        await router.apply(make_route(p, 1, 5000))
        source = RouteSource(experiment="exp-2", service="shop", salt="s", sticky=Sticky(),
                             baseline_upstream=p.baseline, canary_upstream=p.canary)
        promoted = build_route(source, canary_bp=10_000, state=RouteState.PROMOTED, revision=2)
        assert [v.name for v in promoted.variants] == ["baseline"]
        await router.apply(promoted)
        assert await router.in_force() == InForce("exp-2", 2)
        await router.apply(make_route(p, 3, 100))
        assert await router.in_force() == InForce("exp-3", 3)
        await router.close()


async def test_haproxy_says_how_many_log_lines_it_could_not_send() -> None:
    proc = HaproxyProcess()
    proc.start()
    try:
        figures = await HaproxyRouter(proc.cfg, log_token=TOKEN).proxy_figures()
    finally:
        proc.close()
    assert figures == {"dropped_log_lines": 0.0}
    # a lost socket: nothing to say, and nothing raised
    assert await HaproxyRouter(proc.cfg, log_token=TOKEN).proxy_figures() == {}
