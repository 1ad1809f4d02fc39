"""The outbox on PostgreSQL and on SQLite, a fake clock, and a real receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controlplane.db import notifications as outbox
from controlplane.db.migrate import upgrade
from controlplane.experiments.events import EventKind
from controlplane.experiments.store import ExperimentRecord, ExperimentSpec, StepSpec
from controlplane.kernel.clock import FakeClock, utc_now
from controlplane.kernel.settings import Settings
from controlplane.notify.records import Format, SubscriptionRecord, SubscriptionSpec
from controlplane.runtime import Backends, open_backends
from tests.support.shared_databases import migrated_pg, pg_url, sqlite_url  # noqa: F401
from tests.support.webhooks import Receiver, receiving

SECRET = "whsec_test-secret-0123456789abcdefghijklmnop"


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    return url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        etcd="memory://",
        redis_url="memory://",
        public_url="https://canary.example.com",
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def backends(settings: Settings, clock: FakeClock) -> AsyncIterator[Backends]:
    opened = await open_backends(settings, clock=clock, streams=False)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def hook_url(receiver: Receiver) -> Iterator[str]:
    with receiving(receiver) as url:
        yield url


def spec(service: str = "checkout", name: str = "checkout v2") -> ExperimentSpec:
    return ExperimentSpec(
        name=name,
        service=service,
        baseline_upstream="http://127.0.0.1:9001",
        canary_upstream="http://127.0.0.1:9002",
        steps=(StepSpec(500, 30), StepSpec(2500, 60)),
        sticky_header="x-user-id",
        sticky_cookie=None,
        rule=None,
    )


async def subscribe(
    backends: Backends,
    url: str,
    *,
    name: str = "ops",
    service: str | None = None,
    kinds: tuple[str, ...] = (),
    fmt: Format = Format.JSON,
    enabled: bool = True,
) -> SubscriptionRecord:
    async with backends.database.transaction() as tx:
        return await tx.run(
            outbox.create_subscription,
            spec=SubscriptionSpec(name, url, service, kinds, fmt, enabled),
            secret=SECRET,
            created_by="tests",
            now=utc_now(backends.clock),
        )


async def new_experiment(backends: Backends, service: str = "checkout") -> ExperimentRecord:
    async with backends.store.transaction() as tx:
        return await tx.create_experiment(spec=spec(service), salt="s", now=utc_now(backends.clock))


async def announce(
    backends: Backends, experiment: ExperimentRecord, kind: str = "tripped", **payload: Any
) -> int:
    """Record one event of `experiment` (as the controller would); its id."""
    async with backends.store.transaction() as tx:
        event = await tx.append_event(
            experiment_id=experiment.id,
            service=experiment.service,
            at=utc_now(backends.clock),
            actor="controller",
            kind=EventKind(kind),
            from_state="closed",
            to_state="open",
            reason=f"{kind} for the test",
            payload=payload,
        )
    return event.id


def at(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock.now(), UTC)
