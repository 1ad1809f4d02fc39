"""Rendering a route as an nginx include: layout, names, quoting, refusals."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
from pathlib import Path

import pytest

from controlplane.kernel.routes import Sticky
from routers.nginx.render import (
    RenderOptions,
    ident,
    quote,
    render,
    split_parts,
    variable_prefix,
)
from routers.nginx.split import SplitParts, murmur_hash2
from routers.samples.token import LogToken
from tests.routers.nginx.rig import route
from tests.support.nginx_proc import NGINX, main_config

OPTIONS = RenderOptions(
    service="pay-api",
    listen="127.0.0.1:8080",
    status_listen="127.0.0.1:8081",
    log_target="127.0.0.1:5140",
    allow_force=True,
)
UP = "http://127.0.0.1:9000"


def nginx_accepts(text: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    (tmp / "temp").mkdir()
    include = tmp / "canary.conf"
    include.write_text(text)
    conf = tmp / "nginx.conf"
    conf.write_text(main_config(tmp, include))
    return subprocess.run(
        [NGINX, "-t", "-q", "-p", str(tmp), "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=10,
    )


def test_identifiers_are_one_to_one() -> None:
    names = [
        "".join(p) for n in range(1, 5) for p in itertools.product("a._-", repeat=n) if p[0] == "a"
    ]
    idents = [ident(n) for n in names]
    assert len(set(idents)) == len(names)
    assert all("__" not in i for i in idents)
    assert ident("pay-api.v2_x") == "pay_hapi_dv2_ux"


def test_split_layout_matches_the_bucket_layout() -> None:
    live = route(1, [("canary", UP, 2_500), ("baseline", UP, 7_499), ("zero", UP, 0), ("b", UP, 1)])
    assert split_parts(live) == [("canary", 2_500), ("b", 1), ("baseline", 7_499)]
    text = render(live, OPTIONS)
    # the split names each variant by its index in the route
    assert '    25.00% "0";  # canary\n    0.01% "3";  # b\n    * "1";  # baseline\n' in text
    # without a variant named baseline the first variant goes last
    no_base = route(1, [("blue", UP, 9_000), ("green", UP, 1_000)])
    assert split_parts(no_base) == [("green", 1_000), ("blue", 9_000)]
    assert '    10.00% "1";  # green\n    * "0";  # blue\n' in render(no_base, OPTIONS)
    whole = route(1, [("baseline", UP, 0), ("canary", UP, 10_000)])
    assert '{\n    * "1";  # canary\n}' in render(whole, OPTIONS)


def test_split_thresholds_are_cumulative_floors() -> None:
    parts = SplitParts.from_parts([("a", 1), ("b", 3_333), ("c", 6_666)])
    assert parts.thresholds == (429_496, 429_496 + 3_333 * 0xFFFFFFFF // 10_000, None)
    assert parts.value_for_hash(0xFFFFFFFF) == "c"
    assert parts.value_for_hash(429_495) == "a"
    assert parts.value_for_hash(429_496) == "b"
    with pytest.raises(ValueError):
        SplitParts.from_parts([("a", 5_000), ("b", 0), ("c", 5_000)])


def test_murmur_hash2_vectors() -> None:
    # every tail length; test_nginx_live checks the same function against nginx's split
    vectors = {
        b"": 0x0,
        b"a": 0x92685F5E,
        b"ab": 0x1AA14063,
        b"abc": 0x13577C9B,
        b"abcd": 0x26873021,
        b"abcde": 0x5F09A8DE,
        b"s1:user-0": 0x66633125,
    }
    assert {key: murmur_hash2(key) for key in vectors} == vectors


def test_force_only_when_allowed() -> None:
    live = route(1, [("baseline", UP, 10_000), ("canary", UP, 0)])
    assert '"~^canary$" "1";' in render(live, OPTIONS)
    closed = render(live, dataclasses.replace(OPTIONS, allow_force=False))
    assert "~^canary$" not in closed


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ("h2c://127.0.0.1:9000", "HTTP/2"),
        ("h2://example.com", "HTTP/2"),
        ("http://127.0.0.1:9000/a$b", "'\\$'"),
    ],
)
def test_routes_nginx_cannot_serve_are_refused(upstream: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render(route(1, [("baseline", upstream, 10_000)]), OPTIONS)


def test_a_sticky_header_nginx_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match="sticky header"):
        render(route(1, [("baseline", UP, 10_000)], sticky=Sticky(header="x_user")), OPTIONS)


@pytest.mark.parametrize(
    "options",
    [
        RenderOptions(service="Pay", listen="127.0.0.1:1", status_listen="127.0.0.1:2"),
        RenderOptions(service="pay", listen="127.0.0.1:0", status_listen="127.0.0.1:2"),
        RenderOptions(service="pay", listen="127.0.0.1:1", status_listen="10.0.0.1:2"),
        RenderOptions(
            service="pay", listen="127.0.0.1:1", status_listen="127.0.0.1:2", log_target="x y:1"
        ),
    ],
)
def test_bad_options_are_refused(options: RenderOptions) -> None:
    with pytest.raises(ValueError):
        render(None, options)


def test_quote_escapes_and_refuses_control_characters() -> None:
    assert quote('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    with pytest.raises(ValueError):
        quote("a\rb")


def test_hostile_but_valid_values_render_to_a_config_nginx_accepts(tmp_path: Path) -> None:
    live = route(
        2**31 - 1,
        [
            ("default", 'http://127.0.0.1:9000/p"a}t;h{', 3_000),
            ("include", "http://[::1]:9001/", 3_000),
            ("hostnames", "https://localhost/x", 2_000),
            ("volatile", "http://example.invalid.:9003", 0),
            ("baseline", "http://127.0.0.1:9004", 2_000),
        ],
        experiment="x.-_",
        salt="-._",
        sticky=Sticky(header="X-1-Unit", cookie="`$b|~!#%&'*+.^_"),
    )
    text = render(live, OPTIONS)
    assert '"\\\\0" "default";' in text  # keys are slots; names only values
    assert '/p\\"a}t;h{' in text
    result = nginx_accepts(text, tmp_path)
    # the zero-weight variant's unresolvable host is what nginx refuses, nothing else
    assert 'host not found in upstream "example.invalid.:9003"' in result.stderr
    resolvable = live.model_copy(
        update={"variants": tuple(v for v in live.variants if v.name != "volatile")}
    )
    text = render(resolvable, OPTIONS)
    again = tmp_path / "again"
    again.mkdir()
    result = nginx_accepts(text, again)
    assert result.returncode == 0, result.stderr


def test_the_longest_names_fit_nginx_default_hash_buckets(tmp_path: Path) -> None:
    service = "a" + "-" * 62
    options = dataclasses.replace(OPTIONS, service=service)
    live = route(
        1,
        [
            ("baseline", "http://127.0.0.1:9000", 5_000),
            ("b" + "." * 63, "http://127.0.0.1:9001", 2_500),
            ("c" + "_" * 63, "http://127.0.0.1:9002", 2_500),
        ],
        sticky=Sticky(header="X-" + "u" * 62, cookie="c" * 64),
    )
    text = render(live, options)
    assert variable_prefix(service).startswith("canary__")
    assert variable_prefix("pay-api") == "canary_pay_hapi__"
    result = nginx_accepts(text, tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_log_format_carries_the_agents_token_with_or_without_a_route() -> None:
    token = LogToken.generate()
    options = dataclasses.replace(OPTIONS, log_token=token)
    for live in (None, route(1, [("baseline", UP, 10_000)])):
        (line,) = [x for x in render(live, options).splitlines() if x.startswith("log_format ")]
        assert f'\\"v\\":2,\\"token\\":\\"{token.value}\\",' in line
        assert token.value not in render(live, OPTIONS)  # the first include has none
    assert '\\"token\\":\\"\\"' in render(None, OPTIONS)
    another = dataclasses.replace(OPTIONS, log_token=LogToken.generate())
    assert render(None, options) != render(None, another)
