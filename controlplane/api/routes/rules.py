"""/v1/services/{service}/rule: a service's breaker rule, kept in etcd."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from pydantic import ValidationError

from controlplane.api.deps import ActorDep, ClockDep, DatabaseDep, KeysDep, KvDep
from controlplane.experiments.service_rules import read_rule, write_rule
from controlplane.kernel.errors import FieldError, ValidationFailed
from controlplane.kernel.rules import BreakerRule, ServiceName, pydantic_field_errors

router = APIRouter(prefix="/v1/services", tags=["rules"])

ServicePath = Annotated[ServiceName, Path(description="the service the rule guards")]


def rule_for(service: str, body: dict[str, Any]) -> BreakerRule:
    """Validate a rule body for `service`: its service may be left out, not contradict."""
    named = body.get("service")
    if named is not None and named != service:
        raise ValidationFailed(
            "invalid breaker rule",
            [FieldError(("body", "service"), f"must be {service!r}, the service in the path")],
        )
    try:
        return BreakerRule.model_validate({**body, "service": service})
    except ValidationError as exc:
        errors = [FieldError(("body", *e.loc), e.msg) for e in pydantic_field_errors(exc)]
        raise ValidationFailed("invalid breaker rule", errors) from exc


@router.get(
    "/{service}/rule",
    response_model=BreakerRule,
    responses={
        404: {"description": "the service has no rule"},
        502: {"description": "the stored rule is invalid (its fields are named)"},
    },
)
async def get_rule(service: ServicePath, kv: KvDep, keys: KeysDep) -> BreakerRule:
    return await read_rule(kv=kv, keys=keys, service=service)


@router.put(
    "/{service}/rule",
    response_model=BreakerRule,
    responses={422: {"description": "invalid rule"}, 503: {"description": "etcd unavailable"}},
)
async def put_rule(
    service: ServicePath,
    body: Annotated[
        dict[str, Any],
        Body(
            description="a breaker rule (DESIGN §6); `service` may be omitted",
            examples=[{"threshold_ms": 800, "window_sec": 60, "failure_ratio": 0.3}],
        ),
    ],
    database: DatabaseDep,
    kv: KvDep,
    keys: KeysDep,
    clock: ClockDep,
    actor: ActorDep,
) -> BreakerRule:
    """Replace the service's rule (etcd is its source of truth; SQL logs the change)."""
    rule = rule_for(service, body)
    return await write_rule(
        database=database, kv=kv, keys=keys, clock=clock, rule=rule, actor=actor
    )
