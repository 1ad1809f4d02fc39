"""/v1/me: who the credentials of a request name, and what they may do.

The dashboard asks it once after sign-in to show only the actions the caller's role
allows; the routes themselves still check the role on every request.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from controlplane.api.problems import problem_responses
from controlplane.api.security import require
from controlplane.auth.roles import Principal, Role

router = APIRouter(prefix="/v1", tags=["identity"])


class Identity(BaseModel):
    actor: str = Field(description="how the audit trail names the caller")
    role: Role
    may: list[Role] = Field(description="the roles this caller's role covers")


@router.get(
    "/me",
    response_model=Identity,
    responses=problem_responses(),
    dependencies=[require(Role.VIEWER)],
)
async def who_am_i(request: Request) -> Identity:
    """The verified caller: its actor name and role."""
    principal: Principal = request.state.principal
    assert principal.role is not None  # the guard let it through with a role
    return Identity(
        actor=principal.actor,
        role=principal.role,
        may=[r for r in Role if principal.role.covers(r)],
    )
