"""HAProxy's access log, sent by the base config to a UDP socket the test binds,
parses to the samples of the requests it proxied."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from controlplane.kernel.codec import CONNECT_ERROR
from controlplane.kernel.routes import Route, RouteState, two_way_variants
from routers.haproxy.log_lines import HaproxyLineParser
from routers.haproxy.router import HaproxyRouter
from routers.haproxy.split import variant_of
from routers.samples.token import LogToken
from sidecar.assignment import unit_hash
from sidecar.choice import Sample
from tests.support.haproxy_proc import HaproxyProcess, LogSink, VariantUpstream, fetch_all
from tests.support.processes import free_port


async def samples_of(sink: LogSink, parser: HaproxyLineParser, count: int) -> list[Sample]:
    """The next `count` attributed samples (lines without a route are counted apart)."""
    found: list[Sample] = []
    while len(found) < count:
        (datagram,) = await sink.receive(1)
        sample = parser.parse(datagram)
        if sample is not None:
            found.append(sample)
    return found


async def test_log_lines_reach_the_receiver_and_parse_to_samples(
    start_haproxy: Callable[..., HaproxyProcess],
    upstreams: dict[str, VariantUpstream],
    log_sink: LogSink,
) -> None:
    proc = start_haproxy(log_target=log_sink.target, retries=0)
    token = LogToken.generate()
    parser = HaproxyLineParser("shop", token=token)
    router = HaproxyRouter(proc.cfg, log_token=token)
    (no_route,) = await fetch_all(proc.port, [{"x-user-id": "before"}])
    assert no_route.status == 503

    route = Route(
        experiment=42,
        revision=1,
        salt="log-salt",
        variants=two_way_variants(upstreams["baseline"].url, upstreams["canary"].url, 5000),
        state=RouteState.RUNNING,
    )
    await router.apply(route)
    units = [f"u{i}" for i in range(50)]
    before = time.time()
    await fetch_all(proc.port, [{"x-user-id": u} for u in units] + [{}], concurrency=1)
    samples = await samples_of(log_sink, parser, len(units) + 1)
    assert parser.rejected["unattributed"] >= 1  # the request that met no route
    by_unit = {s[5]: s for s in samples}
    for unit in units:
        ts, experiment, variant, rt_us, outcome, _, first_byte_us = by_unit.pop(
            unit_hash("log-salt", unit)
        )
        assert (experiment, variant, outcome) == ("42", variant_of(route, unit), 200)
        assert 0 <= first_byte_us <= rt_us
        assert before - 1 <= ts <= time.time() + 1
    assert [s[5] for s in by_unit.values()] == [0]  # the request without a unit

    dead = route.model_copy(
        update={
            "revision": 2,
            "variants": two_way_variants(
                upstreams["baseline"].url, f"http://127.0.0.1:{free_port()}", 10_000
            ),
        }
    )
    await router.apply(dead)
    (refused,) = await fetch_all(proc.port, [{"x-user-id": "u1"}])
    assert refused.status == 503
    (sample,) = await asyncio.wait_for(samples_of(log_sink, parser, 1), 5)
    assert sample[2:5:2] == ("canary", CONNECT_ERROR)
    assert sample[6] == sample[3]
    assert set(parser.rejected) == {"unattributed"}

    # the token is HAProxy's to log, from the map value; another agent's is forged
    await fetch_all(proc.port, [{"x-user-id": "u2"}])
    (datagram,) = await log_sink.receive(1)
    assert datagram.split(b" ")[:3] == [b"cx3", token.value.encode(), b"shop"]
    other = HaproxyLineParser("shop", token=LogToken.generate())
    assert other.parse(datagram) is None and other.rejected == {"forged": 1}
