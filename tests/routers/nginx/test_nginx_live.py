"""The nginx router against a real nginx on private ports, with real upstreams."""

from __future__ import annotations

import itertools
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.kernel.codec import CONNECT_ERROR
from controlplane.kernel.routes import Sticky
from routers.nginx.log_lines import NginxLineParser
from routers.nginx.render import split_parts
from routers.nginx.split import SplitParts, split_key
from routers.seam import InForce, RouterError
from sidecar.assignment import unit_hash
from tests.routers.nginx.rig import (
    SALT,
    SERVICE,
    Rig,
    VariantUpstream,
    fetch,
    fetch_many,
    nginx_rig,
    route,
)
from tests.support.processes import free_port
from tests.support.tls import make_pki

UNITS = [f"user-{i}" for i in range(2_000)]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with nginx_rig(tmp_path) as made:
        yield made


@pytest.fixture
async def force_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with nginx_rig(tmp_path, allow_force=True) as made:
        yield made


async def variants_of(rig: Rig, units: list[str]) -> list[str]:
    responses = await fetch_many(rig.port, [{"X-User-Id": unit} for unit in units])
    assert [r.status for r in responses if r.status != 200] == [], rig.nginx.errors()[-1500:]
    return [r.header("x-canary-variant") or "" for r in responses]


async def test_split_matches_the_documented_hash_and_is_monotonic(rig: Rig) -> None:
    canary_sets: list[set[str]] = []
    for revision, canary_bp in enumerate((100, 2_500, 5_000, 9_999), start=1):
        live = rig.two_way(revision, canary_bp)
        await rig.router.apply(live)
        parts = SplitParts.from_parts(split_parts(live))
        seen = await variants_of(rig, UNITS)
        predicted = [parts.value_for(split_key(SALT, unit)) for unit in UNITS]
        assert seen == predicted, f"at {canary_bp} bp"
        canary = {unit for unit, v in zip(UNITS, seen, strict=True) if v == "canary"}
        # the weight shows in the split (a hash or layout error would be far off)
        assert abs(len(canary) - canary_bp * len(UNITS) / 10_000) < 100
        canary_sets.append(canary)
    for smaller, larger in itertools.pairwise(canary_sets):
        assert smaller <= larger


async def test_three_variants_put_the_baseline_last(rig: Rig) -> None:
    ups = rig.upstreams
    live = route(
        1,
        [
            ("baseline", ups["baseline"].url, 5_000),
            ("canary", ups["canary"].url, 3_000),
            ("canary-b", ups["canary-b"].url, 2_000),
        ],
    )
    await rig.router.apply(live)
    assert split_parts(live) == [("canary", 3_000), ("canary-b", 2_000), ("baseline", 5_000)]
    parts = SplitParts.from_parts(split_parts(live))
    seen = await variants_of(rig, UNITS)
    assert seen == [parts.value_for(split_key(SALT, unit)) for unit in UNITS]
    responses = await fetch_many(rig.port, [{"X-User-Id": u} for u in UNITS[:50]])
    # the variant named on the response is the upstream that answered
    assert all(r.json()["upstream"] == r.header("x-canary-variant") for r in responses)


async def test_the_cookie_is_the_unit_when_the_header_is_absent(rig: Rig) -> None:
    live = rig.two_way(1, 5_000)
    await rig.router.apply(live)
    parts = SplitParts.from_parts(split_parts(live))
    units = UNITS[:300]
    cookies = [{"Cookie": f'a=1; uid = "{unit}" ; z=2'} for unit in units]
    seen = [r.header("x-canary-variant") for r in await fetch_many(rig.port, cookies)]
    assert seen == [parts.value_for(split_key(SALT, unit)) for unit in units]


async def test_variant_headers_go_both_ways(rig: Rig) -> None:
    await rig.router.apply(rig.two_way(3, 10_000, experiment="exp-7"))
    response = await fetch(
        rig.port, {"X-User-Id": "alice", "X-Canary-Variant": "forged"}, "/a/b?c=1"
    )
    assert response.status == 200
    assert response.headers["x-canary-variant"] == ["canary"]  # the upstream's own is hidden
    assert response.headers["x-canary-experiment"] == ["exp-7"]
    sent = response.json()
    assert sent == {
        "upstream": "canary",
        "target": "/a/b?c=1",
        "host": f"127.0.0.1:{rig.upstreams['canary'].port}",
        "variant": "canary",
        "experiment": "exp-7",
    }


async def test_an_upstream_prefix_is_prepended(rig: Rig) -> None:
    ups = rig.upstreams
    await rig.router.apply(route(1, [("baseline", ups["baseline"].url + "/v1/", 10_000)]))
    response = await fetch(rig.port, {}, "/orders?id=3")
    assert response.json()["target"] == "/v1/orders?id=3"


async def test_no_route_answers_503(rig: Rig) -> None:
    await rig.router.apply(rig.two_way(1, 5_000))
    await rig.router.apply(None)
    response = await fetch(rig.port, {"X-User-Id": "alice"})
    assert response.status == 503
    assert response.body == f"no canary route for service {SERVICE}\n".encode()
    assert await rig.router.in_force() == InForce(None, None)


async def test_with_a_default_upstream_no_route_is_served_there_untagged(
    tmp_path: Path,
) -> None:
    async with nginx_rig(tmp_path, default_upstream=True) as rig:
        await rig.router.apply(rig.two_way(1, 5_000))
        await rig.router.apply(None)
        response = await fetch(rig.port, {"X-User-Id": "alice"}, "/x")
        assert response.status == 200
        assert response.headers["x-canary-variant"] == ["default"]
        assert response.json()["target"] == "/home/x"
        assert "x-canary-experiment" not in response.headers
        assert await rig.router.in_force() == InForce(None, None)


async def test_forced_variant_only_when_allowed_and_only_route_variants(force_rig: Rig) -> None:
    rig = force_rig
    await rig.router.apply(rig.two_way(1, 0))  # the canary is reachable only when forced
    cases = {
        "canary": "canary",
        "baseline": "baseline",
        "CANARY": "baseline",
        "canary-b": "baseline",
        "default": "baseline",
    }
    for forced, expected in cases.items():
        response = await fetch(rig.port, {"X-User-Id": "alice", "X-Canary-Force": forced})
        assert response.header("x-canary-variant") == expected, forced
        assert response.json()["upstream"] == expected


async def test_forced_variant_ignored_when_not_allowed(rig: Rig) -> None:
    await rig.router.apply(rig.two_way(1, 0))
    response = await fetch(rig.port, {"X-User-Id": "alice", "X-Canary-Force": "canary"})
    assert response.header("x-canary-variant") == "baseline"


async def test_reload_is_confirmed_by_what_nginx_answers(rig: Rig) -> None:
    assert await rig.router.in_force() == InForce(None, None)
    for revision in (1, 2):
        live = rig.two_way(revision, 10_000, experiment=f"exp-{revision}")
        await rig.router.apply(live)
        assert await rig.router.in_force() == InForce(f"exp-{revision}", revision)
        # in force as soon as apply returns: no wait between
        response = await fetch(rig.port, {"X-User-Id": "alice"})
        assert response.header("x-canary-experiment") == f"exp-{revision}"
    assert rig.router.stats.reloads == 2
    assert rig.router.stats.applies == 2
    # the same route again: nothing to reload
    await rig.router.apply(live)
    assert rig.router.stats.reloads == 2


async def test_a_route_nginx_refuses_keeps_the_last_good_one(rig: Rig) -> None:
    good = rig.two_way(1, 10_000)
    await rig.router.apply(good)
    before = rig.nginx.include.read_bytes()
    bad = route(
        2,
        [
            ("baseline", rig.upstreams["baseline"].url, 5_000),
            ("canary", "http://no-such-host.invalid:8080", 5_000),
        ],
    )
    with pytest.raises(RouterError, match="host not found in upstream"):
        await rig.router.apply(bad)
    http2 = route(3, [("baseline", "h2c://127.0.0.1:9", 10_000)])
    with pytest.raises(RouterError, match="HTTP/2"):
        await rig.router.apply(http2)
    assert rig.nginx.include.read_bytes() == before
    assert await rig.router.in_force() == InForce("42", 1)
    response = await fetch(rig.port, {"X-User-Id": "alice"})
    assert response.status == 200
    assert response.header("x-canary-variant") == "canary"
    assert rig.router.stats.failures == 2
    assert rig.router.stats.reloads == 1
    assert rig.nginx.master_alive()


async def test_log_lines_reach_the_receiver_and_parse(rig: Rig) -> None:
    live = rig.two_way(5, 5_000, experiment="exp-log")
    await rig.router.apply(live)
    parser = NginxLineParser(SERVICE, token=rig.token)
    asked = [{"X-User-Id": f"user-{i}"} for i in range(20)]
    asked += [{"Cookie": "uid=bob"}, {}]
    responses = await fetch_many(rig.port, asked, per_connection=1)
    samples = [parser.parse(d) for d in rig.datagrams(len(asked))]
    assert parser.rejected == {}
    by_unit = {s[5]: s for s in samples if s is not None}
    assert len(by_unit) == len(asked)  # ever-distinct hashes, and 0 for the unit-less one
    for headers, response in zip(asked, responses, strict=True):
        unit = headers.get("X-User-Id") or ("bob" if "Cookie" in headers else None)
        hashed = unit_hash(SALT, unit) if unit else 0
        ts, experiment, variant, rt_us, outcome, _, first_byte_us = by_unit[hashed]
        assert (experiment, variant, outcome) == (
            "exp-log",
            response.header("x-canary-variant"),
            200,
        )
        assert 0 <= first_byte_us <= rt_us < 5_000_000
        assert rt_us % 1_000 == 0 and first_byte_us % 1_000 == 0  # nginx's ms resolution
        assert ts > 1.6e9


async def test_a_dead_upstream_is_logged_as_a_connect_error(rig: Rig) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    await rig.router.apply(
        route(1, [("baseline", dead, 10_000)], sticky=Sticky(header="X-User-Id"))
    )
    response = await fetch(rig.port, {"X-User-Id": "alice"})
    assert response.status == 502
    assert response.header("x-canary-variant") == "baseline"  # `always`: on errors too
    (datagram,) = rig.datagrams(1)
    sample = NginxLineParser(SERVICE, token=rig.token).parse(datagram)
    assert sample is not None
    assert sample[4] == CONNECT_ERROR and sample[5] == unit_hash(SALT, "alice")


async def test_hostile_but_valid_names_are_served_as_written(force_rig: Rig) -> None:
    rig = force_rig
    ups = rig.upstreams
    cookie = "`$b|~!#%&'*+.^_"
    live = route(
        1,
        [("default", ups["baseline"].url, 6_000), ("include", ups["canary"].url + "/x", 4_000)],
        experiment="x.-_",
        salt="-._",
        sticky=Sticky(cookie=cookie, header=None),
    )
    await rig.router.apply(live)
    parts = SplitParts.from_parts(split_parts(live))
    units = UNITS[:200]
    responses = await fetch_many(rig.port, [{"Cookie": f"{cookie}={unit}"} for unit in units])
    assert [r.header("x-canary-variant") for r in responses] == [
        parts.value_for(split_key("-._", unit)) for unit in units
    ]
    assert {r.json()["variant"] for r in responses} == {"default", "include"}
    assert all(r.header("x-canary-experiment") == "x.-_" for r in responses)
    for forced in ("default", "include"):
        response = await fetch(rig.port, {"X-Canary-Force": forced})
        assert response.json()["variant"] == forced


async def test_a_route_that_clashes_with_the_main_config_is_put_back(tmp_path: Path) -> None:
    # the check config holds the candidate alone; only the main config shows the clash
    clash = "    upstream canary_pay_hapi__canary { server 127.0.0.1:9; }"
    async with nginx_rig(tmp_path, extra_http=clash) as rig:
        await rig.router.apply(route(1, [("baseline", rig.upstreams["baseline"].url, 10_000)]))
        before = rig.nginx.include.read_bytes()
        with pytest.raises(RouterError, match="duplicate upstream"):
            await rig.router.apply(rig.two_way(2, 5_000))
        assert rig.nginx.include.read_bytes() == before
        assert sorted(p.name for p in rig.nginx.include.parent.iterdir() if p.is_file()) == [
            rig.nginx.include.name
        ]
        assert await rig.router.in_force() == InForce("42", 1)
        assert (await fetch(rig.port, {"X-User-Id": "a"})).header("x-canary-variant") == "baseline"
        stats = rig.router.stats
        assert (stats.restores, stats.reloads, stats.failures) == (1, 1, 1)


async def test_a_reload_nginx_does_not_confirm_is_put_back(tmp_path: Path) -> None:
    # the pid file names a process that ignores SIGHUP: nginx never reloads
    deaf = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\nprint(flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert deaf.stdout is not None
        deaf.stdout.readline()  # its handler is in place
        pid_file = tmp_path / "deaf.pid"
        pid_file.write_text(f"{deaf.pid}\n")
        async with nginx_rig(tmp_path, pid_file=pid_file, confirm_timeout=0.5) as rig:
            before = rig.nginx.include.read_bytes()
            with pytest.raises(RouterError, match="did not put revision 1 in force"):
                await rig.router.apply(rig.two_way(1, 5_000))
            assert rig.nginx.include.read_bytes() == before
            assert await rig.router.in_force() == InForce(None, None)
            assert (await fetch(rig.port)).status == 503
            assert rig.router.stats.restores == 1
    finally:
        deaf.kill()
        deaf.wait()


async def test_in_force_fails_cleanly_when_nginx_is_down(rig: Rig) -> None:
    rig.nginx.stop()
    with pytest.raises(RouterError, match="unreachable"):
        await rig.router.in_force()
    with pytest.raises(RouterError):
        await rig.router.apply(rig.two_way(1, 5_000))
    assert rig.router.stats.failures == 1


async def test_an_https_upstream_is_verified(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    secure = VariantUpstream("secure")
    await secure.start(tls)
    try:
        for trusted, status in ((pki.ca_file, 200), (pki.other_ca_file, 502)):
            async with nginx_rig(tmp_path / f"rig-{status}", trusted_ca=trusted) as rig:
                upstream = f"https://localhost:{secure.port}/tls"
                await rig.router.apply(route(1, [("baseline", upstream, 10_000)]))
                response = await fetch(rig.port, {"X-User-Id": "alice"}, "/p")
                assert response.status == status
                if status == 200:
                    assert response.json()["host"] == f"localhost:{secure.port}"
                    assert response.json()["target"] == "/tls/p"
    finally:
        await secure.close()


async def test_a_reload_by_command_waits_for_the_old_workers_too(tmp_path: Path) -> None:
    # nginx keeps its previous workers accepting for ~100 ms after a reload; requests
    # sent the moment apply returns must all see the new route
    async with nginx_rig(tmp_path, reload_by_command=True) as rig:
        for revision, canary_bp in enumerate((0, 10_000, 0), start=1):
            await rig.router.apply(rig.two_way(revision, canary_bp))
            expected = "canary" if canary_bp else "baseline"
            assert set(await variants_of(rig, UNITS[:400])) == {expected}
        assert rig.router.stats.reloads == 3
