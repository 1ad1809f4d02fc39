"""Who may read an admin endpoint (/metrics and anything but the probes).

Admin endpoints listen on loopback unless told otherwise. With a token (from
CANARY_ADMIN_TOKEN_FILE / --admin-token-file), every path except /healthz and
/readyz needs `Authorization: Bearer <token>`: probes stay open for the
orchestrator, metrics (which name services, experiments and error rates) do not.
Decisions are pure functions; the servers do the I/O.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from controlplane.kernel.secrets import secret_from

PROBES = frozenset({"/healthz", "/readyz"})
_MAX_AUTHORIZATION = 1024


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name could resolve anywhere


def allowed(path: str, authorization: str | None, token: str | None) -> bool:
    """May this request read `path`? Constant-time comparison of the bearer token."""
    if token is None or path in PROBES:
        return True
    if authorization is None or len(authorization) > _MAX_AUTHORIZATION:
        return False
    scheme, _, given = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def warn_if_exposed(host: str, token: str | None, log: logging.Logger, what: str) -> None:
    if token is None and not is_loopback(host):
        log.warning("%s admin endpoints listen on %s without a token: anyone who can reach "
                    "it reads /metrics (set --admin-token-file)", what, host)


def admin_token(token_file: str | None) -> str | None:
    return secret_from(value=None, file=token_file, what="admin token file")


def header(head: bytes, name: bytes) -> str | None:
    """One header's value from a raw request head (None: absent)."""
    wanted = name.lower() + b":"
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(wanted):
            return line[len(wanted):].strip().decode("latin-1")
    return None
