"""What the judgment assumes of every router's sticky split, proved on each one's
own hash (sidecar: blake2b; NGINX: MurmurHash2 of split_clients; HAProxy: xxh32):

- deterministic: a unit gets one variant for a given route;
- monotonic: a unit in the canary at weight w is in it at every weight ≥ w, so a
  ramp never moves a user back (per-unit tests, no user seeing both and back);
- in proportion: distinct units split as the weights say, so the unit-level sample
  ratio check (SRM) holds on a router's traffic as on a sidecar's.

The live tests (tests/routers/nginx, tests/routers/haproxy) show the real proxies
assign exactly as these predictions do; this shows the predictions have the
properties, over many salts and weights.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from routers.haproxy import split as haproxy_split
from routers.nginx.render import split_parts
from routers.nginx.split import SplitParts, split_key
from sidecar.assignment import BucketLayout, bucket

Assign = Callable[[Route, str], str]


def sidecar_variant(route: Route, unit: str) -> str:
    layout = BucketLayout.from_weights(
        [(v.name, v.weight) for v in route.variants], baseline="baseline"
    )
    return layout.variant_at(bucket(route.salt, unit))


def nginx_variant(route: Route, unit: str) -> str:
    return SplitParts.from_parts(split_parts(route)).value_for(split_key(route.salt, unit))


def haproxy_variant(route: Route, unit: str) -> str:
    return haproxy_split.variant_of(route, unit)


ROUTERS: dict[str, Assign] = {
    "sidecar": sidecar_variant,
    "nginx": nginx_variant,
    "haproxy": haproxy_variant,
}


def route(salt: str, canary_bp: int) -> Route:
    return Route(
        experiment=1, revision=1, salt=salt, sticky=Sticky(),
        variants=two_way_variants("http://v1", "http://v2", canary_bp),
        state=RouteState.RUNNING,
    )  # fmt: skip


SALTS = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
                min_size=1, max_size=64)  # fmt: skip
UNITS = st.lists(st.text(min_size=1, max_size=40).filter(lambda u: u.isprintable()),
                 min_size=1, max_size=40, unique=True)  # fmt: skip
WEIGHTS = st.lists(st.integers(0, 10_000), min_size=2, max_size=6)


@pytest.mark.parametrize("router", list(ROUTERS))
@settings(max_examples=150, deadline=None)
@given(salt=SALTS, units=UNITS, weights=WEIGHTS)
def test_a_unit_in_the_canary_stays_in_it_as_the_canary_grows(
    router: str, salt: str, units: list[str], weights: list[int]
) -> None:
    assign = ROUTERS[router]
    units = [u for u in units if all(ord(c) < 256 for c in u)] or ["u"]
    previous: set[str] = set()
    for weight in sorted(weights):
        canary = {u for u in units if assign(route(salt, weight), u) == "canary"}
        assert previous <= canary, (router, weight, previous - canary)
        previous = canary
    assert {u for u in units if assign(route(salt, 10_000), u) == "canary"} == set(units)
    assert not {u for u in units if assign(route(salt, 0), u) == "canary"}


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize("canary_bp", [100, 500, 2500, 5000, 9000])
def test_distinct_units_split_in_proportion_to_the_weights(router: str, canary_bp: int) -> None:
    # 40,000 ids shaped like real ones; the chi-square test is the one the unit-level
    # SRM check makes, at the bound it alarms on
    assign = ROUTERS[router]
    units = [f"user-{i}" for i in range(40_000)]
    r = route("Ab3xY9", canary_bp)
    in_canary = sum(1 for u in units if assign(r, u) == "canary")
    expected = [len(units) * canary_bp / 10_000, len(units) * (10_000 - canary_bp) / 10_000]
    p = chisquare([in_canary, len(units) - in_canary], expected).pvalue
    assert p > 1e-3, (router, canary_bp, in_canary, expected)


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_unit_gets_one_variant_for_a_route(router: str) -> None:
    assign = ROUTERS[router]
    r = route("salt", 3000)
    assert all(assign(r, f"u{i}") == assign(r, f"u{i}") for i in range(2000))
