"""One exception tree for the whole product.

    CanaryError
    ├── ConfigError              bad settings, URL or file
    ├── ValidationFailed         a value broke a schema (carries field paths)
    ├── NotFound                 an unknown experiment, service or key
    ├── Unauthenticated          no credentials, or credentials that do not verify
    ├── Forbidden                a verified identity without the role a route needs
    ├── Conflict                 a state or revision did not allow the change
    │   ├── IllegalTransition    a lifecycle refused the transition
    │   └── RevisionConflict     compare-and-swap lost against a newer write
    ├── BackendError             a dependency failed (translated at the adapter)
    │   ├── BackendUnavailable   cannot reach etcd / Redis / the database
    │   │   └── IdentityProviderUnavailable   no OIDC keys to check a token against
    │   └── NotLeader            a fenced write by a replica that does not lead
    └── CodecError               a corrupt or truncated payload

Adapters translate driver errors (grpc, redis, httpx, SQLAlchemy) into this tree at
the boundary with ``raise … from exc``; the API maps it to problem+json in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


class CanaryError(Exception):
    """Base of every error the product raises on purpose."""


class ConfigError(CanaryError):
    pass


# pydantic prefixes what a validator raises with the exception's kind; a user reads the
# validator's sentence, not which Python exception carried it
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def plain_message(msg: object) -> str:
    """A validation message as the user should read it (pydantic's prefix dropped)."""
    text = str(msg)
    for prefix in _PYDANTIC_PREFIXES:
        if text.startswith(prefix):
            return text.removeprefix(prefix)
    return text


@dataclass(frozen=True)
class FieldError:
    loc: tuple[str | int, ...]
    msg: str

    @property
    def path(self) -> str:
        return ".".join(str(part) for part in self.loc)


@dataclass
class ValidationFailed(CanaryError):
    message: str
    errors: Sequence[FieldError] = field(default_factory=tuple)

    def __str__(self) -> str:
        if not self.errors:
            return self.message
        details = "; ".join(f"{e.path}: {e.msg}" for e in self.errors)
        return f"{self.message}: {details}"


class NotFound(CanaryError):
    pass


class Unauthenticated(CanaryError):
    """No credentials, or ones that do not verify; `required_role` names what the
    route needs, so a client can say which role to ask for."""

    def __init__(self, message: str, *, required_role: str | None = None) -> None:
        self.required_role = required_role
        super().__init__(message)


class Forbidden(CanaryError):
    def __init__(self, message: str, *, required_role: str | None = None) -> None:
        self.required_role = required_role
        super().__init__(message)


class Conflict(CanaryError):
    pass


class IllegalTransition(Conflict):
    def __init__(self, kind: str, current: str, target: str) -> None:
        self.kind = kind
        self.current = current
        self.target = target
        super().__init__(f"{kind} cannot go from '{current}' to '{target}'")


class RevisionConflict(Conflict):
    pass


class BackendError(CanaryError):
    pass


class BackendUnavailable(BackendError):
    pass


class IdentityProviderUnavailable(BackendUnavailable):
    """No OIDC keys to check a token against; `retry_after_sec` is when the next
    fetch of the issuer's keys may happen."""

    def __init__(self, message: str, *, retry_after_sec: int = 1) -> None:
        self.retry_after_sec = retry_after_sec
        super().__init__(message)


class NotLeader(BackendError):
    pass


class CodecError(CanaryError):
    """`reason` is a short fixed label (a metrics label value), never input bytes."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason
