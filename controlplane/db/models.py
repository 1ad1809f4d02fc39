"""Typed ORM models: experiments, their variants and steps, the desired route, breaker
rule, overload protection, stable version and release history of each service, the
events audit trail, the plots' history (windows and provider metrics), the API
tokens, and webhook subscriptions with the outbox of their deliveries.

The migrations in migrations/versions must describe exactly these tables; a test
compares them with Alembic's autogenerate.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    REAL,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Stable constraint names, so migrations can refer to them on every backend.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# States in which an experiment owns its service's route (at most one per service).
ACTIVE_STATES = ("running", "paused")
EXPERIMENT_STATES = ("draft", "running", "paused", "promoted", "rolled_back", "aborted")
BREAKER_STATES = ("closed", "open", "half_open")
CONFIG_KINDS = ("rule", "overload")  # kernel.service_configs.ConfigKind


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    SQLite keeps no zone, so values come back naive; they are UTC by construction.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: store UTC-aware timestamps only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{v}'" for v in values)
    return f"{column} IN ({quoted})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, dict[str, Any]: JSON}


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (
        CheckConstraint(_in("state", EXPERIMENT_STATES), name="state"),
        CheckConstraint(_in("breaker_state", BREAKER_STATES), name="breaker_state"),
        # Enforced by the database, so two concurrent starts cannot both win.
        Index(
            "uq_experiments_active_service",
            "service",
            unique=True,
            postgresql_where=text(_in("state", ACTIVE_STATES)),
            sqlite_where=text(_in("state", ACTIVE_STATES)),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    service: Mapped[str] = mapped_column(String(63), index=True)
    state: Mapped[str] = mapped_column(String(16), default="draft", index=True)
    salt: Mapped[str] = mapped_column(String(64))
    sticky_header: Mapped[str | None] = mapped_column(String(128))
    sticky_cookie: Mapped[str | None] = mapped_column(String(128))
    rule: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the baseline was left out: the start takes the service's stable version
    baseline_follows_stable: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    current_step: Mapped[int] = mapped_column(Integer, default=-1)
    canary_weight_bp: Mapped[int] = mapped_column(Integer, default=0)
    breaker_state: Mapped[str] = mapped_column(String(16), default="closed")
    trips: Mapped[int] = mapped_column(Integer, default=0)
    step_started_at: Mapped[datetime | None]
    breaker_changed_at: Mapped[datetime | None]
    route_revision: Mapped[int] = mapped_column(Integer, default=0)
    # the controller's memory between evaluations (decision.model.RolloutState)
    rollout_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # Optimistic concurrency: an UPDATE based on a stale read matches no row.
    version: Mapped[int] = mapped_column(Integer, default=1)

    variants: Mapped[list[Variant]] = relationship(
        back_populates="experiment",
        cascade="all, delete-orphan",
        order_by="Variant.name",
        lazy="selectin",
    )
    steps: Mapped[list[StepRow]] = relationship(
        back_populates="experiment",
        cascade="all, delete-orphan",
        order_by="StepRow.position",
        lazy="selectin",
    )
    # the step's evidence part of `rollout_state`, written only when it changes
    # (experiments.memory_parts, decision 0068)
    evidence: Mapped[RolloutEvidence | None] = relationship(
        back_populates="experiment",
        cascade="all, delete-orphan",
        lazy="selectin",
    )

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012 (SQLAlchemy declares it)

    def upstream_of(self, name: str) -> str:
        return next(v.upstream for v in self.variants if v.name == name)

    def version_of(self, name: str) -> str | None:
        return next(v.version for v in self.variants if v.name == name)


class Variant(Base):
    __tablename__ = "variants"
    __table_args__ = (UniqueConstraint("experiment_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(64))
    upstream: Mapped[str] = mapped_column(String(2048))
    # the release's label (kernel.values.VersionLabel); null: unlabelled
    version: Mapped[str | None] = mapped_column(String(64))

    experiment: Mapped[Experiment] = relationship(back_populates="variants")


class RolloutEvidence(Base):
    """The step's evidence of an experiment's rollout memory (the tallies and the ramp's
    ledger): up to ~240 KB that change once a window, kept apart from the few fields
    every look rewrites (decision 0068)."""

    __tablename__ = "rollout_evidence"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    body: Mapped[dict[str, Any]] = mapped_column(JSON)

    experiment: Mapped[Experiment] = relationship(back_populates="evidence")


class StepRow(Base):
    """One step of an experiment's schedule, as stored (decision.model.Step is the value)."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("experiment_id", "position"),
        CheckConstraint("weight_bp > 0 AND weight_bp <= 10000", name="weight_bp"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    weight_bp: Mapped[int] = mapped_column(Integer)
    hold_sec: Mapped[int] = mapped_column(Integer)

    experiment: Mapped[Experiment] = relationship(back_populates="steps")


class Event(Base):
    """One row of the audit trail: who changed what, when, why, and on which numbers."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_service_at", "service", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Null for service-level events (rule changes); kept when a draft is deleted.
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id", ondelete="SET NULL"), index=True
    )
    service: Mapped[str] = mapped_column(String(63))
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(64))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ServiceRoute(Base):
    """A service's desired route (architecture §4): the one truth about its traffic.

    Every change of traffic (an API action, a controller decision) commits it here and
    nothing else; the elected leader makes the route in etcd equal to it
    (controller.reconciler). `route` is the whole route document, `revision` its
    revision: it only grows, and an update based on a stale read matches no row.
    """

    __tablename__ = "service_routes"

    service: Mapped[str] = mapped_column(String(63), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    route: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime]

    # the application sets each new revision itself (previous + 1)
    __mapper_args__ = {  # noqa: RUF012 (SQLAlchemy declares it)
        "version_id_col": revision,
        "version_id_generator": False,
    }


class DesiredConfig(Base):
    """A service's desired breaker rule or overload protection (kernel.service_configs),
    as `route` is its desired route: the API commits it with its audit event, the
    elected leader makes etcd hold it. `document` is the JSON published; `version`
    grows with each write, so an update based on a stale read matches no row.
    """

    __tablename__ = "service_configs"
    __table_args__ = (CheckConstraint(_in("kind", CONFIG_KINDS), name="kind"),)

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    service: Mapped[str] = mapped_column(String(63), primary_key=True)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime]

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012 (SQLAlchemy declares it)


RELEASE_KINDS = ("seeded", "rebased", "promoted", "rolled_back", "aborted")


class StableVersion(Base):
    """A service's stable version (experiments.releases): what serves it when no
    experiment runs, and the baseline a new experiment takes by default. Written in
    the transaction that commits the route putting it in force; `version` grows with
    each write, so an update based on a stale read matches no row.
    """

    __tablename__ = "stable_versions"

    service: Mapped[str] = mapped_column(String(63), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(2048))
    label: Mapped[str | None] = mapped_column(String(64))
    # the experiment that made it stable; null once that experiment is gone
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id", ondelete="SET NULL")
    )
    since: Mapped[datetime]
    version: Mapped[int] = mapped_column(Integer)

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012 (SQLAlchemy declares it)


class Release(Base):
    """One entry of a service's release history: the stable version before and after
    an experiment's start (seeded, rebased), its promotion, or its rollback or abort
    (the stable version unchanged, recorded all the same)."""

    __tablename__ = "releases"
    __table_args__ = (
        CheckConstraint(_in("kind", RELEASE_KINDS), name="kind"),
        Index("ix_releases_service_id", "service", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service: Mapped[str] = mapped_column(String(63))
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(16))
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id", ondelete="SET NULL"), index=True
    )
    from_upstream: Mapped[str | None] = mapped_column(String(2048))
    from_label: Mapped[str | None] = mapped_column(String(64))
    to_upstream: Mapped[str] = mapped_column(String(2048))
    to_label: Mapped[str | None] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")


class EtcdImport(Base):
    """That the configs etcd held before SQL kept them were imported (once, by the
    first leader of a release that keeps them): `kind` is a config kind."""

    __tablename__ = "etcd_imports"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    at: Mapped[datetime]
    imported: Mapped[int] = mapped_column(Integer)
    skipped: Mapped[int] = mapped_column(Integer)


class ControllerShard(Base):
    """Who judges a shard of the experiments (decision 0057): the fence of its owner,
    the create revision of the owner's key in etcd. A replica that claims a shard
    raises `fence`; a decision commits only with the shard's row at the decider's own
    fence, so a replica that lost the shard can no longer commit for it."""

    __tablename__ = "controller_shards"

    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    fence: Mapped[int] = mapped_column(BigInteger)
    owner: Mapped[str] = mapped_column(String(253))
    held_since: Mapped[datetime]


class HistoryPoint(Base):
    """One second (or, merged, `span_sec` seconds) of an experiment's windows as the
    controller judged them, for the dashboard's plots (controlplane.history).

    Both variants on one row (an experiment has exactly two), `b_` the baseline and
    `c_` the canary; 4-byte floats are ample for plotted milliseconds and ratios.
    """

    __tablename__ = "history_points"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    at: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch second
    span_sec: Mapped[int] = mapped_column(Integer)
    window_sec: Mapped[int] = mapped_column(Integer)
    canary_weight_bp: Mapped[int] = mapped_column(Integer)
    threshold_ms: Mapped[float | None] = mapped_column(REAL)
    failure_bound: Mapped[float | None] = mapped_column(REAL)
    b_count: Mapped[int] = mapped_column(BigInteger)
    b_rps: Mapped[float] = mapped_column(REAL)
    b_failure_ratio: Mapped[float] = mapped_column(REAL)
    b_p50_ms: Mapped[float | None] = mapped_column(REAL)
    b_p95_ms: Mapped[float | None] = mapped_column(REAL)
    b_p99_ms: Mapped[float | None] = mapped_column(REAL)
    b_shed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    b_shed_rps: Mapped[float] = mapped_column(REAL, server_default="0")
    c_count: Mapped[int] = mapped_column(BigInteger)
    c_rps: Mapped[float] = mapped_column(REAL)
    c_failure_ratio: Mapped[float] = mapped_column(REAL)
    c_p50_ms: Mapped[float | None] = mapped_column(REAL)
    c_p95_ms: Mapped[float | None] = mapped_column(REAL)
    c_p99_ms: Mapped[float | None] = mapped_column(REAL)
    c_shed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    c_shed_rps: Mapped[float] = mapped_column(REAL, server_default="0")


class HistoryMetricPoint(Base):
    """One reading (or, merged, `span_sec` seconds of readings) of a rule's provider
    metric, for the dashboard's plots (controlplane.history.metric_points): each
    variant's value and the bound the canary was held to; NULL where there was no data.
    """

    __tablename__ = "history_metric_points"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    at: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch second read
    span_sec: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    compare: Mapped[str] = mapped_column(String(16))
    # which change is bad (increase, decrease, either): what merging keeps
    direction: Mapped[str] = mapped_column(String(8), server_default="increase")
    b_value: Mapped[float | None] = mapped_column(REAL)
    c_value: Mapped[float | None] = mapped_column(REAL)
    bound: Mapped[float | None] = mapped_column(REAL)


TOKEN_ROLES = ("viewer", "operator", "admin")


class ApiToken(Base):
    """An API token: only its SHA-256 is kept; the token itself is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint(_in("role", TOKEN_ROLES), name="role"),
        # one live token per name; a revoked token's name may be given out again
        Index(
            "uq_api_tokens_active_name",
            "name",
            unique=True,
            postgresql_where=text("revoked_at IS NULL"),
            sqlite_where=text("revoked_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


NOTIFICATION_FORMATS = ("json", "slack")
DELIVERY_STATUSES = ("pending", "delivered", "failed")


class NotificationSubscription(Base):
    """A webhook: where to announce which events (of one service, or of all), how.

    `secret` signs every request (HMAC-SHA256), so it is kept as given; the API shows
    it once, when the subscription is created.
    """

    __tablename__ = "notification_subscriptions"
    __table_args__ = (
        CheckConstraint(_in("format", NOTIFICATION_FORMATS), name="format"),
        UniqueConstraint("name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(String(2048))
    # null: every service
    service: Mapped[str | None] = mapped_column(String(63), index=True)
    # event kinds; empty: every announced kind (notify.kinds)
    kinds: Mapped[list[str]] = mapped_column(JSON)
    format: Mapped[str] = mapped_column(String(8))
    secret: Mapped[str] = mapped_column(String(256))
    enabled: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime]


class NotificationDelivery(Base):
    """The outbox: one row per (event, subscription), written in the event's own
    transaction, so an event that commits is announced and one rolled back is not.

    `stream` orders deliveries: within a subscription, a stream's row is sent only
    once every earlier row of the stream is delivered or given up. `claimed_by` and
    `claimed_until` are a dispatcher's lease on the row while it sends it.
    """

    __tablename__ = "notification_deliveries"
    __table_args__ = (
        CheckConstraint(_in("status", DELIVERY_STATUSES), name="status"),
        Index("ix_notification_deliveries_due", "status", "next_attempt_at"),
        # the oldest pending row of each (subscription, stream), read from the index
        Index("ix_notification_deliveries_heads", "status", "subscription_id", "stream", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subscription_id: Mapped[int] = mapped_column(
        ForeignKey("notification_subscriptions.id", ondelete="CASCADE")
    )
    event_id: Mapped[int] = mapped_column(ForeignKey("events.id"), index=True)
    # copied from the event (which loses it when a draft is deleted): for the listing
    experiment_id: Mapped[int | None] = mapped_column(Integer, index=True)
    service: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(64))
    stream: Mapped[str] = mapped_column(String(96))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime | None]
    last_attempt_at: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(500))
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_until: Mapped[datetime | None]
