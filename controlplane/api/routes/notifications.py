"""/v1/notifications: webhook subscriptions (admins) and their deliveries (viewers).

A subscription's secret signs every request it receives; the API shows it once, in
the answer to the POST that created it (or generated it), and never again. Its URL
may itself be a credential (a Slack incoming webhook's path is), so listings show
only its origin; the full URL too is shown only at creation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Query, Response, status
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator

from controlplane.api.deps import ClockDep, DatabaseDep, Limit, Offset, SettingsDep
from controlplane.api.problems import problem_responses
from controlplane.api.schemas import Page
from controlplane.api.security import ActorDep, require
from controlplane.auth.roles import Role
from controlplane.db import notifications as records
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import FieldError, NotFound, ValidationFailed
from controlplane.kernel.settings import Settings
from controlplane.kernel.values import (
    SQL_ID_MAX,
    DisplayName,
    ServiceName,
    WebhookUrl,
    in_sql_range,
    unprintable,
)
from controlplane.notify.kinds import NOTIFIABLE_KINDS, TOPICS, expand
from controlplane.notify.payloads import render
from controlplane.notify.records import (
    DeliveryRecord,
    DeliveryStatus,
    Format,
    SubscriptionRecord,
    SubscriptionSpec,
)
from controlplane.notify.sample import sample_event
from controlplane.notify.sender import Outgoing, WebhookSender
from controlplane.notify.signing import SECRET_MAX_CHARS, SECRET_MIN_CHARS, new_secret

router = APIRouter(prefix="/v1/notifications", tags=["notifications"])
ADMIN, VIEWER = require(Role.ADMIN), require(Role.VIEWER)

NO_SUCH = {404: "no such subscription"}
MAX_KINDS = 64


def _secret_shape(value: str) -> str:
    if unprintable(value) is not None or any(c.isspace() for c in value):
        raise ValueError("must not contain spaces or control characters")
    return value


Secret = Annotated[
    str,
    Field(
        min_length=SECRET_MIN_CHARS,
        max_length=SECRET_MAX_CHARS,
        description="HMAC-SHA256 key (its UTF-8 bytes); never shown again",
    ),
    AfterValidator(_secret_shape),
]
KindName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        json_schema_extra={"enum": sorted(TOPICS.keys() | NOTIFIABLE_KINDS)},
    ),
]
Kinds = Annotated[
    list[KindName],
    Field(
        max_length=MAX_KINDS,
        description="event kinds or topics ("
        + ", ".join(sorted(TOPICS))
        + "); empty: every announced kind",
    ),
]


def _expanded(kinds: list[str]) -> list[str]:
    # a ValueError here names the unknown entry: pydantic reports it on the field
    return list(expand(kinds))


class SubscriptionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: DisplayName
    url: WebhookUrl
    service: ServiceName | None = Field(default=None, description="null: every service")
    kinds: Kinds = Field(default_factory=list)
    format: Format = Format.JSON
    enabled: StrictBool = True
    secret: Secret | None = Field(default=None, description="omitted: one is generated")

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, value: list[str]) -> list[str]:
        return _expanded(value)

    def to_spec(self) -> SubscriptionSpec:
        return SubscriptionSpec(
            self.name, self.url, self.service, tuple(self.kinds), self.format, self.enabled
        )


class SubscriptionUpdate(BaseModel):
    """A PATCH: the fields given replace the stored ones."""

    model_config = ConfigDict(extra="forbid")

    name: DisplayName | None = None
    url: WebhookUrl | None = None
    service: ServiceName | None = None
    kinds: Kinds | None = None
    format: Format | None = None
    enabled: StrictBool | None = None
    secret: Secret | None = Field(default=None, description="a new signing secret")

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _expanded(value)

    def apply(self, spec: SubscriptionSpec) -> SubscriptionSpec:
        given = self.model_fields_set
        return SubscriptionSpec(
            name=self.name if self.name is not None else spec.name,
            url=self.url if self.url is not None else spec.url,
            service=self.service if "service" in given else spec.service,
            kinds=tuple(self.kinds) if self.kinds is not None else spec.kinds,
            format=self.format if self.format is not None else spec.format,
            enabled=self.enabled if self.enabled is not None else spec.enabled,
        )


def url_origin(url: str) -> str:
    """The URL without its path: what listings show of a URL that may be a credential."""
    parts = urlsplit(url)
    rest = "/…" if parts.path not in ("", "/") else ""
    return f"{parts.scheme}://{parts.netloc}{rest}"


class SubscriptionPublic(BaseModel):
    id: int
    name: str
    url: str = Field(description="origin only (the path may be a credential)")
    service: str | None
    kinds: list[str] = Field(description="empty: every announced kind")
    format: Format
    enabled: bool
    created_at: datetime
    created_by: str
    updated_at: datetime

    @classmethod
    def of(cls, record: SubscriptionRecord) -> SubscriptionPublic:
        return cls(
            id=record.id, name=record.name, url=url_origin(record.url), service=record.service,
            kinds=list(record.kinds), format=record.format, enabled=record.enabled,
            created_at=record.created_at, created_by=record.created_by,
            updated_at=record.updated_at,
        )  # fmt: skip


class SubscriptionCreated(SubscriptionPublic):
    url: str = Field(description="the full URL: shown here once")
    secret: str = Field(description="the signing secret: shown here once, never again")


class DeliveryPublic(BaseModel):
    id: int
    subscription_id: int
    subscription_name: str
    event_id: int
    experiment_id: int | None
    service: str
    kind: str
    status: DeliveryStatus
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None = Field(description="while pending")
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    last_status: int | None = Field(description="the receiver's last HTTP status")
    last_error: str | None

    @classmethod
    def of(cls, record: DeliveryRecord) -> DeliveryPublic:
        return cls(**record.__dict__)


class TestOutcome(BaseModel):
    delivered: bool
    status: int | None = Field(description="the receiver's HTTP status, if it answered")
    error: str | None
    event_id: int = Field(description="0: a sample, never a real event")


SubscriptionId = Annotated[
    int,
    Path(description="subscription id", json_schema_extra={"minimum": 1, "maximum": SQL_ID_MAX}),
]


def _check_url(url: str, settings: Settings) -> None:
    refused = WebhookSender(policy=settings.notify_policy).refusal(url)
    if refused is not None:
        raise ValidationFailed("webhook URL not allowed", [FieldError(("body", "url"), refused)])


def _known(subscription_id: int) -> int:
    if not in_sql_range(subscription_id):
        raise NotFound(f"no subscription {subscription_id}")
    return subscription_id


@router.get(
    "/subscriptions",
    response_model=Page[SubscriptionPublic],
    responses=problem_responses(),
    dependencies=[ADMIN],
)
async def list_subscriptions(
    database: DatabaseDep, limit: Limit = 50, offset: Offset = 0
) -> Page[SubscriptionPublic]:
    """Subscriptions, oldest first (never their secrets)."""
    found, total = await database.read(records.list_subscriptions, limit=limit, offset=offset)
    return Page(
        items=[SubscriptionPublic.of(s) for s in found], total=total, limit=limit, offset=offset
    )


@router.post(
    "/subscriptions",
    status_code=status.HTTP_201_CREATED,
    response_model=SubscriptionCreated,
    responses=problem_responses(409, body=True, notes={409: "the name is taken"}),
    dependencies=[ADMIN],
)
async def create_subscription(
    body: SubscriptionCreate,
    response: Response,
    database: DatabaseDep,
    clock: ClockDep,
    actor: ActorDep,
    settings: SettingsDep,
) -> SubscriptionCreated:
    """Subscribe a webhook; the answer is the only place its secret is shown."""
    _check_url(body.url, settings)
    secret = body.secret or new_secret()
    async with database.transaction() as tx:
        created = await tx.run(
            records.create_subscription,
            spec=body.to_spec(),
            secret=secret,
            created_by=actor,
            now=utc_now(clock),
        )
    response.headers["Location"] = f"{router.prefix}/subscriptions/{created.id}"
    public = SubscriptionPublic.of(created).model_dump()
    public["url"] = created.url
    return SubscriptionCreated(**public, secret=secret)


@router.get(
    "/subscriptions/{subscription_id}",
    response_model=SubscriptionPublic,
    responses=problem_responses(notes=NO_SUCH),
    dependencies=[ADMIN],
)
async def get_subscription(
    subscription_id: SubscriptionId, database: DatabaseDep
) -> SubscriptionPublic:
    found = await database.read(records.get_subscription, subscription_id=_known(subscription_id))
    return SubscriptionPublic.of(found)


@router.patch(
    "/subscriptions/{subscription_id}",
    response_model=SubscriptionPublic,
    responses=problem_responses(409, body=True, notes=NO_SUCH),
    dependencies=[ADMIN],
)
async def update_subscription(
    subscription_id: SubscriptionId,
    body: SubscriptionUpdate,
    database: DatabaseDep,
    clock: ClockDep,
    settings: SettingsDep,
) -> SubscriptionPublic:
    """Change a subscription: the fields given replace the stored ones."""
    if body.url is not None:
        _check_url(body.url, settings)
    async with database.transaction() as tx:
        current = await tx.run(records.get_subscription, subscription_id=_known(subscription_id))
        updated = await tx.run(
            records.update_subscription,
            subscription_id=current.id,
            spec=body.apply(current.spec),
            now=utc_now(clock),
            secret=body.secret,
        )
    return SubscriptionPublic.of(updated)


@router.delete(
    "/subscriptions/{subscription_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(notes=NO_SUCH),
    dependencies=[ADMIN],
)
async def delete_subscription(subscription_id: SubscriptionId, database: DatabaseDep) -> None:
    """Delete a subscription and its deliveries (pending ones are not sent)."""
    async with database.transaction() as tx:
        await tx.run(records.delete_subscription, subscription_id=_known(subscription_id))


@router.post(
    "/subscriptions/{subscription_id}/test",
    response_model=TestOutcome,
    responses=problem_responses(body=True, notes=NO_SUCH),
    dependencies=[ADMIN],
)
async def test_subscription(
    subscription_id: SubscriptionId,
    database: DatabaseDep,
    clock: ClockDep,
    settings: SettingsDep,
) -> TestOutcome:
    """Send a sample notification now (not through the outbox, no retry) and say what
    the receiver answered."""
    found, secret = await database.read(
        records.subscription_secret, subscription_id=_known(subscription_id)
    )
    event = sample_event(utc_now(clock), service=found.service or "example-service")
    body = render(event, found.format, base_url=settings.dashboard_base_url)
    sender = WebhookSender(
        policy=settings.notify_policy,
        timeout_sec=settings.notify_timeout_sec,
        connect_timeout_sec=min(5.0, settings.notify_timeout_sec),
    )
    try:
        result = await sender.send(
            Outgoing(
                url=found.url, secret=secret, body=body, event_id=0, delivery_id=None, attempt=1
            ),
            timestamp=int(clock.now()),
        )
    finally:
        await sender.close()
    return TestOutcome(
        delivered=result.delivered,
        status=result.status,
        error=None if result.delivered else result.describe(),
        event_id=0,
    )


@router.get(
    "/deliveries",
    response_model=Page[DeliveryPublic],
    responses=problem_responses(),
    dependencies=[VIEWER],
)
async def list_deliveries(
    database: DatabaseDep,
    experiment: Annotated[
        int | None, Query(ge=1, le=SQL_ID_MAX, description="experiment id")
    ] = None,
    subscription: Annotated[
        int | None, Query(ge=1, le=SQL_ID_MAX, description="subscription id")
    ] = None,
    state: Annotated[DeliveryStatus | None, Query(alias="status")] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> Page[DeliveryPublic]:
    """Deliveries, newest first: what was sent where, how often, and what came of it."""
    query: dict[str, Any] = {
        "experiment_id": experiment,
        "subscription_id": subscription,
        "status": state,
        "limit": limit,
        "offset": offset,
    }
    found, total = await database.read(records.list_deliveries, **query)
    return Page(
        items=[DeliveryPublic.of(d) for d in found], total=total, limit=limit, offset=offset
    )
