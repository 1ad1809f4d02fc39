"""Law: any experiment the API accepts, once started, commits a route whose weights sum
to 10000, which the reconciler publishes as it is."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.controller.reconciler import RouteReconciler
from controlplane.kernel.routes import TOTAL_WEIGHT, parse_route
from controlplane.runtime import Backends

_services = itertools.count()

steps = st.lists(st.integers(1, TOTAL_WEIGHT), min_size=1, max_size=8, unique=True).map(sorted)
sticky = st.one_of(
    st.builds(lambda h: {"header": h}, st.sampled_from(["x-user-id", "x-session"])),
    st.builds(lambda c: {"header": None, "cookie": c}, st.sampled_from(["uid", "sid"])),
)
upstream = st.builds(
    lambda scheme, host, port: f"{scheme}://{host}:{port}",
    st.sampled_from(["http", "https"]),
    # RFC 1123 labels: a hyphen never ends one
    st.from_regex(r"[a-z]([a-z0-9-]{0,19}[a-z0-9])?", fullmatch=True),
    st.integers(1, 65535),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(weights_bp=steps, sticky=sticky, baseline=upstream, canary=upstream,
       holds=st.integers(0, 3600))
async def test_started_experiment_publishes_weights_summing_to_10000(
    client: httpx.AsyncClient,
    backends: Backends,
    weights_bp: list[int],
    sticky: dict[str, Any],
    baseline: str,
    canary: str,
    holds: int,
) -> None:
    service = f"svc-{next(_services)}"
    body = {
        "name": "property",
        "service": service,
        "variants": {"baseline": {"upstream": baseline}, "canary": {"upstream": canary}},
        "steps": [{"weight_pct": bp / 100, "hold_sec": holds} for bp in weights_bp],
        "sticky": sticky,
    }
    created = await client.post("/v1/experiments", json=body)
    assert created.status_code == 201, created.text
    started = await client.post(f"/v1/experiments/{created.json()['id']}/start")
    assert started.status_code == 200, started.text
    await RouteReconciler().reconcile(backends, None, services={service})
    stored = await backends.kv.get(backends.keys.route(service))
    assert stored is not None
    route = parse_route(stored.value)
    assert sum(v.weight for v in route.variants) == TOTAL_WEIGHT
    assert route.weight_of("canary") == weights_bp[0]
