"""/v1/services/{service}/overload: a service's overload protection, kept in etcd."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, status

from controlplane.api.deps import ClockDep, KeysDep, KvDep, StoreDep
from controlplane.api.problems import problem_responses
from controlplane.api.security import ActorDep, require
from controlplane.api.service_bodies import body_schema, validate_for_service
from controlplane.auth.roles import Role
from controlplane.experiments.service_overload import (
    delete_overload,
    read_overload,
    write_overload,
)
from controlplane.kernel.overload import ServiceOverload
from controlplane.kernel.values import ServiceName

router = APIRouter(prefix="/v1/services", tags=["overload"])

ServicePath = Annotated[ServiceName, Path(description="the service whose sidecars shed load")]


def overload_for(service: str, body: dict[str, Any]) -> ServiceOverload:
    return validate_for_service(ServiceOverload, service, body, "overload config")


@router.get(
    "/{service}/overload",
    response_model=ServiceOverload,
    responses=problem_responses(
        502,
        notes={
            404: "the service has no overload protection",
            502: "the stored config is invalid (its fields are named)",
        },
    ),
    dependencies=[require(Role.VIEWER)],
)
async def get_overload(service: ServicePath, kv: KvDep, keys: KeysDep) -> ServiceOverload:
    return await read_overload(kv=kv, keys=keys, service=service)


@router.put(
    "/{service}/overload",
    response_model=ServiceOverload,
    responses=problem_responses(body=True, notes={422: "invalid config"}),
    dependencies=[require(Role.ADMIN)],
    openapi_extra={"requestBody": body_schema(ServiceOverload)},
)
async def put_overload(
    service: ServicePath,
    body: Annotated[
        dict[str, Any],
        Body(
            description=(
                "adaptive concurrency limits and graded shedding (docs/sidecar.md, "
                "Overload protection); every field has a default; `service` may be omitted"
            ),
            examples=[
                {"max_limit": 200, "queue_timeout_ms": 50, "low_priority_paths": ["/batch/"]}
            ],
        ),
    ],
    store: StoreDep,
    kv: KvDep,
    keys: KeysDep,
    clock: ClockDep,
    actor: ActorDep,
) -> ServiceOverload:
    """Replace the service's overload protection; its sidecars put it in force at once."""
    overload = overload_for(service, body)
    return await write_overload(
        store=store, kv=kv, keys=keys, clock=clock, overload=overload, actor=actor
    )


@router.delete(
    "/{service}/overload",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(
        409,
        notes={
            404: "the service has no overload protection",
            409: "removed by another request meanwhile",
        },
    ),
    dependencies=[require(Role.ADMIN)],
)
async def remove_overload(
    service: ServicePath,
    store: StoreDep,
    kv: KvDep,
    keys: KeysDep,
    clock: ClockDep,
    actor: ActorDep,
) -> None:
    """Turn the service's overload protection off: what waits in a queue goes on."""
    await delete_overload(store=store, kv=kv, keys=keys, clock=clock, service=service, actor=actor)
