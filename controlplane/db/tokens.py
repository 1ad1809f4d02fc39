"""Data access for API tokens: issue, list, revoke, and find a live one by its hash.

Synchronous functions given the caller's session (they never commit), used by the API
and, directly on the database, by `canary token …` (so the first admin token can be
made before any API answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.auth.roles import Role
from controlplane.auth.tokens import hashes_equal, new_token, token_hash, valid_name
from controlplane.db.models import ApiToken
from controlplane.kernel.errors import Conflict, FieldError, NotFound, ValidationFailed

# last_used_at is a hint, not an audit record: write it at most this often per token
LAST_USED_EVERY = timedelta(minutes=5)


@dataclass(frozen=True)
class TokenInfo:
    """A token's row without its hash (what list and create show)."""

    id: int
    name: str
    role: Role
    created_at: datetime
    created_by: str
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiToken) -> TokenInfo:
        return cls(
            id=row.id,
            name=row.name,
            role=Role(row.role),
            created_at=row.created_at,
            created_by=row.created_by,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
        )


def issue_token(
    *, session: Session, name: str, role: Role, created_by: str, now: datetime
) -> tuple[TokenInfo, str]:
    """A new token: its row, and the token itself (shown once, never stored)."""
    if not valid_name(name):
        raise ValidationFailed(
            "invalid token name",
            [FieldError(("name",), "1-64 characters: letters, digits, _ . @ - (not first)")],
        )
    taken = session.scalar(
        select(ApiToken.id).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
    )
    if taken is not None:
        raise Conflict(f"a live token named {name!r} exists (id {taken}); revoke it first")
    token = new_token()
    row = ApiToken(
        name=name,
        role=role.value,
        token_hash=token_hash(token),
        created_at=now,
        created_by=created_by[:128],
    )
    session.add(row)
    session.flush()
    return TokenInfo.of(row), token


def list_tokens(*, session: Session, include_revoked: bool = False) -> list[TokenInfo]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return [TokenInfo.of(row) for row in session.scalars(query)]


def revoke_token(*, session: Session, ref: str, now: datetime) -> TokenInfo:
    """Revoke by id (digits) or by the name of a live token."""
    if ref.isdigit():
        row = session.get(ApiToken, int(ref))
    else:
        row = session.scalar(
            select(ApiToken).where(ApiToken.name == ref, ApiToken.revoked_at.is_(None))
        )
    if row is None:
        raise NotFound(f"no token {ref!r}")
    if row.revoked_at is None:
        row.revoked_at = now
        session.flush()
    return TokenInfo.of(row)


def find_live_token(*, session: Session, token: str, now: datetime) -> TokenInfo | None:
    """The live token `token` is, or None; notes when it was last used.

    Looking a row up by the hash leaks nothing useful through timing (the hash of a
    256-bit secret); the stored and computed hashes are still compared in constant time.
    """
    digest = token_hash(token)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if row is None or row.revoked_at is not None or not hashes_equal(row.token_hash, digest):
        return None
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
        row.last_used_at = now
        session.flush()
    return TokenInfo.of(row)


def count_live_tokens(*, session: Session) -> int:
    counted = session.scalar(
        select(func.count()).select_from(ApiToken).where(ApiToken.revoked_at.is_(None))
    )
    return int(counted or 0)


BOOTSTRAP_TOKEN_NAME = "bootstrap-admin"


def ensure_bootstrap_token(*, session: Session, token: str, now: datetime) -> str:
    """Install `token` as the admin token named bootstrap-admin, once: what was done,
    in words.

    Idempotent across restarts and replicas: a token already stored (live, or revoked
    by an admin who meant it) is left as it is; a different token under the name (the
    Secret was rotated) is revoked and the new one installed."""
    digest = token_hash(token)
    known = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if known is not None:
        if known.revoked_at is not None:
            return (f"the bootstrap admin token (id {known.id}) was revoked; it stays "
                    "revoked (rotate the Secret to install a new one)")
        return f"the bootstrap admin token is installed (id {known.id})"
    previous = session.scalar(select(ApiToken).where(
        ApiToken.name == BOOTSTRAP_TOKEN_NAME, ApiToken.revoked_at.is_(None)))
    replaced = ""
    if previous is not None:
        previous.revoked_at = now
        session.flush()
        replaced = f", replacing id {previous.id} (revoked)"
    row = ApiToken(name=BOOTSTRAP_TOKEN_NAME, role=Role.ADMIN.value, token_hash=digest,
                   created_at=now, created_by="bootstrap (CANARY_BOOTSTRAP_ADMIN_TOKEN_FILE)")
    session.add(row)
    session.flush()
    return f"installed the bootstrap admin token (id {row.id}){replaced}"
