"""/v1/services/{service}/releases: a service's stable version and its release history
(decision 0051), read from SQL; the actions and the controller write them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from controlplane.api.deps import Limit, Offset, StoreDep
from controlplane.api.problems import problem_responses
from controlplane.api.schemas import ReleaseHistory, ReleasePublic, StablePublic
from controlplane.api.security import require
from controlplane.auth.roles import Role
from controlplane.kernel.values import ServiceName

router = APIRouter(prefix="/v1/services", tags=["releases"])

ServicePath = Annotated[ServiceName, Path(description="the service released")]


@router.get(
    "/{service}/releases",
    response_model=ReleaseHistory,
    responses=problem_responses(),
    dependencies=[require(Role.VIEWER)],
)
async def list_releases(
    service: ServicePath, store: StoreDep, limit: Limit = 50, offset: Offset = 0
) -> ReleaseHistory:
    """The service's stable version (null before its first experiment starts) and its
    releases, newest first: each start that set the stable version, each promotion,
    rollback and abort."""
    async with store.transaction() as tx:
        stable = await tx.load_stable_version(service=service)
        releases, total = await tx.list_releases(service=service, limit=limit, offset=offset)
    return ReleaseHistory(
        service=service,
        stable=StablePublic.of(stable) if stable is not None else None,
        items=[ReleasePublic.of(r) for r in releases],
        total=total,
        limit=limit,
        offset=offset,
    )
