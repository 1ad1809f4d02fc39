"""/v1/tokens: API tokens, managed by admins (the first one comes from
`canary token create` on the database, before any API can be called)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, status
from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.deps import ClockDep, DatabaseDep
from controlplane.api.problems import problem_responses
from controlplane.api.security import ActorDep, require
from controlplane.auth.roles import Role
from controlplane.auth.tokens import NAME_PATTERN
from controlplane.db import tokens as records
from controlplane.kernel.clock import utc_now
from controlplane.kernel.errors import NotFound
from controlplane.kernel.values import SQL_ID_MAX, in_sql_range

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], dependencies=[require(Role.ADMIN)])


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    role: Role


class TokenPublic(BaseModel):
    id: int
    name: str
    role: Role
    created_at: datetime
    created_by: str
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, info: records.TokenInfo) -> TokenPublic:
        return cls(**info.__dict__)


class TokenCreated(TokenPublic):
    token: str = Field(description="the token itself: shown here once, never again")


@router.get("", response_model=list[TokenPublic], responses=problem_responses())
async def list_tokens(
    database: DatabaseDep,
    revoked: Annotated[bool, Query(description="also list revoked tokens")] = False,
) -> list[TokenPublic]:
    """The tokens (never their secrets), oldest first."""
    found = await database.read(records.list_tokens, include_revoked=revoked)
    return [TokenPublic.of(t) for t in found]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TokenCreated,
    responses=problem_responses(409, body=True, notes={409: "a live token has that name"}),
)
async def create_token(
    body: TokenCreate, database: DatabaseDep, clock: ClockDep, actor: ActorDep
) -> TokenCreated:
    """Issue a token; the answer is the only place it is ever shown."""
    async with database.transaction() as tx:
        info, token = await tx.run(
            records.issue_token, name=body.name, role=body.role, created_by=actor,
            now=utc_now(clock),
        )  # fmt: skip
    return TokenCreated(**TokenPublic.of(info).model_dump(), token=token)


@router.delete(
    "/{token_id}",
    response_model=TokenPublic,
    responses=problem_responses(notes={404: "no such token"}),
)
async def revoke_token(
    token_id: Annotated[
        int, Path(description="token id", json_schema_extra={"minimum": 1, "maximum": SQL_ID_MAX})
    ],
    database: DatabaseDep,
    clock: ClockDep,
) -> TokenPublic:
    """Revoke a token: requests carrying it are refused from now on."""
    if not in_sql_range(token_id):
        # well-formed but names no row: the same answer as an unknown id
        raise NotFound(f"no token {token_id}")
    async with database.transaction() as tx:
        info = await tx.run(records.revoke_token, ref=str(token_id), now=utc_now(clock))
    return TokenPublic.of(info)
