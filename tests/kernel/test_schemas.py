from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.routes import TOTAL_WEIGHT, RouteState, parse_route, two_way_variants
from controlplane.kernel.rules import parse_rule
from controlplane.kernel.settings import Settings, parse_host_port


def test_rule_defaults_fill_the_optional_fields() -> None:
    rule = parse_rule({"service": "payment-api", "threshold_ms": 800})
    assert (rule.window_sec, rule.percentile, rule.min_samples) == (60, 95, 100)
    assert rule.is_failure_status(503) and not rule.is_failure_status(404)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold_ms", 0),
        ("failure_ratio", 0),
        ("failure_ratio", 1.5),
        ("window_sec", 0),
        ("window_sec", 3601),
        ("percentile", 97),
        ("cooldown_sec", -1),
        ("min_samples", 0),
        ("compare", "median"),
        ("action", "explode"),
        ("service", "Payment API"),
    ],
)
def test_rule_rejects_out_of_range_fields_by_name(field: str, value: object) -> None:
    body = {"service": "payment-api", "threshold_ms": 800, field: value}
    with pytest.raises(ValidationFailed) as caught:
        parse_rule(body)
    assert [e.loc[0] for e in caught.value.errors] == [field]


def test_rule_rejects_non_json_with_a_message() -> None:
    with pytest.raises(ValidationFailed, match="not JSON"):
        parse_rule(b"{nope")


@given(st.integers(min_value=0, max_value=TOTAL_WEIGHT))
def test_two_way_route_weights_sum_to_total(canary_bp: int) -> None:
    variants = two_way_variants("http://a", "http://b", canary_bp)
    route = parse_route(
        {
            "experiment": 1,
            "revision": 1,
            "salt": "s",
            "variants": [v.model_dump() for v in variants],
            "state": "running",
        }
    )
    assert sum(v.weight for v in route.variants) == TOTAL_WEIGHT
    assert route.weight_of("canary") == canary_bp
    assert route.state is RouteState.RUNNING


def test_route_with_bad_weights_is_rejected() -> None:
    raw = json.dumps(
        {
            "experiment": 1,
            "revision": 1,
            "salt": "s",
            "variants": [{"name": "baseline", "upstream": "http://a", "weight": 5000}],
            "state": "running",
        }
    )
    with pytest.raises(ValidationFailed, match="sum to 5000"):
        parse_route(raw)


def test_settings_read_canary_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARY_ETCD_PREFIX", "team-a/")
    monkeypatch.setenv("CANARY_LISTEN", "0.0.0.0:9000")
    settings = Settings()
    assert settings.etcd_prefix == "/team-a"
    assert settings.listen_host_port == ("0.0.0.0", 9000)


def test_the_partial_format_is_4_unless_set_to_an_older_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CANARY_PARTIAL_FORMAT", raising=False)
    assert Settings().partial_format == 4
    monkeypatch.setenv("CANARY_PARTIAL_FORMAT", "3")
    assert Settings().partial_format == 3
    monkeypatch.setenv("CANARY_PARTIAL_FORMAT", "2")
    assert Settings().partial_format == 2
    monkeypatch.setenv("CANARY_PARTIAL_FORMAT", "5")
    with pytest.raises(Exception, match="partial_format"):
        Settings()


@pytest.mark.parametrize("bad", ["8080", "host:", "host:99999", "host:port"])
def test_host_port_errors_name_the_value(bad: str) -> None:
    with pytest.raises(Exception, match=r"HOST:PORT|out of range"):
        parse_host_port(bad)
