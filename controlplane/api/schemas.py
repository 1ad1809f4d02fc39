"""API schemas, apart from the ORM models: what clients send and what they get back."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from controlplane.api.service_bodies import service_optional
from controlplane.decision.words import event_sentence
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.experiments.releases import (
    ReleaseKind,
    ReleaseRecord,
    StableRecord,
    Version,
    default_baseline,
)
from controlplane.experiments.rollout_state import inline_rule
from controlplane.experiments.store import (
    EventRecord,
    ExperimentRecord,
    ExperimentSpec,
    StepSpec,
)
from controlplane.experiments.summary import experiment_summary
from controlplane.kernel.errors import FieldError, ValidationFailed
from controlplane.kernel.routes import BASELINE, CANARY, TOTAL_WEIGHT, Sticky
from controlplane.kernel.rules import BreakerRule, pydantic_field_errors
from controlplane.kernel.values import (
    DisplayName,
    Reason,
    ServiceName,
    UpstreamPolicy,
    UpstreamUrl,
    VersionLabel,
)

Upstream = UpstreamUrl


MAX_HOLD_SEC = 7 * 24 * 3600


class VariantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    upstream: Upstream
    version: VersionLabel | None = Field(
        default=None, description="the release's label; null: the upstream names it"
    )

    def as_version(self) -> Version:
        return Version(self.upstream, self.version)


class Variants(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: VariantIn
    canary: VariantIn


class NewVariants(BaseModel):
    """A new experiment's variants: the baseline may be left out for the service's
    stable version (decision 0051)."""

    model_config = ConfigDict(extra="forbid")

    baseline: VariantIn | None = Field(
        default=None,
        description="left out: the service's stable version, as it is when the experiment "
        "starts (a service with none yet needs one)",
    )
    canary: VariantIn


class StepIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight_pct: float = Field(
        strict=True,
        allow_inf_nan=False,
        ge=0.01,
        le=100,
        description="canary share, 0.01 % resolution (0.01 to 100)",
    )
    hold_sec: int = Field(strict=True, ge=0, le=MAX_HOLD_SEC, description="how long the step holds")

    @field_validator("weight_pct")
    @classmethod
    def _basis_points(cls, value: float) -> float:
        if abs(value * 100 - round(value * 100)) > 1e-6:
            raise ValueError("weight_pct has a resolution of 0.01 (one basis point)")
        # a share that rounds to 0 bp (or past 10000) would only fail at the database
        if not 1 <= round(value * 100) <= TOTAL_WEIGHT:
            raise ValueError("weight_pct must be between 0.01 and 100")
        return value

    @property
    def weight_bp(self) -> int:
        return round(self.weight_pct * 100)


Steps = Annotated[list[StepIn], Field(min_length=1, max_length=100)]


def _steps_increase(steps: list[StepIn]) -> list[StepIn]:
    for i in range(1, len(steps)):
        if steps[i].weight_bp <= steps[i - 1].weight_bp:
            raise ValueError(
                f"weights must increase strictly: steps.{i}.weight_pct "
                f"({steps[i].weight_pct}) is not above steps.{i - 1}.weight_pct "
                f"({steps[i - 1].weight_pct})"
            )
    return steps


def _fill_rule_service(data: Any) -> Any:
    """An inline rule may leave out its service: it is the experiment's."""
    if isinstance(data, dict) and isinstance(data.get("rule"), dict):
        rule = data["rule"]
        if "service" not in rule and isinstance(data.get("service"), str):
            data = {**data, "rule": {**rule, "service": data["service"]}}
    return data


class ExperimentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: DisplayName
    service: ServiceName
    variants: NewVariants
    steps: Annotated[Steps, AfterValidator(_steps_increase)]
    sticky: Sticky = Field(default_factory=Sticky)
    rule: BreakerRule | None = Field(default=None, description="overrides the service rule")

    @model_validator(mode="before")
    @classmethod
    def _rule_service(cls, data: Any) -> Any:
        return _fill_rule_service(data)

    @model_validator(mode="after")
    def _rule_matches(self) -> ExperimentCreate:
        if self.rule is not None and self.rule.service != self.service:
            raise ValueError(
                f"rule.service ({self.rule.service}) must be the experiment's service "
                f"({self.service})"
            )
        return self

    def to_spec(
        self, stable: StableRecord | None = None, *, follows_stable: bool | None = None
    ) -> ExperimentSpec:
        """The spec, its baseline the one given or else the service's `stable` version
        (NoStableVersion without one). `follows_stable` (None: whether the baseline was
        left out) says whether the start takes the stable version as it is then."""
        given = self.variants.baseline
        baseline = default_baseline(
            self.service, given=given.as_version() if given else None, stable=stable
        )
        return ExperimentSpec(
            name=self.name,
            service=self.service,
            baseline_upstream=baseline.upstream,
            canary_upstream=self.variants.canary.upstream,
            steps=tuple(StepSpec(s.weight_bp, s.hold_sec) for s in self.steps),
            sticky_header=self.sticky.header,
            sticky_cookie=self.sticky.cookie,
            rule=self.rule.model_dump(mode="json") if self.rule else None,
            baseline_version=baseline.label,
            canary_version=self.variants.canary.version,
            baseline_follows_stable=given is None if follows_stable is None else follows_stable,
        )

    @classmethod
    def from_spec(cls, spec: ExperimentSpec) -> dict[str, Any]:
        """The stored spec in this schema's JSON shape (for merging a PATCH)."""
        return {
            "name": spec.name,
            "service": spec.service,
            "variants": {
                BASELINE: {"upstream": spec.baseline_upstream, "version": spec.baseline_version},
                CANARY: {"upstream": spec.canary_upstream, "version": spec.canary_version},
            },
            "steps": [
                {"weight_pct": s.weight_bp / 100, "hold_sec": s.hold_sec} for s in spec.steps
            ],
            "sticky": {"header": spec.sticky_header, "cookie": spec.sticky_cookie},
            "rule": spec.rule,
        }


def _left_out() -> Any:
    """A PATCH field that may be left out but not be null: the schema says so (no
    default, not nullable), and pydantic refuses null as the schema does."""
    return Field(default=None, json_schema_extra=_without_default)


def _without_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _inline_rule_schema(schema: dict[str, Any]) -> None:
    schema.pop("anyOf", None)
    schema["anyOf"] = [service_optional(BreakerRule), {"type": "null"}]


class ExperimentUpdate(BaseModel):
    """A PATCH: the fields given replace the stored ones, then the whole is validated."""

    model_config = ConfigDict(extra="forbid")

    name: DisplayName = _left_out()
    service: ServiceName = _left_out()
    variants: Variants = _left_out()
    steps: Annotated[Steps, AfterValidator(_steps_increase)] = _left_out()
    sticky: Sticky = _left_out()
    # taken as a dict (merged, then validated whole) but documented as the rule it must be
    rule: dict[str, Any] | None = Field(
        default=None, description="null: no inline rule", json_schema_extra=_inline_rule_schema
    )

    def apply(self, spec: ExperimentSpec) -> ExperimentSpec:
        merged = ExperimentCreate.from_spec(spec)
        merged.update(self.model_dump(mode="json", exclude_unset=True))
        fields = self.model_fields_set
        if "service" in fields and "rule" not in fields and merged.get("rule"):
            # The inline rule follows the experiment to its new service.
            merged["rule"] = {**merged["rule"], "service": merged["service"]}
        # new variants name their baseline: the draft no longer follows the stable version
        follows = spec.baseline_follows_stable and "variants" not in fields
        try:
            return ExperimentCreate.model_validate(merged).to_spec(follows_stable=follows)
        except ValidationError as exc:
            raise ValidationFailed(
                "invalid experiment",
                [FieldError(("body", *e.loc), e.msg) for e in pydantic_field_errors(exc)],
            ) from exc


def check_upstreams(spec: ExperimentSpec, policy: UpstreamPolicy) -> ExperimentSpec:
    """Refuse upstream hosts the deployment does not allow (CANARY_UPSTREAM_ALLOW)."""
    urls = [(BASELINE, spec.baseline_upstream), (CANARY, spec.canary_upstream)]
    refused = policy.refusals(urls)
    if refused:
        raise ValidationFailed(
            "upstream not allowed",
            [FieldError(("body", "variants", name, "upstream"), why) for name, why in refused],
        )
    return spec


class ActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason = ""


class StepPublic(BaseModel):
    weight_pct: float
    hold_sec: int


class ExperimentPublic(BaseModel):
    id: int
    name: str
    service: str
    state: ExperimentState
    variants: Variants
    steps: list[StepPublic]
    sticky: Sticky
    rule: BreakerRule | None
    salt: str
    current_step: int = Field(description="-1 before start")
    canary_weight_bp: int = Field(ge=0, le=TOTAL_WEIGHT)
    breaker_state: str
    trips: int
    route_revision: int
    step_started_at: datetime | None
    breaker_changed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_reason: str | None = Field(
        default=None, description="the controller's reason at its last decision"
    )
    summary: str = Field(
        default="",
        description="where the rollout stands, in words (\"holding step 2 of 4 (25%) until "
        "2026-12-06T14:03:10Z\"); times ISO 8601",
    )
    baseline_follows_stable: bool = Field(
        default=False,
        description="the baseline was left out: a draft takes the service's stable version "
        "when it starts",
    )

    @classmethod
    def of(cls, experiment: ExperimentRecord) -> ExperimentPublic:
        reason = (experiment.rollout_state or {}).get("last_reason")
        return cls(
            id=experiment.id,
            name=experiment.name,
            service=experiment.service,
            state=experiment.state,
            variants=Variants(
                baseline=VariantIn(upstream=experiment.baseline_upstream,
                                   version=experiment.baseline_version),
                canary=VariantIn(upstream=experiment.canary_upstream,
                                 version=experiment.canary_version),
            ),
            steps=[
                StepPublic(weight_pct=s.weight_bp / 100, hold_sec=s.hold_sec)
                for s in experiment.steps
            ],
            sticky=Sticky(header=experiment.sticky_header, cookie=experiment.sticky_cookie),
            rule=BreakerRule.model_validate(experiment.rule) if experiment.rule else None,
            salt=experiment.salt,
            current_step=experiment.current_step,
            canary_weight_bp=experiment.canary_weight_bp,
            breaker_state=experiment.breaker_state.value,
            trips=experiment.trips,
            route_revision=experiment.route_revision,
            step_started_at=experiment.step_started_at,
            breaker_changed_at=experiment.breaker_changed_at,
            created_at=experiment.created_at,
            updated_at=experiment.updated_at,
            last_reason=reason if isinstance(reason, str) else None,
            summary=experiment_summary(experiment, rule=inline_rule(experiment)),
            baseline_follows_stable=experiment.baseline_follows_stable,
        )


class StepLive(BaseModel):
    index: int = Field(description="0-based position in the schedule")
    weight_bp: int = Field(ge=0, le=TOTAL_WEIGHT)
    hold_sec: int
    started_at: datetime | None = Field(description="when the step's hold began")
    due_at: datetime | None = Field(
        description="started_at + hold_sec while running with the breaker closed, else null"
    )


class LatencyLive(BaseModel):
    """One latency of a window: how many samples carry it, its mean and percentiles."""

    count: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None


class SnapshotLive(BaseModel):
    """One variant's latest window as the collectors published it (architecture §5).

    The latency fields are the total time; `first_byte` is the time to the response
    head, which a rule with `latency: first_byte` judges."""

    count: int
    failures: int
    failure_ratio: float
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    window_sec: int
    window_start: float
    window_end: float
    ts: float = Field(description="when the snapshot was taken, epoch seconds")
    first_byte: LatencyLive | None = Field(
        default=None,
        description="the window over the time to the first byte, of the samples that carry "
        "one; null from a collector older than the first byte",
    )
    samples_without_first_byte: int = Field(
        default=0, description="samples from sidecars older than sample batch version 2"
    )
    shed: int = Field(
        default=0,
        description="requests the sidecars' overload protection answered themselves in the "
        "window: not in count, never latency samples",
    )
    shed_share: float = Field(default=0.0, description="shed / (count + shed)")


NextCheckFor = Literal["step_due", "cooldown_end", "probe_due", "controller_recheck"]


class ProbeLive(BaseModel):
    """A half-open probe's progress towards its verdict: its window must be over and it
    must have seen min_samples canary samples; the estimate comes from its own traffic."""

    weight_bp: int = Field(ge=0, le=TOTAL_WEIGHT)
    samples: int = Field(description="canary samples counted since the probe began")
    samples_needed: int = Field(description="the rule's min_samples")
    samples_per_sec: float | None = Field(description="canary samples per second so far; "
                                          "null before the first")
    window_ends_at: datetime
    verdict_expected_at: datetime | None = Field(
        description="the earliest time the verdict can come at this pace; null while the "
        "probe has no canary sample (no estimate)"
    )
    sentence: str = Field(description="the same in words")


class ExperimentLive(BaseModel):
    """The rollout as the controller and the collectors last left it."""

    breaker_state: str
    trips: int
    max_trips: int | None = Field(description="from the rule in force; null when unknown")
    step: StepLive | None = Field(description="null before the start")
    canary_weight_bp: int = Field(ge=0, le=TOTAL_WEIGHT)
    baseline_weight_bp: int = Field(ge=0, le=TOTAL_WEIGHT)
    route_revision: int
    next_check_at: datetime | None = Field(
        description="when the rollout next moves on its own; null when it does not"
    )
    next_check_for: NextCheckFor | None = Field(
        description="step_due (closed), cooldown_end (open), probe_due (half-open); "
        "controller_recheck when the rule is unknown and the controller's own time is shown"
    )
    controller_next_check_at: datetime | None = Field(
        description="the latest time the controller asked to look again, at its last round"
    )
    last_reason: str | None = Field(description="the controller's reason at its last round")
    summary: str = Field(
        default="",
        description="where the rollout stands, in words, with relative times (\"probing the "
        "canary at 1% (trip 1 of 3) until 14:05:00Z (in 40 s)\")",
    )
    overload_held: bool = Field(
        default=False,
        description="the controller's last look was held: the baseline's sidecars shed "
        "requests and the rule says overload: hold",
    )
    held_by: list[str] = Field(
        default_factory=list,
        description="guardrails whose action is pause holding the weight now (the step "
        "does not advance until each is clean for consecutive_breaches looks, or a "
        "user resumes)",
    )
    held_since: datetime | None = Field(default=None, description="when the hold began")
    held_reason: str | None = Field(
        default=None, description="why, in words: the guardrail, its values and its bound"
    )
    probe: ProbeLive | None = Field(
        default=None, description="while half-open with a known rule: the probe's progress"
    )
    rule_source: Literal["experiment", "service"] | None
    rule_note: str | None = None
    snapshots: dict[str, SnapshotLive] | None = Field(
        description="latest window per variant; null when it could not be read"
    )
    snapshots_note: str | None = None
    snapshots_error: str | None = None


class RouteConfirmationPublic(BaseModel):
    """Whether a data plane (a sidecar, a router agent) serves the experiment's route:
    each reports the route revision it holds every few seconds (decision 0053)."""

    confirmed: bool | None = Field(
        description="a data plane reported holding `route_revision` or a later one within "
        "the last 30 s; null when the reports could not be read"
    )
    data_planes: int | None = Field(description="data planes of the service that reported "
                                    "within the last 30 s")
    confirmed_by: int | None = Field(description="of which hold this revision or a later one")
    sentence: str = Field(description="the same in words, e.g. 'published, not yet confirmed'")


class ExperimentDetail(ExperimentPublic):
    """One experiment with its live rollout (GET /v1/experiments/{id})."""

    route_applied: bool | None = Field(
        description="whether etcd holds the experiment's desired route (`route_revision`) "
        "or a later one of its service; null before its first route, or when etcd could "
        "not be read (see route_note)"
    )
    route_note: str | None = None
    route_confirmation: RouteConfirmationPublic | None = Field(
        default=None,
        description="whether a data plane serves the route yet; null before the first route "
        "or when this API reads no reports",
    )
    live: ExperimentLive


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int | None
    service: str
    at: datetime
    actor: str
    kind: str
    from_state: str | None
    to_state: str | None
    reason: str
    summary: str = Field(
        default="",
        description="the event in one sentence, its numbers in words (\"canary P95 407 ms > "
        "bound 200 ms over the last 10 s, n=68; baseline P95 88 ms\")",
    )
    payload: dict[str, Any]

    @classmethod
    def of(cls, event: EventRecord) -> EventPublic:
        summary = event_sentence(event.kind, event.reason, event.payload, actor=event.actor)
        return cls.model_validate(event).model_copy(update={"summary": summary})


class VersionPublic(BaseModel):
    upstream: str
    version: str | None = Field(description="the release's label; null: unlabelled")

    @classmethod
    def of(cls, version: Version) -> VersionPublic:
        return cls(upstream=version.upstream, version=version.label)


class StablePublic(BaseModel):
    upstream: str
    version: str | None = Field(description="the release's label; null: unlabelled")
    experiment_id: int | None = Field(
        description="the experiment that made it stable (null once deleted)"
    )
    since: datetime

    @classmethod
    def of(cls, stable: StableRecord) -> StablePublic:
        return cls(upstream=stable.current.upstream, version=stable.current.label,
                   experiment_id=stable.experiment_id, since=stable.since)


class ReleasePublic(BaseModel):
    id: int
    at: datetime
    kind: ReleaseKind = Field(
        description="seeded: the first stable version; rebased: an experiment started on "
        "another baseline; promoted: the canary became stable; rolled_back, aborted: the "
        "stable version stayed"
    )
    experiment_id: int | None
    stable_before: VersionPublic | None = Field(description="null: there was none")
    stable_after: VersionPublic
    actor: str
    reason: str

    @classmethod
    def of(cls, release: ReleaseRecord) -> ReleasePublic:
        return cls(
            id=release.id,
            at=release.at,
            kind=release.kind,
            experiment_id=release.experiment_id,
            stable_before=VersionPublic.of(release.before) if release.before else None,
            stable_after=VersionPublic.of(release.after),
            actor=release.actor,
            reason=release.reason,
        )


class ReleaseHistory(BaseModel):
    """A service's stable version and a page of its releases, newest first."""

    service: str
    stable: StablePublic | None = Field(description="null before its first experiment starts")
    items: list[ReleasePublic]
    total: int = Field(ge=0, description="releases across all pages")
    limit: int
    offset: int


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int = Field(ge=0, description="matching items across all pages")
    limit: int
    offset: int


class VariantSeries(BaseModel):
    """One variant's plotted numbers, one value per point (null: an empty window)."""

    count: list[int] = Field(description="samples in the window")
    rps: list[float] = Field(description="requests per second over the window")
    failure_ratio: list[float]
    p50_ms: list[float | None]
    p95_ms: list[float | None]
    p99_ms: list[float | None]
    shed: list[int] = Field(
        description="requests the sidecars' overload protection shed in the window "
        "(never in count: a shed request is not a sample of the version)"
    )
    shed_rps: list[float] = Field(description="shed requests per second over the window")


class HistoryMark(BaseModel):
    at: datetime
    kind: str
    actor: str
    reason: str


class MetricSeries(BaseModel):
    """One provider metric's readings over time (decision 0048), one value per point;
    null where a variant (or, against the baseline, the bound) had no data. Merged
    points keep each value's peak and the lowest bound."""

    at: list[int] = Field(description="epoch second each point begins (the reading's)")
    span_sec: list[int] = Field(description="seconds each point covers")
    baseline: list[float | None]
    canary: list[float | None]
    bound: list[float | None] = Field(
        description="what the canary was compared with: the rule's bound, or the "
        "baseline's value with the margin applied"
    )
    kind: str = Field(description="ratio, gauge or histogram")
    compare: str = Field(description="absolute or baseline")


class ExperimentHistory(BaseModel):
    """An experiment's judged windows over time, as columns (one entry per point).

    A point merges the seconds of its bucket: latency percentiles and failure ratio
    at their peak, count and rate their mean, threshold, failure bound and canary
    weight their lowest."""

    experiment_id: int
    start: datetime
    end: datetime
    bucket_sec: int = Field(description="seconds each point covers at most, from `start`")
    t: list[int] = Field(description="epoch second each point begins")
    span_sec: list[int] = Field(description="seconds each point covers")
    window_sec: list[int]
    canary_weight_bp: list[int]
    threshold_ms: list[float | None]
    failure_bound: list[float | None]
    variants: dict[str, VariantSeries]
    metrics: dict[str, MetricSeries] = Field(
        default_factory=dict,
        description="the rules' provider metrics by name, each at its own readings' "
        "seconds, in buckets of `bucket_sec` from `start`",
    )
    marks: list[HistoryMark] = Field(
        description="trips, probes, step changes and actions in the range, oldest first "
        "(the newest ones when there are more than fit)"
    )
    marks_total: int
