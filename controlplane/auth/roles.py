"""Roles, ordered (admin ⊃ operator ⊃ viewer), and the verified caller of a request."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"  # read experiments, events, rules, metrics
    OPERATOR = "operator"  # drive experiments: start, pause, resume, promote, roll back, abort
    ADMIN = "admin"  # create, edit and delete experiments and rules; manage tokens

    @property
    def rank(self) -> int:
        return _RANK[self]

    def covers(self, needed: Role) -> bool:
        return self.rank >= needed.rank


_RANK = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}


def parse_role(text: str) -> Role:
    try:
        return Role(text.strip().lower())
    except ValueError:
        raise ValueError(
            f"unknown role {text!r}: expected one of {', '.join(r.value for r in Role)}"
        ) from None


@dataclass(frozen=True)
class Principal:
    """A verified caller. `actor` is what the audit trail records (`token:<name>`,
    `oidc:<verified email>`, `oidc:sub:<sub>@<issuer host>`); `role` is None for an
    identity that verified but maps to no role."""

    actor: str
    role: Role | None

    def may(self, needed: Role) -> bool:
        return self.role is not None and self.role.covers(needed)
