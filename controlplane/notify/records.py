"""What the notification parts exchange: frozen records, never ORM rows.

Stored by controlplane.db.notifications; the outbox is the `notification_deliveries`
table, one row per (event, subscription) written in the event's own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class Format(StrEnum):
    JSON = "json"
    SLACK = "slack"


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


@dataclass(frozen=True)
class SubscriptionSpec:
    """What an admin defines; `kinds` empty means every announced kind."""

    name: str
    url: str
    service: str | None
    kinds: tuple[str, ...]
    format: Format
    enabled: bool


@dataclass(frozen=True)
class SubscriptionRecord:
    id: int
    name: str
    url: str
    service: str | None
    kinds: tuple[str, ...]
    format: Format
    enabled: bool
    created_at: datetime
    created_by: str
    updated_at: datetime

    @property
    def spec(self) -> SubscriptionSpec:
        return SubscriptionSpec(
            self.name, self.url, self.service, self.kinds, self.format, self.enabled
        )


@dataclass(frozen=True)
class AnnouncedEvent:
    """An event as a notification tells it."""

    event_id: int
    kind: str
    service: str
    experiment_id: int | None
    experiment_name: str | None
    at: datetime
    actor: str
    from_state: str | None
    to_state: str | None
    reason: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class DeliveryRecord:
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
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    last_status: int | None
    last_error: str | None


@dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery this dispatcher holds the lease of, with what it needs to send it."""

    delivery_id: int
    attempts: int
    created_at: datetime
    url: str
    secret: str
    format: Format
    event: AnnouncedEvent
