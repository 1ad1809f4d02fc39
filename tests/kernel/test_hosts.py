"""Hosts are read the way resolvers read them: every other spelling of an address is
refused naming the canonical one, and the metadata guard judges what is reached."""

from __future__ import annotations

import ipaddress
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.hosts import carried_ipv4, inet_aton, parse_host
from controlplane.kernel.values import UpstreamPolicy, is_metadata_address, split_upstream
from tests.support.host_spellings import METADATA_URLS, NOT_HOSTS, OTHER_SPELLINGS

# still accepted: canonical addresses and names, judged only by the policy
ACCEPTED = [
    ("http://payments-v2:8080", "payments-v2", None),
    ("http://Payments.Internal.:8080", "payments.internal.", None),
    ("http://my_service", "my_service", None),
    ("http://xn--bcher-kva.example", "xn--bcher-kva.example", None),
    ("http://1password.example", "1password.example", None),
    ("http://10.0.0.7:9000", "10.0.0.7", "10.0.0.7"),
    ("http://127.0.0.1:9", "127.0.0.1", "127.0.0.1"),
    ("http://0.0.0.0:9", "0.0.0.0", "0.0.0.0"),
    ("http://[2001:DB8::1]:80", "2001:db8::1", "2001:db8::1"),
    ("http://[::1]:8080", "::1", "::1"),
]


@pytest.mark.parametrize(("url", "canonical"), OTHER_SPELLINGS)
def test_another_spelling_of_an_address_is_refused_naming_the_canonical_one(
    url: str, canonical: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"write it as {canonical}") + "$"):
        split_upstream(url)


@pytest.mark.parametrize(("url", "says"), NOT_HOSTS)
def test_hosts_no_resolver_reads_as_one_thing_are_refused(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        split_upstream(url)


@pytest.mark.parametrize(("url", "name", "address"), ACCEPTED)
def test_canonical_addresses_and_names_are_accepted(
    url: str, name: str, address: str | None
) -> None:
    host = split_upstream(url).host
    assert host.name == name
    assert host.address == (None if address is None else ipaddress.ip_address(address))
    assert UpstreamPolicy().refusal(host) is None


@pytest.mark.parametrize("url", METADATA_URLS)
def test_metadata_addresses_are_refused_also_when_an_ipv6_address_carries_them(url: str) -> None:
    reason = UpstreamPolicy().refusal(split_upstream(url).host)
    assert reason == "upstream host is a link-local or cloud metadata address"


def test_an_explicit_allow_list_entry_still_admits_a_metadata_address() -> None:
    policy = UpstreamPolicy.parse("169.254.169.254/32")
    assert policy.refusal(parse_host("169.254.169.254")) is None
    assert policy.refusal(parse_host("64:ff9b::a9fe:a9fe")) is not None


def test_an_allow_list_entry_in_another_spelling_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match=re.escape("write it as 169.254.169.254")):
        UpstreamPolicy.parse("payments, 0xa9fea9fe")
    assert UpstreamPolicy.parse("Payments.").hosts == frozenset({"payments"})


@pytest.mark.parametrize(
    ("address", "carried"),
    [
        ("::ffff:169.254.169.254", ["169.254.169.254"]),
        ("::169.254.169.254", ["169.254.169.254"]),
        ("64:ff9b::a9fe:a9fe", ["169.254.169.254"]),
        ("64:ff9b:1::a9fe:a9fe", ["169.254.169.254"]),
        ("::ffff:0:a9fe:a9fe", ["169.254.169.254"]),
        ("2002:a9fe:a9fe::", ["169.254.169.254"]),
        ("2001:0:4136:e378:8000:63bf:5601:5601", ["169.254.169.254"]),  # Teredo client
        ("::1", []),
        ("::", []),
        ("2001:db8::1", []),
        ("10.0.0.1", []),
    ],
)
def test_the_ipv4_addresses_an_ipv6_address_reaches(address: str, carried: list[str]) -> None:
    assert [str(a) for a in carried_ipv4(ipaddress.ip_address(address))] == carried
    assert is_metadata_address(ipaddress.ip_address(address)) is bool(carried)


def _spell(number: int, radix: str) -> str:
    if radix == "x":
        return hex(number)
    if radix == "o":
        return "0" + format(number, "o")
    return str(number)


@st.composite
def inet_aton_spellings(draw: st.DrawFn) -> tuple[str, ipaddress.IPv4Address]:
    """An address and one of the 1-4 part forms inet_aton reads it from, each part in
    decimal, octal or hex."""
    address = ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1)))
    octets = address.packed
    count = draw(st.integers(1, 4))
    head = list(octets[: count - 1])
    tail = int.from_bytes(octets[count - 1 :], "big")
    parts = [*head, tail]
    radixes = draw(st.lists(st.sampled_from("dox"), min_size=count, max_size=count))
    return ".".join(_spell(p, r) for p, r in zip(parts, radixes, strict=True)), address


@settings(max_examples=500, deadline=None)
@given(inet_aton_spellings())
def test_our_reading_of_a_numeric_host_is_the_c_library_s(
    spelled: tuple[str, ipaddress.IPv4Address],
) -> None:
    text, address = spelled
    assert socket.inet_aton(text) == address.packed  # the resolver's own reading
    assert inet_aton(text.split(".")) == address
    if text == str(address):
        assert parse_host(text).address == address
    else:
        with pytest.raises(ValueError, match=re.escape(f"write it as {address}") + "$"):
            parse_host(text)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9a-fA-Fx.]{1,24}\Z"))
def test_a_host_we_accept_is_read_by_the_c_library_as_we_read_it(text: str) -> None:
    try:
        host = parse_host(text)
    except ValueError:
        return
    if host.address is not None:
        assert socket.inet_aton(text) == host.address.packed
    else:  # a name is never an address to the resolver
        with pytest.raises(OSError):
            socket.inet_aton(text)
