"""Known API tokens for the tests, written straight into a migrated database.

The product makes tokens at random (`canary token create`); the tests need ones they
can name before the app starts, so the row is written here with the product's hash.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete

from controlplane.auth.roles import Role
from controlplane.auth.tokens import token_hash
from controlplane.db.models import ApiToken
from controlplane.db.session import make_engine, make_sessionmaker

TOKENS = {
    Role.ADMIN: "cnry_test-admin-0000000000000000000000000000",
    Role.OPERATOR: "cnry_test-operator-00000000000000000000000000",
    Role.VIEWER: "cnry_test-viewer-000000000000000000000000000",
}
NAMES = {role: f"test-{role.value}" for role in Role}
ADMIN_TOKEN = TOKENS[Role.ADMIN]
ADMIN_ACTOR = f"token:{NAMES[Role.ADMIN]}"


def bearer(role: Role = Role.ADMIN) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def install_test_tokens(database_url: str) -> None:
    """One live token per role (replacing earlier copies), named test-<role>."""
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine).begin() as session:
            session.execute(delete(ApiToken).where(ApiToken.name.in_(NAMES.values())))
            now = datetime.now(UTC)
            for role, token in TOKENS.items():
                session.add(
                    ApiToken(
                        name=NAMES[role],
                        role=role.value,
                        token_hash=token_hash(token),
                        created_at=now,
                        created_by="tests",
                    )
                )
    finally:
        engine.dispose()
