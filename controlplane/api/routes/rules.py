"""/v1/services/{service}/rule: a service's breaker rule, kept in SQL; the leader's
reconciler publishes it to etcd (`applied` says whether it has yet)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query

from controlplane.api.deps import BackendsDep, ClockDep, StoreDep
from controlplane.api.in_force import RuleInForce, applied, not_found, without_read_only
from controlplane.api.problems import problem_responses
from controlplane.api.security import ActorDep, require
from controlplane.api.service_bodies import body_schema, validate_for_service
from controlplane.auth.roles import Role
from controlplane.decision.recommend import (
    MIN_WINDOWS,
    NotEnoughHistory,
    baseline_windows,
    recommend,
)
from controlplane.experiments.service_configs import (
    StoredValueInvalid,
    read_config,
    write_config,
)
from controlplane.experiments.store import ExperimentStore
from controlplane.kernel.errors import NotFound
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.service_configs import ConfigKind
from controlplane.kernel.streams import DECISIONS_MAXLEN
from controlplane.kernel.values import ServiceName

router = APIRouter(prefix="/v1/services", tags=["rules"])

ServicePath = Annotated[ServiceName, Path(description="the service the rule guards")]


def rule_for(service: str, body: dict[str, Any]) -> BreakerRule:
    return validate_for_service(BreakerRule, service, without_read_only(body), "breaker rule")


async def in_force(backends: BackendsDep, rule: BreakerRule) -> RuleInForce:
    """The rule with whether etcd holds it yet."""
    is_applied, note = await applied(backends, ConfigKind.RULE, rule.service, rule)
    return RuleInForce.model_validate(
        {**rule.model_dump(), "applied": is_applied, "applied_note": note}
    )


async def read_rule(store: ExperimentStore, service: str) -> BreakerRule:
    rule = await read_config(store=store, kind=ConfigKind.RULE, service=service)
    assert isinstance(rule, BreakerRule)
    return rule


@router.get(
    "/{service}/rule",
    response_model=RuleInForce,
    responses=problem_responses(
        502,
        notes={
            404: "the service has no rule",
            502: "the stored rule is invalid (its fields are named)",
        },
    ),
    dependencies=[require(Role.VIEWER)],
)
async def get_rule(service: ServicePath, backends: BackendsDep) -> RuleInForce:
    try:
        rule = await read_rule(backends.store, service)
    except NotFound as exc:
        raise await not_found(backends, ConfigKind.RULE, exc, service) from exc
    return await in_force(backends, rule)


@router.put(
    "/{service}/rule",
    response_model=RuleInForce,
    responses=problem_responses(body=True, notes={422: "invalid rule"}),
    dependencies=[require(Role.ADMIN)],
    openapi_extra={"requestBody": body_schema(BreakerRule)},
)
async def put_rule(
    service: ServicePath,
    body: Annotated[
        dict[str, Any],
        Body(
            description="a breaker rule (docs/architecture.md §6); `service` may be omitted",
            examples=[{"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3}],
        ),
    ],
    store: StoreDep,
    backends: BackendsDep,
    clock: ClockDep,
    actor: ActorDep,
) -> RuleInForce:
    """Replace the service's rule: committed with its audit event, then published to
    etcd by the leader (`applied` says whether it is yet)."""
    rule = rule_for(service, body)
    await write_config(store=store, changes=backends.route_changes, clock=clock,
                       kind=ConfigKind.RULE, service=service, config=rule, actor=actor)
    return await in_force(backends, rule)


# a rule's defaults when the service has none yet (or an unreadable one)
_DEFAULT_PERCENTILE = BreakerRule.model_fields["percentile"].default
_DEFAULT_MIN_SAMPLES = BreakerRule.model_fields["min_samples"].default


async def experiment_ids(store: ExperimentStore, service: str) -> set[str]:
    """Every experiment the service ever had, as the decisions stream names them."""
    async with store.transaction() as tx:
        found, _ = await tx.list_experiments(service=service)
    return {str(e.id) for e in found}


@router.get(
    "/{service}/rule/recommendation",
    responses=problem_responses(
        409,
        notes={409: "not enough baseline history (windows found and needed), unless partial"},
    ),
    dependencies=[require(Role.VIEWER)],
)
async def recommend_rule(
    service: ServicePath,
    backends: BackendsDep,
    windows: Annotated[
        bool, Query(description="also list every window the numbers came from")
    ] = False,
    partial: Annotated[
        bool,
        Query(
            description="when the history is still too short, answer 200 with ready=false, "
            "windows_found and windows_needed instead of the 409 (for pages that poll)"
        ),
    ] = False,
) -> dict[str, Any]:
    """Propose threshold_ms and failure_ratio from the baseline's recent windows.

    The history is the `canary:decisions` stream (the newest entries the collectors
    published for the service's experiments), one value per non-overlapping window;
    the answer carries the per-window summary, the multipliers and the window count.
    """
    try:
        current: BreakerRule | None = await read_rule(backends.store, service)
    except (NotFound, StoredValueInvalid):
        current = None
    percentile = current.percentile if current else _DEFAULT_PERCENTILE
    min_samples = current.min_samples if current else _DEFAULT_MIN_SAMPLES
    try:
        if backends.board is None:
            raise NotEnoughHistory(
                service, 0, MIN_WINDOWS, "this API process reads no snapshot board"
            )
        ids = await experiment_ids(backends.store, service)
        # the whole retained stream: it is bounded by DECISIONS_MAXLEN (architecture §5)
        entries = await backends.board.recent_decisions(DECISIONS_MAXLEN) if ids else []
        found = baseline_windows(entries, ids, percentile=percentile, min_samples=min_samples)
        proposal = recommend(service, found, percentile=percentile, min_samples=min_samples)
    except NotEnoughHistory as short:
        if not partial:
            raise
        # a young service is not an error to a page polling for its proposal
        return {"ready": False, "detail": str(short), **short.problem_extensions}
    body = {"ready": True, **proposal.to_dict(with_windows=windows)}
    if current is not None:
        body["current"] = {
            "threshold_ms": current.threshold_ms,
            "failure_ratio": current.failure_ratio,
        }
    return body
