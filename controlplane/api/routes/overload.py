"""/v1/services/{service}/overload: a service's overload protection, kept in SQL; the
leader's reconciler publishes it to etcd (`applied` says whether it has yet)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, status

from controlplane.api.deps import BackendsDep, ClockDep, StoreDep
from controlplane.api.in_force import OverloadInForce, applied, not_found, without_read_only
from controlplane.api.problems import problem_responses
from controlplane.api.security import ActorDep, require
from controlplane.api.service_bodies import body_schema, validate_for_service
from controlplane.auth.roles import Role
from controlplane.experiments.service_configs import read_config, remove_config, write_config
from controlplane.kernel.errors import NotFound
from controlplane.kernel.overload import OverloadConfig, ServiceOverload
from controlplane.kernel.service_configs import ConfigKind
from controlplane.kernel.values import ServiceName

router = APIRouter(prefix="/v1/services", tags=["overload"])

ServicePath = Annotated[ServiceName, Path(description="the service whose sidecars shed load")]


def overload_for(service: str, body: dict[str, Any]) -> ServiceOverload:
    return validate_for_service(
        ServiceOverload, service, without_read_only(body), "overload config"
    )


async def in_force(backends: BackendsDep, overload: ServiceOverload) -> OverloadInForce:
    """The config with whether etcd holds it yet."""
    is_applied, note = await applied(
        backends, ConfigKind.OVERLOAD, overload.service, overload.config()
    )
    return OverloadInForce.model_validate(
        {**overload.model_dump(), "applied": is_applied, "applied_note": note}
    )


@router.get(
    "/{service}/overload",
    response_model=OverloadInForce,
    responses=problem_responses(
        502,
        notes={
            404: "the service has no overload protection",
            502: "the stored config is invalid (its fields are named)",
        },
    ),
    dependencies=[require(Role.VIEWER)],
)
async def get_overload(service: ServicePath, backends: BackendsDep) -> OverloadInForce:
    try:
        config = await read_config(
            store=backends.store, kind=ConfigKind.OVERLOAD, service=service
        )
    except NotFound as exc:
        raise await not_found(backends, ConfigKind.OVERLOAD, exc, service) from exc
    assert isinstance(config, OverloadConfig)
    return await in_force(
        backends, ServiceOverload.model_validate({**config.model_dump(), "service": service})
    )


@router.put(
    "/{service}/overload",
    response_model=OverloadInForce,
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
    backends: BackendsDep,
    clock: ClockDep,
    actor: ActorDep,
) -> OverloadInForce:
    """Replace the service's overload protection: committed with its audit event, then
    published by the leader, and its sidecars put it in force as it arrives (`applied`
    says whether it has)."""
    overload = overload_for(service, body)
    await write_config(store=store, changes=backends.route_changes, clock=clock,
                       kind=ConfigKind.OVERLOAD, service=service, config=overload.config(),
                       actor=actor)
    return await in_force(backends, overload)


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
    backends: BackendsDep,
    clock: ClockDep,
    actor: ActorDep,
) -> None:
    """Turn the service's overload protection off (committed; the leader removes it from
    etcd within one pass): what waits in a queue goes on."""
    await remove_config(store=store, changes=backends.route_changes, clock=clock,
                        kind=ConfigKind.OVERLOAD, service=service, actor=actor)
