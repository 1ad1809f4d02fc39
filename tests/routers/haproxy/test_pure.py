"""The pure parts: the base config, the route's map value, the plan, the split."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import xxhash

from controlplane.kernel.routes import Route, two_way_variants
from routers.haproxy import route_value
from routers.haproxy.plan import PlanError, ServerStep, Target, plan, targets
from routers.haproxy.render import BaseConfig, render_config
from routers.haproxy.split import bucket, variant_of
from routers.samples.token import LogToken
from tests.support.haproxy_proc import HAPROXY
from tests.support.processes import free_port

BASE = BaseConfig(service="shop", listen="127.0.0.1:8080", stats_socket="/run/a.sock",
                  map_path="/etc/route.map")  # fmt: skip
TOKEN = LogToken("fixture-token_0123456789")


def route(canary_bp: int = 500, **fields: object) -> Route:
    data: dict[str, object] = {
        "experiment": 42,
        "revision": 7,
        "salt": "Ab3xY9",
        "variants": [
            v.model_dump()
            for v in two_way_variants("http://shop-v1:8080", "http://10.0.0.2:81", canary_bp)
        ],
        "state": "running",
    }
    data.update(fields)
    return Route.model_validate(data)


@pytest.mark.parametrize(
    "options",
    [{}, {"allow_force": True, "sticky_cookie": "sid", "log_target": "127.0.0.1:5140"},
     {"sticky_header": None, "sticky_cookie": "sid", "variants": ("baseline", "a", "b.2")}],
)  # fmt: skip
def test_haproxy_accepts_the_rendered_config(tmp_path: Path, options: dict[str, object]) -> None:
    cfg = BaseConfig(
        service="shop",
        listen=f"127.0.0.1:{free_port()}",
        stats_socket=str(tmp_path / "a.sock"),
        map_path=str(tmp_path / "route.map"),
        **options,  # type: ignore[arg-type]
    )
    (tmp_path / "route.map").write_text("")
    (tmp_path / "haproxy.cfg").write_text(render_config(cfg))
    checked = subprocess.run(
        [HAPROXY, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, timeout=10
    )
    assert checked.returncode == 0, checked.stderr.decode()
    assert "ALERT" not in checked.stderr.decode() and "WARNING" not in checked.stderr.decode()


@pytest.mark.parametrize(
    "options",
    [{"service": "Shop"}, {"variants": ()}, {"variants": ("a", "a")},
     {"variants": ("a b",)}, {"sticky_header": "x user"},
     {"sticky_header": None, "sticky_cookie": None}, {"listen": "127.0.0.1"},
     {"log_target": "host:port"}, {"timeouts": (("client", "30 s"),)},
     {"timeouts": (("tarpit;", "1s"),)}, {"map_path": "/a b/route.map"}, {"retries": -1}],
)  # fmt: skip
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    fields = {"service": "shop", "listen": "127.0.0.1:80", "stats_socket": "/s", "map_path": "/m"}
    with pytest.raises(ValueError):
        BaseConfig(**{**fields, **options})  # type: ignore[arg-type]


def test_the_map_value_carries_the_layout_baseline_last() -> None:
    three = route(
        variants=[
            {"name": "baseline", "upstream": "http://a:1", "weight": 7000},
            {"name": "canary", "upstream": "http://b:1", "weight": 1000},
            {"name": "green", "upstream": "http://c:1", "weight": 2000},
        ]
    )
    declared = ("baseline", "canary", "green", "spare")
    value = route_value.encode(three, declared, header=True, cookie=False, token=TOKEN)
    assert value == (
        "42|7|Ab3xY9|1|0|fixture-token_0123456789|"
        "1000|canary|3000|green|10000|baseline|0|-|1|1|1|0"
    )
    assert route_value.decode(value, len(declared)) == route_value.DecodedRoute("42", 7, value)
    fields = value.split("|")
    assert fields[route_value.slot_bound_field(1) - 1] == "3000"
    assert fields[route_value.slot_variant_field(1) - 1] == "green"
    assert fields[route_value.force_field(3, len(declared)) - 1] == "0"
    assert fields[route_value.force_field(2, len(declared)) - 1] == "1"
    assert fields[route_value.TOKEN_FIELD - 1] == TOKEN.value
    for bad in ("42|x|s|1|0|t|0|-|0|-|0|0|0|0|0|0|0|0", "42|7", "|" * 5000, value[:-2]):
        with pytest.raises(ValueError):
            route_value.decode(bad, len(declared))


def test_zero_weight_variants_take_no_slot_but_may_be_forced() -> None:
    value = route_value.encode(
        route(0), ("baseline", "canary"), header=True, cookie=True, token=TOKEN
    )
    assert value == "42|7|Ab3xY9|1|1|fixture-token_0123456789|10000|baseline|0|-|1|1"


def test_the_plan_readies_route_servers_before_the_map_and_parks_the_rest() -> None:
    cfg = BaseConfig(service="shop", listen="127.0.0.1:1", stats_socket="/s", map_path="/m",
                     variants=("baseline", "canary", "green"))  # fmt: skip
    r = route()
    assert targets(r, cfg) == (
        Target("baseline", "shop-v1", 8080),
        Target("canary", "10.0.0.2", 81),
    )
    steps = plan(r, cfg, {"baseline": ("10.0.0.1", 8080), "canary": ("10.0.0.2", 81)}, TOKEN)
    assert steps.ready == (
        ServerStep("v_baseline", "up", ("10.0.0.1", 8080), "ready"),
        ServerStep("v_canary", "up", ("10.0.0.2", 81), "ready"),
    )
    assert steps.maint == (ServerStep("v_green", "up", None, "maint"),)
    assert steps.value is not None
    assert steps.value.startswith("42|7|Ab3xY9|1|0|fixture-token_0123456789|500|canary|")
    nothing = plan(None, cfg, {}, TOKEN)
    assert (nothing.ready, nothing.value, len(nothing.maint)) == ((), None, 3)
    assert targets(None, cfg) == ()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"variants": [{"name": "baseline", "upstream": "http://a:1", "weight": 10000},
                       {"name": "blue", "upstream": "http://b:1", "weight": 0}]},
         "route variant(s) blue have no backend in the haproxy base config "
         "(declared: baseline, canary)"),
        ({"variants": [v.model_dump() for v in two_way_variants("http://a:1", "h2c://b:1", 5)]},
         "variant canary's upstream is h2c://: the haproxy base config carries plain "
         "http:// (HTTP/1.1) only"),
        ({"variants": [v.model_dump() for v in two_way_variants("https://a", "http://b", 5)]},
         "variant baseline's upstream is https://"),
        ({"variants": [v.model_dump() for v in two_way_variants("http://a/p", "http://b", 5)]},
         "variant baseline's upstream has a path prefix"),
        ({"sticky": {"header": "x-session"}},
         "route's sticky header x-session is not the base config's (x-user-id): render a "
         "new base config with it and restart haproxy"),
        ({"sticky": {"header": None, "cookie": "sid"}}, "route's sticky cookie sid"),
    ],
)  # fmt: skip
def test_routes_the_base_config_cannot_carry_are_refused(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(PlanError) as caught:
        targets(route(**changes), BASE)
    assert str(caught.value).startswith(message)


def test_a_route_may_leave_out_a_sticky_source_or_spell_the_header_otherwise() -> None:
    cfg = BaseConfig(service="shop", listen="127.0.0.1:1", stats_socket="/s", map_path="/m",
                     sticky_cookie="sid")  # fmt: skip
    assert targets(route(sticky={"header": "X-User-Id", "cookie": None}), cfg)
    assert targets(route(sticky={"header": None, "cookie": "sid"}), cfg)


def test_split_is_xxh32_of_salt_colon_unit_mod_10000() -> None:
    # xxh32 published vectors: "" → 0x02CC5D05, "abc" → 0x32D153FF (seed 0)
    assert xxhash.xxh32_intdigest(b"") == 0x02CC5D05
    assert xxhash.xxh32_intdigest(b"abc") == 0x32D153FF
    assert bucket("s", "u") == xxhash.xxh32_intdigest(b"s:u") % 10000
    assert bucket("s", "caf\xe9") == xxhash.xxh32_intdigest(b"s:caf\xe9") % 10000
    r = route(3000)
    for unit in ("a", "b", "c", "user-1"):
        expected = "canary" if bucket(r.salt, unit) < 3000 else "baseline"
        assert variant_of(r, unit) == expected
