"""Webhooks are judged on the address the socket connects to, not the URL's text: a
name that resolves (or later rebinds) to a metadata address is refused at send time
and recorded as a failed attempt, while the same name resolving to a permitted
address is delivered, with its own Host header. Any error while sending is a
recorded, retried attempt: no delivery stays pending with no attempt. A real
dispatcher, the real outbox (PostgreSQL and SQLite), a real receiver on loopback;
the resolver is the one edge the tests own."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trustme
from hypothesis import given, settings

from controlplane.db import notifications as outbox
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.hosts import IPAddress
from controlplane.kernel.values import split_upstream
from controlplane.notify.backoff import RetryPolicy
from controlplane.notify.connect import Resolver
from controlplane.notify.dispatcher import Dispatcher
from controlplane.notify.records import DeliveryRecord, DeliveryStatus
from controlplane.notify.sender import Outgoing, WebhookSender, sendable_url
from controlplane.runtime import Backends
from tests.notify.conftest import SECRET, announce, new_experiment, subscribe
from tests.support.host_spellings import URL_TEXTS
from tests.support.webhooks import Receiver, receiving

POLICY = RetryPolicy(max_attempts=3, base_delay_sec=2.0, max_delay_sec=60.0, max_age_sec=3600.0)
METADATA = ipaddress.ip_address("169.254.169.254")
LOOPBACK = ipaddress.ip_address("127.0.0.1")


class Names:
    """A resolver whose answers the test sets (and changes, as a rebinding DNS server
    would); IP literals resolve to themselves, as getaddrinfo's do."""

    def __init__(self, **answers: Sequence[IPAddress]) -> None:
        self.answers = {name.replace("_", "."): list(found) for name, found in answers.items()}
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append(host)
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


class BrokenResolver:
    """A resolver failing in a way nobody planned for."""

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        raise RuntimeError("resolver state corrupted")


@pytest.fixture
async def dispatcher() -> AsyncIterator[Callable[[Resolver], Dispatcher]]:
    made: list[Dispatcher] = []

    def make(resolve: Resolver) -> Dispatcher:
        made.append(
            Dispatcher(
                policy=POLICY,
                sender=WebhookSender(timeout_sec=5.0, resolve=resolve),
                identity="dispatcher-a",
                base_url="https://canary.example.com",
                rand=lambda: 0.0,
            )
        )
        return made[-1]

    yield make
    for one in made:
        await one.sender.close()


def named(hook_url: str, name: str) -> str:
    """The receiver's URL with its address replaced by `name`."""
    parts = urlsplit(hook_url)
    return f"http://{name}:{parts.port}{parts.path}"


async def only_delivery(backends: Backends) -> DeliveryRecord:
    [delivery] = (await backends.database.read(outbox.list_deliveries))[0]
    return delivery


async def test_a_name_resolving_to_a_metadata_address_is_refused_at_send_time(
    backends: Backends,
    receiver: Receiver,
    hook_url: str,
    dispatcher: Callable[[Resolver], Dispatcher],
) -> None:
    names = Names(hooks_test=[METADATA])
    await subscribe(backends, named(hook_url, "hooks.test"))
    await announce(backends, await new_experiment(backends))
    sender = dispatcher(names)

    assert await sender.run_once(backends) == 1

    failed = await only_delivery(backends)
    assert (failed.status, failed.attempts, failed.last_status) == (
        DeliveryStatus.PENDING,
        1,
        None,
    )
    assert failed.last_error == (
        "not sent: webhook host resolves to a link-local or cloud metadata address "
        "(169.254.169.254)"
    )
    assert failed.next_attempt_at is not None  # retried: the name may be fixed
    assert names.asked == ["hooks.test"] and receiver.received() == []
    assert (sender.stats.attempts, sender.stats.refused) == (1, 1)


async def test_one_blocked_address_among_a_name_s_answers_refuses_the_name(
    backends: Backends,
    receiver: Receiver,
    hook_url: str,
    dispatcher: Callable[[Resolver], Dispatcher],
) -> None:
    # the permitted address is the live receiver: nothing reaches it either
    names = Names(hooks_test=[LOOPBACK, ipaddress.ip_address("fe80::1")])
    await subscribe(backends, named(hook_url, "hooks.test"))
    await announce(backends, await new_experiment(backends))

    await dispatcher(names).run_once(backends)

    failed = await only_delivery(backends)
    assert failed.last_error is not None and failed.last_error.endswith("(fe80::1)")
    assert receiver.received() == []


async def test_a_name_rebound_to_a_metadata_address_after_a_delivery_is_refused(
    backends: Backends,
    receiver: Receiver,
    hook_url: str,
    clock: FakeClock,
    dispatcher: Callable[[Resolver], Dispatcher],
) -> None:
    names = Names(hooks_test=[LOOPBACK])
    await subscribe(backends, named(hook_url, "hooks.test"))
    experiment = await new_experiment(backends)
    sender = dispatcher(names)

    await announce(backends, experiment)
    assert await sender.run_once(backends) == 1
    [request] = receiver.received()
    port = urlsplit(hook_url).port
    assert request.headers["host"] == f"hooks.test:{port}"  # the name, not the address

    mapped = ipaddress.ip_address("::ffff:169.254.169.254")
    names.answers["hooks.test"] = [mapped]
    await sender.sender.close()  # a new connection: nothing pooled carries the old answer
    await announce(backends, experiment, kind="promoted")
    assert await sender.run_once(backends) == 1

    found, _ = await backends.database.read(outbox.list_deliveries)
    by_kind = {d.kind: d for d in found}
    assert by_kind["tripped"].status is DeliveryStatus.DELIVERED
    refused = by_kind["promoted"]
    assert (refused.status, refused.attempts) == (DeliveryStatus.PENDING, 1)
    assert refused.last_error is not None and f"({mapped})" in refused.last_error
    assert len(receiver.received()) == 1


async def test_a_permitted_name_is_delivered_to_the_address_it_resolves_to(
    backends: Backends,
    receiver: Receiver,
    hook_url: str,
    dispatcher: Callable[[Resolver], Dispatcher],
) -> None:
    names = Names(hooks_test=[LOOPBACK])
    await subscribe(backends, named(hook_url, "hooks.test"))
    await announce(backends, await new_experiment(backends))

    await dispatcher(names).run_once(backends)

    delivered = await only_delivery(backends)
    assert (delivered.status, delivered.last_status) == (DeliveryStatus.DELIVERED, 200)
    assert len(receiver.received()) == 1


async def test_a_url_stored_in_another_spelling_is_a_recorded_failed_attempt(
    backends: Backends, clock: FakeClock, dispatcher: Callable[[Resolver], Dispatcher]
) -> None:
    # written before hosts were parsed strictly: the HTTP client cannot parse it at all
    await subscribe(backends, "http://0251.0376.0251.0376/hook")
    await announce(backends, await new_experiment(backends))
    names = Names()
    sender = dispatcher(names)

    for _ in range(POLICY.max_attempts):
        assert await sender.run_once(backends) == 1
        clock.advance(POLICY.max_delay_sec)

    failed = await only_delivery(backends)
    assert (failed.status, failed.attempts) == (DeliveryStatus.FAILED, POLICY.max_attempts)
    assert failed.last_error is not None and "write it as 169.254.169.254" in failed.last_error
    assert names.asked == [] and sender.stats.errors == 0
    assert sender.stats.refused == POLICY.max_attempts


async def test_any_error_while_sending_is_a_recorded_attempt_retried_with_backoff(
    backends: Backends,
    clock: FakeClock,
    hook_url: str,
    dispatcher: Callable[[Resolver], Dispatcher],
) -> None:
    await subscribe(backends, named(hook_url, "hooks.test"))
    await announce(backends, await new_experiment(backends))
    sender = dispatcher(BrokenResolver())

    assert await sender.run_once(backends) == 1

    pending = await only_delivery(backends)
    assert (pending.status, pending.attempts) == (DeliveryStatus.PENDING, 1)
    assert pending.last_error == "RuntimeError: resolver state corrupted"
    assert pending.next_attempt_at is not None and sender.stats.refused == 0
    assert await sender.run_once(backends) == 0  # not due before its backoff
    clock.advance(POLICY.max_delay_sec)
    assert await sender.run_once(backends) == 1
    assert (await only_delivery(backends)).attempts == 2


async def test_the_sender_never_raises_whatever_the_url(backends: Backends) -> None:
    sender = WebhookSender(timeout_sec=2.0, resolve=Names())
    try:
        for url in ("http://0251.0376.0251.0376/", "http://[fe80::1%25eth0]/", "not a url"):
            result = await sender.send(
                Outgoing(url, SECRET, b"{}", event_id=0, delivery_id=None, attempt=1),
                timestamp=0,
            )
            assert not result.delivered and result.error is not None
            assert result.error.startswith("not sent: ")
    finally:
        await sender.close()


async def test_over_tls_the_checked_address_is_dialled_under_the_url_s_name(
    backends: Backends,
    receiver: Receiver,
    dispatcher: Callable[[Resolver], Dispatcher],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the certificate names only hooks.test: the handshake verifies only if the server
    # name sent is the URL's, while the socket goes to the address the resolver gave
    ca = trustme.CA()
    issued = ca.issue_cert("hooks.test")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    for blob in issued.cert_chain_pems:
        blob.write_to_path(str(cert), append=True)
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    names = Names(hooks_test=[LOOPBACK])
    with receiving(receiver, certfile=str(cert), keyfile=str(key)) as url:
        await subscribe(backends, named(url, "hooks.test").replace("http://", "https://"))
        await announce(backends, await new_experiment(backends))
        await dispatcher(names).run_once(backends)

    delivered = await only_delivery(backends)
    assert (delivered.status, delivered.last_status) == (DeliveryStatus.DELIVERED, 200)
    [request] = receiver.received()
    assert request.headers["host"] == f"hooks.test:{urlsplit(url).port}"


@settings(max_examples=400, deadline=None)
@given(URL_TEXTS)
def test_a_url_the_api_accepts_is_one_the_sender_can_send(url: str) -> None:
    try:
        host = split_upstream(url).host
    except ValueError:
        return
    parsed_host, parsed = sendable_url(url)  # raises if the HTTP client reads it otherwise
    assert parsed_host == host
    httpx.Request("POST", parsed)
