"""The API and the sidecars (and the controller) refuse exactly the same values."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

from controlplane.api.schemas import ExperimentCreate, VariantIn
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.hosts import parse_host
from controlplane.kernel.keys import is_experiment_id
from controlplane.kernel.routes import parse_route
from controlplane.kernel.rules import parse_rule
from controlplane.kernel.values import UpstreamPolicy, split_upstream
from sidecar.choice import Upstream
from tests.support.host_spellings import URL_TEXTS

UPSTREAMS = [
    ("http://payments-v2:8080", True),
    ("https://api.internal/prefix", True),
    ("http://10.0.0.7:65535", True),
    ("http://user:secret@payments:8080", False),
    ("http://user@payments", False),
    ("http://payments:8080/#frag", False),
    ("http://payments:8080/?q=1", False),
    ("http://payments:99999", False),
    ("http://payments:0", False),
    ("http://", False),
    ("ftp://payments", False),
    ("http://pay ments", False),
    ("http://payments\r\nHost: evil", False),
    ("http://" + "a" * 64 + ".example", False),  # an IDNA label is at most 63
    ("http://x/" + "p" * 3000, False),
    ("javascript:alert(1)", False),
]


def route(upstream: str = "http://b:80", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "experiment": 1,
        "revision": 1,
        "salt": "s4lt",
        "sticky": {"header": "x-user-id"},
        "variants": [
            {"name": "baseline", "upstream": "http://a:80", "weight": 9000},
            {"name": "canary", "upstream": upstream, "weight": 1000},
        ],
        "state": "running",
    }
    body.update(changes)
    return body


def api_accepts_upstream(url: str) -> bool:
    try:
        VariantIn(upstream=url)
    except ValidationError:
        return False
    return True


def sidecar_accepts_upstream(url: str) -> bool:
    try:
        parse_route(route(url))
    except ValidationFailed:
        return False
    Upstream.parse(url)  # what the route parser admits, the proxy can dial
    return True


@pytest.mark.parametrize(("url", "valid"), UPSTREAMS)
def test_upstreams_are_judged_the_same_by_the_api_and_the_sidecar(url: str, valid: bool) -> None:
    assert api_accepts_upstream(url) is valid
    assert sidecar_accepts_upstream(url) is valid


@settings(max_examples=300, deadline=None)
@given(URL_TEXTS)
def test_any_upstream_is_judged_the_same_by_the_api_and_the_sidecar(url: str) -> None:
    assert api_accepts_upstream(url) == sidecar_accepts_upstream(url)


def test_a_refused_upstream_is_not_echoed() -> None:
    with pytest.raises(ValidationError) as caught:
        VariantIn(upstream="http://user:hunter2@payments:8080")
    assert "hunter2" not in str(caught.value.errors(include_input=False))
    with pytest.raises(ValueError, match="credentials") as direct:
        split_upstream("http://user:hunter2@payments:8080")
    assert "hunter2" not in str(direct.value)


STICKY_NAMES = [
    ("x-user-id", True),
    ("X_Session.1", True),
    ("", False),
    ("x-user\r\nset-cookie: a=b", False),
    ("x user", False),
    ("x:user", False),
    ("é", False),
    ("h" * 65, False),
    ("h" * 100_000, False),
]


@pytest.mark.parametrize(("name", "valid"), STICKY_NAMES)
@pytest.mark.parametrize("field", ["header", "cookie"])
def test_sticky_names_are_tokens_for_the_api_and_the_sidecar(
    name: str, valid: bool, field: str
) -> None:
    sticky = {field: name} if field == "header" else {"header": None, "cookie": name}
    api = True
    try:
        ExperimentCreate.model_validate(
            {
                "name": "n",
                "service": "svc",
                "variants": {
                    "baseline": {"upstream": "http://a:80"},
                    "canary": {"upstream": "http://b:80"},
                },
                "steps": [{"weight_pct": 1, "hold_sec": 0}],
                "sticky": sticky,
            }
        )
    except ValidationError:
        api = False
    sidecar = True
    try:
        parse_route(route(sticky=sticky))
    except ValidationFailed:
        sidecar = False
    assert api is valid
    assert sidecar is valid


@pytest.mark.parametrize(
    "changes",
    [
        {"revision": 2**70},
        {"revision": 2**31},
        {"revision": -1},
        {"revision": True},
        {"revision": "5"},
        {"experiment": 2**63},
        {"experiment": 2**31},
        {"experiment": "x\x1b[31m"},
        {"salt": "s\r\n"},
        {"salt": "s" * 65},
    ],
)
def test_routes_with_out_of_range_fields_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationFailed):
        parse_route(route(**changes))


@pytest.mark.parametrize("name", ["-x", "_x", ".x", "x" * 65, "a/b", "{x}", ""])
def test_a_route_names_only_experiments_whose_samples_a_collector_would_count(name: str) -> None:
    """A named experiment the sidecars serve but whose samples the collectors drop
    would be judged on nothing: both sides use the one pattern."""
    assert not is_experiment_id(name)
    with pytest.raises(ValidationFailed):
        parse_route(route(experiment=name))


@pytest.mark.parametrize("name", ["shop-v2", "A1", "x" * 64, "7"])
def test_a_name_the_route_accepts_is_one_the_collector_accepts(name: str) -> None:
    assert parse_route(route(experiment=name)).experiment == name
    assert is_experiment_id(name)


def test_a_weight_given_as_a_bool_is_refused_by_the_route_parser() -> None:
    body = route()
    body["variants"][1]["weight"] = True
    with pytest.raises(ValidationFailed):
        parse_route(body)


RULE_VALUES = [
    ("threshold_ms", math.inf),
    ("threshold_ms", math.nan),
    ("threshold_ms", 1e400),
    ("threshold_ms", True),
    ("threshold_ms", "800"),
    ("threshold_ms", 1e12),
    ("cooldown_sec", 1e308),
    ("cooldown_sec", math.inf),
    ("no_data_timeout_sec", 1e300),
    ("min_samples", 10**20),
    ("max_trips", 10**9),
    ("window_sec", True),
    ("baseline_margin", 1e300),
    ("failure_statuses", [True]),
    ("alpha", "0.01"),
]


@pytest.mark.parametrize(("field", "value"), RULE_VALUES)
def test_rules_refuse_unbounded_or_loose_numbers_everywhere(field: str, value: Any) -> None:
    from controlplane.api.routes.rules import rule_for

    body = {"threshold_ms": 800, field: value}
    with pytest.raises(ValidationFailed) as at_api:
        rule_for("svc", body)
    assert any(e.loc[-1] == field or field in e.loc for e in at_api.value.errors)
    with pytest.raises(ValidationFailed):  # the controller's and collector's parser
        parse_rule({**body, "service": "svc"})


def test_the_longest_cooldown_stays_inside_datetime_range() -> None:
    from datetime import UTC, datetime, timedelta

    rule = parse_rule({"service": "svc", "threshold_ms": 1e6, "cooldown_sec": 365 * 86400})
    far = datetime(2100, 1, 1, tzinfo=UTC) + timedelta(seconds=rule.cooldown_sec)
    assert far.year == 2101


@pytest.mark.parametrize(
    ("allow", "host", "refused"),
    [
        ("", "payments", False),
        ("", "10.1.2.3", False),
        ("", "169.254.169.254", True),
        ("", "169.254.1.1", True),
        ("", "metadata.google.internal", True),
        ("", "METADATA.google.internal.", True),
        ("", "[fe80::1]", True),
        ("", "[fd00:ec2::254]", True),
        ("169.254.169.254/32", "169.254.169.254", False),
        ("payments, 10.0.0.0/8", "payments", False),
        ("payments, 10.0.0.0/8", "10.9.9.9", False),
        ("payments, 10.0.0.0/8", "11.0.0.1", True),
        ("payments, 10.0.0.0/8", "search", True),
    ],
)
def test_upstream_policy(allow: str, host: str, refused: bool) -> None:
    assert (
        UpstreamPolicy.parse(allow).refusal(parse_host(host.strip("[]"))) is not None
    ) is refused


@pytest.mark.parametrize("entry", ["a b", "x/y/z", "ho\x1bst"])
def test_a_bad_allow_list_entry_is_a_configuration_error(entry: str) -> None:
    with pytest.raises(ValueError):
        UpstreamPolicy.parse(entry)


@pytest.mark.parametrize("namespace", ["", "{x}", "a*", "a:b", "-a", "x" * 33, "a b"])
def test_a_redis_namespace_that_would_break_keys_is_refused(namespace: str) -> None:
    from pydantic import ValidationError

    from controlplane.kernel.settings import Settings

    with pytest.raises(ValidationError, match="Redis namespace"):
        Settings(redis_namespace=namespace)
    assert Settings(redis_namespace="canary-test_1").redis_namespace == "canary-test_1"
