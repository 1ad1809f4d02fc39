"""CANARY_ETCD / --etcd: the endpoint forms accepted, and every malformed one refused."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.etcd_endpoints import MAX_ENDPOINTS, parse_endpoints
from controlplane.kernel.settings import Settings


@pytest.mark.parametrize(
    ("text", "targets", "tls"),
    [
        ("127.0.0.1:2379", ["127.0.0.1:2379"], False),
        ("localhost:2379", ["127.0.0.1:2379"], False),
        ("etcd.canary.svc:2379", ["etcd.canary.svc:2379"], False),
        ("https://etcd.example.com:2379/", ["etcd.example.com:2379"], True),
        ("10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379",
         ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"], False),
        (" http://10.0.0.1:2379 , 10.0.0.2:2379 ", ["10.0.0.1:2379", "10.0.0.2:2379"], False),
        ("https://etcd-1.internal:2379,HTTPS://etcd-2.internal:2379",
         ["etcd-1.internal:2379", "etcd-2.internal:2379"], True),
        ("[::1]:2379", ["[::1]:2379"], False),
        ("[fd00::1]:2379,10.0.0.1:2379", ["[fd00::1]:2379", "10.0.0.1:2379"], False),
    ],
)
def test_accepted_forms_and_a_grpc_target_per_member(
    text: str, targets: list[str], tls: bool
) -> None:
    parsed = parse_endpoints(text)
    assert parsed.targets == tuple(f"dns:///{target}" for target in targets)
    assert parsed.tls is tls


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty etcd endpoint"),
        ("10.0.0.1:2379,", "empty etcd endpoint"),
        ("10.0.0.1", "expected host:port"),
        ("10.0.0.1:abc", "expected host:port"),
        ("10.0.0.1:0", "port must be 1-65535"),
        ("10.0.0.1:65536", "port must be 1-65535"),
        ("10.0.0.1:0002379", "expected host:port"),
        (":2379", "not a host name"),
        ("bad_host:2379", "not a host name"),
        ("a..b:2379", "not a host name"),
        ("etcd://10.0.0.1:2379", "expected host:port, http:// or https://"),
        ("http://10.0.0.1:2379/v3", "no path"),
        ("user@10.0.0.1:2379", "no path or user"),
        ("::1:2379", "write an IPv6 address as [address]:port"),
        ("[10.0.0.1]:2379", "brackets are for IPv6"),
        ("10.0.0.1:2379,http://10.0.0.1:2379", "listed twice"),
        ("https://10.0.0.1:2379,10.0.0.2:2379", "mix https:// and plain"),
        (",".join(f"10.0.0.{n}:2379" for n in range(MAX_ENDPOINTS + 1)), "at most"),
    ],
)
def test_malformed_endpoints_are_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace(".", r"\.")):
        parse_endpoints(text)


def test_the_settings_refuse_a_malformed_member_list_at_start_up() -> None:
    with pytest.raises(ValidationError, match="listed twice"):
        Settings(etcd="10.0.0.1:2379,10.0.0.1:2379")
    assert Settings(etcd="10.0.0.1:2379,10.0.0.2:2379").etcd == "10.0.0.1:2379,10.0.0.2:2379"
    assert Settings(etcd="memory://").etcd == "memory://"


@given(st.lists(st.tuples(st.ip_addresses(v=4), st.integers(1, 65535)), min_size=1,
                max_size=MAX_ENDPOINTS, unique=True))
def test_a_written_member_list_parses_back_to_the_same_members(
    members: list[tuple[IPv4Address, int]],
) -> None:
    text = ",".join(f"{host}:{port}" for host, port in members)
    assert parse_endpoints(text).members == tuple((str(h), p) for h, p in members)


@pytest.mark.parametrize(
    "text",
    ["etcd-0:2379,ETCD-0:2379", "etcd-0.:2379,etcd-0:2379", "[fd00:0::1]:2379,[fd00::1]:2379",
     "localhost:2379,127.0.0.1:2379"],
)
def test_one_member_spelt_two_ways_is_listed_twice(text: str) -> None:
    with pytest.raises(ConfigError, match="listed twice"):
        parse_endpoints(text)
