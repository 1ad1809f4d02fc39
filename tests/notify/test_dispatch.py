"""The outbox and the dispatcher against a real receiver, on PostgreSQL and SQLite:
signatures verify, 500s are retried then delivered, deliveries are given up after
the maximum, nothing is lost when a dispatcher stops (or dies) with rows pending, and
each experiment's notifications arrive in order. The clock is fake: the tests step
the dispatcher round by round instead of waiting for backoff."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from controlplane.db import notifications as outbox
from controlplane.experiments.events import EventKind
from controlplane.kernel.clock import FakeClock, utc_now
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.settings import Settings
from controlplane.notify.backoff import RetryPolicy
from controlplane.notify.dispatcher import Dispatcher
from controlplane.notify.records import ClaimedDelivery, DeliveryRecord, DeliveryStatus, Format
from controlplane.notify.sender import WebhookSender
from controlplane.notify.signing import verify
from controlplane.runtime import Backends, open_backends
from tests.notify.conftest import SECRET, announce, new_experiment, subscribe
from tests.support.outage import until
from tests.support.webhooks import Receiver, free_port

POLICY = RetryPolicy(max_attempts=3, base_delay_sec=2.0, max_delay_sec=60.0, max_age_sec=3600.0)


def dispatcher(identity: str = "dispatcher-a", **overrides: object) -> Dispatcher:
    options: dict[str, object] = {
        "policy": POLICY,
        "sender": WebhookSender(timeout_sec=5.0),
        "identity": identity,
        "base_url": "https://canary.example.com",
        "rand": lambda: 0.0,
    }
    options.update(overrides)
    return Dispatcher(**options)  # type: ignore[arg-type]


async def deliveries(backends: Backends, **query: object) -> list[DeliveryRecord]:
    found, _ = await backends.database.read(outbox.list_deliveries, **query)
    return sorted(found, key=lambda d: d.id)


def event_ids(receiver: Receiver) -> list[int]:
    return [int(r.headers["x-canary-event-id"]) for r in receiver.received()]


async def test_a_delivery_is_signed_and_carries_the_event_and_its_link(
    backends: Backends, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    await subscribe(backends, hook_url)
    experiment = await new_experiment(backends)
    event_id = await announce(backends, experiment, evidence={"trips": 1})

    sender = dispatcher()
    assert await sender.run_once(backends) == 1

    [request] = receiver.received()
    assert verify(
        SECRET,
        timestamp=request.headers["x-canary-timestamp"],
        signature_value=request.headers["x-canary-signature"],
        body=request.body,
        now=clock.now(),
    )
    assert not verify(
        "whsec_some-other-secret-000000000000",
        body=request.body,
        timestamp=request.headers["x-canary-timestamp"],
        signature_value=request.headers["x-canary-signature"],
        now=clock.now(),
    )
    assert request.headers["x-canary-event-id"] == str(event_id)
    assert request.headers["content-type"] == "application/json"
    body = json.loads(request.body)
    assert body["event_id"] == event_id and body["kind"] == "tripped"
    assert body["topic"] == "trip" and body["service"] == "checkout"
    assert body["experiment"] == {"id": experiment.id, "name": "checkout v2"}
    assert body["evidence"] == {"evidence": {"trips": 1}}
    assert body["link"] == f"https://canary.example.com/ui/experiments/{experiment.id}"
    [done] = await deliveries(backends)
    assert (done.status, done.attempts, done.last_status) == (DeliveryStatus.DELIVERED, 1, 200)
    assert sender.stats.delivered == 1


async def test_500s_are_retried_with_backoff_then_delivered(
    backends: Backends, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    await subscribe(backends, hook_url)
    event_id = await announce(backends, await new_experiment(backends))
    receiver.answer(500, 503)
    sender = dispatcher()

    assert await sender.run_once(backends) == 1
    [first] = await deliveries(backends)
    assert (first.status, first.attempts, first.last_status) == (DeliveryStatus.PENDING, 1, 500)
    # half of the first delay (2 s) fixed, the random half 0 here
    assert first.next_attempt_at == utc_now(clock) + timedelta(seconds=1.0)
    # not due before its backoff (1 s after the first failure, 2 s after the second)
    assert await sender.run_once(backends) == 0
    clock.advance(1.0)
    assert await sender.run_once(backends) == 1
    clock.advance(1.5)
    assert await sender.run_once(backends) == 0
    clock.advance(0.5)
    assert await sender.run_once(backends) == 1

    assert event_ids(receiver) == [event_id] * 3
    assert [r.headers["x-canary-attempt"] for r in receiver.received()] == ["1", "2", "3"]
    [done] = await deliveries(backends)
    assert (done.status, done.attempts, done.last_status) == (DeliveryStatus.DELIVERED, 3, 200)
    assert (sender.stats.retried, sender.stats.delivered) == (2, 1)


async def test_a_delivery_is_given_up_after_the_maximum_and_the_next_one_follows(
    backends: Backends, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    await subscribe(backends, hook_url)
    experiment = await new_experiment(backends)
    doomed = await announce(backends, experiment, "tripped")
    after = await announce(backends, experiment, "half_open")
    receiver.answer(500, 500, 500)
    sender = dispatcher()
    for _ in range(POLICY.max_attempts):
        assert await sender.run_once(backends) == 1
        clock.advance(60.0)
    assert await sender.run_once(backends) == 1  # the next event of the experiment

    assert event_ids(receiver) == [doomed] * 3 + [after]
    failed, delivered = await deliveries(backends)
    assert (failed.status, failed.attempts) == (DeliveryStatus.FAILED, 3)
    assert failed.last_error == "gave up after 3 attempts; last: HTTP 500"
    assert delivered.status is DeliveryStatus.DELIVERED
    assert sender.stats.failed == 1
    listed = await deliveries(backends, status=DeliveryStatus.FAILED)
    assert [d.id for d in listed] == [failed.id]


async def test_an_unreachable_receiver_is_retried_and_named(
    backends: Backends, clock: FakeClock
) -> None:
    await subscribe(backends, f"http://127.0.0.1:{free_port()}/hook")
    await announce(backends, await new_experiment(backends))
    assert await dispatcher().run_once(backends) == 1
    [pending] = await deliveries(backends)
    assert pending.status is DeliveryStatus.PENDING and pending.last_status is None
    assert pending.last_error is not None and "Connect" in pending.last_error


async def test_each_experiment_is_announced_in_order_and_one_failing_holds_no_other(
    backends: Backends, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    await subscribe(backends, hook_url)
    slow, other = await new_experiment(backends, "checkout"), await new_experiment(backends, "cart")
    slow_events = [
        await announce(backends, slow, kind) for kind in ("tripped", "half_open", "probe_passed")
    ]
    other_events = [await announce(backends, other, kind) for kind in ("step_advanced", "promoted")]
    receiver.answer(500)  # the first request of the round: the slow experiment's first event
    sender = dispatcher(concurrency=1)

    rounds = 0
    while len(receiver.received()) < 6 and rounds < 10:
        await sender.run_once(backends)
        clock.advance(1.0)
        rounds += 1

    by_experiment: dict[int, list[int]] = {}
    for request in receiver.received():
        body = json.loads(request.body)
        by_experiment.setdefault(body["experiment"]["id"], []).append(body["event_id"])
    # the slow experiment's first event twice (500, then delivered), then the rest
    assert by_experiment[slow.id] == [slow_events[0], *slow_events]
    assert by_experiment[other.id] == other_events
    # the other experiment was not held back by the slow one's failure
    firsts = [json.loads(r.body)["event_id"] for r in receiver.received()[:2]]
    assert firsts == [slow_events[0], other_events[0]]


async def test_nothing_is_lost_when_a_dispatcher_stops_with_deliveries_pending(
    settings: Settings, backends: Backends, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    await subscribe(backends, hook_url)
    experiment = await new_experiment(backends)
    written = [
        await announce(backends, experiment, kind)
        for kind in ("tripped", "half_open", "probe_failed")
    ]
    receiver.answer(500)
    first = dispatcher("before-restart")
    await first.start(backends)
    await until(lambda: bool(receiver.received()), "the first attempt")
    await first.stop()  # pending rows stay; its leases are given back
    await backends.close()

    reopened = await open_backends(settings, clock=clock, streams=False)
    try:
        second = dispatcher("after-restart")
        for _ in range(6):
            clock.advance(5.0)
            await second.run_once(reopened)
        found = await deliveries(reopened)
    finally:
        await reopened.close()
    assert [d.status for d in found] == [DeliveryStatus.DELIVERED] * 3
    # the attempt in flight when it stopped is made again: at least once
    assert event_ids(receiver) == [written[0], *written]


async def test_a_lease_left_by_a_dead_dispatcher_runs_out_and_the_row_is_sent(
    backends: Backends, receiver: Receiver, hook_url: str, clock: FakeClock
) -> None:
    await subscribe(backends, hook_url)
    event_id = await announce(backends, await new_experiment(backends))
    now = utc_now(clock)
    async with backends.database.transaction() as tx:  # a dispatcher that then died
        [held] = await tx.run(
            outbox.claim_due,
            holder="dead",
            now=now,
            lease_until=now + timedelta(seconds=120),
            limit=10,
        )
    sender = dispatcher("alive")
    assert await sender.run_once(backends) == 0
    clock.advance(121.0)
    assert await sender.run_once(backends) == 1
    assert event_ids(receiver) == [event_id]
    # the dead one's late outcome is not written over the live one's
    async with backends.database.transaction() as tx:
        kept = await tx.run(
            outbox.record_attempt,
            delivery_id=held.delivery_id,
            holder="dead",
            at=utc_now(clock),
            status=DeliveryStatus.FAILED,
            http_status=None,
            error="late",
            next_attempt_at=None,
        )
    assert kept is False
    [done] = await deliveries(backends)
    assert done.status is DeliveryStatus.DELIVERED


async def test_two_dispatchers_never_send_the_same_delivery(
    backends: Backends, receiver: Receiver, hook_url: str
) -> None:
    await subscribe(backends, hook_url)
    for service in ("a", "b", "c", "d"):
        await announce(backends, await new_experiment(backends, service))
    one, two = dispatcher("one"), dispatcher("two")
    sent = await asyncio.gather(one.run_once(backends), two.run_once(backends))
    assert sum(sent) == 4
    assert sorted(event_ids(receiver)) == sorted(set(event_ids(receiver)))


async def test_an_event_rolled_back_is_never_announced(
    backends: Backends, receiver: Receiver, hook_url: str
) -> None:
    await subscribe(backends, hook_url)
    experiment = await new_experiment(backends)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with backends.store.transaction() as tx:
            await tx.append_event(
                experiment_id=experiment.id,
                service=experiment.service,
                at=utc_now(backends.clock),
                actor="t",
                kind=EventKind.TRIPPED,
            )
            raise Boom
    assert await deliveries(backends) == []
    assert await dispatcher().run_once(backends) == 0
    assert receiver.received() == []


async def test_subscriptions_choose_their_service_kinds_and_format(
    backends: Backends, receiver: Receiver, hook_url: str
) -> None:
    everything = await subscribe(backends, hook_url, name="all")
    trips = await subscribe(
        backends, hook_url, name="trips", service="checkout", kinds=("tripped",), fmt=Format.SLACK
    )
    await subscribe(backends, hook_url, name="off", enabled=False)
    checkout = await new_experiment(backends, "checkout")
    cart = await new_experiment(backends, "cart")
    await announce(backends, checkout, "tripped")
    await announce(backends, checkout, "step_advanced")
    await announce(backends, cart, "tripped")
    await announce(backends, cart, "created")  # not an announced kind

    found = await deliveries(backends)
    assert sorted((d.subscription_name, d.service, d.kind) for d in found) == [
        ("all", "cart", "tripped"),
        ("all", "checkout", "step_advanced"),
        ("all", "checkout", "tripped"),
        ("trips", "checkout", "tripped"),
    ]
    await dispatcher().run_once(backends)
    slack = [json.loads(r.body) for r in receiver.received() if "blocks" in json.loads(r.body)]
    assert len(slack) == 1 and slack[0]["text"].startswith("checkout: experiment")
    assert {d.subscription_id for d in found} == {everything.id, trips.id}


class FirstFails(Dispatcher):
    """The round's first delivery fails at once (its outcome could not be recorded: a
    database blip); the others wait for `release`."""

    def prepare(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.finished: list[int] = []
        self.failed: int | None = None

    async def _deliver(self, backends: Backends, delivery: ClaimedDelivery) -> None:
        if self.failed is None:
            self.failed = delivery.delivery_id
            raise BackendUnavailable("database unavailable")
        self.holding.set()
        await self.release.wait()
        self.finished.append(delivery.delivery_id)


async def test_a_round_ends_only_after_every_delivery_even_when_one_failed(
    backends: Backends, hook_url: str
) -> None:
    await subscribe(backends, hook_url)
    for service in ("checkout", "cart"):  # one event each: both claimed in one round
        await announce(backends, await new_experiment(backends, service), "tripped")
    sender = FirstFails(
        policy=POLICY, sender=WebhookSender(timeout_sec=5.0), identity="a",
        base_url="https://canary.example.com", rand=lambda: 0.0,
    )  # fmt: skip
    sender.prepare()
    round_ = asyncio.create_task(sender.run_once(backends))
    await asyncio.wait_for(sender.holding.wait(), timeout=30)  # a hang guard
    for _ in range(20):  # however often the loop runs, the round waits for the other
        await asyncio.sleep(0)
    assert sender.failed is not None and not round_.done()
    sender.release.set()
    with pytest.raises(BackendUnavailable):
        await round_
    assert len(sender.finished) == 1  # the other delivery ran to its end, not orphaned


@pytest.mark.parametrize(
    ("public_url", "link"),
    [
        (
            "https://canary.example.com/",
            "<https://canary.example.com/ui/experiments/{id}|Open in canary>",
        ),
        ("", None),
    ],
)
async def test_a_slack_delivery_says_the_trip_in_words_and_links_only_to_the_public_url(
    backends: Backends, receiver: Receiver, hook_url: str, public_url: str, link: str | None
) -> None:
    """The link is CANARY_PUBLIC_URL's; without it there is none, whatever the CLI's
    `api` setting says (it named 127.0.0.1 while the API was elsewhere)."""
    from controlplane.notify.dispatcher import dispatcher_for

    await subscribe(backends, hook_url, fmt=Format.SLACK)
    experiment = await new_experiment(backends)
    evidence = {
        "at": 1_800_000_000.0, "trips": 2,
        "weights": {"canary_bp_before": 2500, "canary_bp_after": 0},
        "rule": {"percentile": 95, "threshold_ms": 200, "max_trips": 3, "cooldown_sec": 30,
                 "half_open_weight": 100, "failure_ratio": 0.05},
        "window": {
            "variants": {
                "canary": {"count": 75, "failures": 9, "failure_ratio": 0.12,
                           "percentile_ms": 150.0, "window_start": 1_799_999_990.0,
                           "window_end": 1_800_000_000.0},
                "baseline": {"count": 270, "failures": 3, "failure_ratio": 3 / 270},
            },
            "guardrails": {
                "failures": {"basis": "ratio_and_binomial_vs_bound", "observed": 0.12,
                             "bound": 0.05, "exceeded": True, "breached": True},
            },
        },
    }
    await announce(backends, experiment, evidence=evidence)
    settings = Settings(api="http://127.0.0.1:8080", public_url=public_url, etcd="memory://")
    sender = dispatcher_for(settings)
    sender.rand = lambda: 0.0
    try:
        assert await sender.run_once(backends) == 1
    finally:
        await sender.sender.close()

    [request] = receiver.received()
    message = json.loads(request.body)
    said = (
        "tripped (trip 2 of 3): canary failures 12.0% (9/75) &gt; bound 5.0% over the last "
        "10 s; baseline 1.1% (3/270); canary cut to 0%, probed again at 1% from "
        "2027-01-15T08:00:30Z"
    )
    assert message["blocks"][1]["text"]["text"] == said
    assert message["text"].endswith(said)
    context = message["blocks"][-1]["elements"][0]["text"]
    assert "127.0.0.1" not in request.body.decode()
    if link is None:
        assert context.startswith("no dashboard link: CANARY_PUBLIC_URL is not set")
    else:
        assert context.startswith(link.format(id=experiment.id))
