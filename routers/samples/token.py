"""The secret an agent's proxy writes into every access-log line it sends.

The log receiver listens on a loopback UDP port, and any local process can send a
datagram there (decision 0045). Each agent process draws one token at start, hands
it to its router, which writes it into what the proxy logs (NGINX: a constant of
the rendered `log_format`; HAProxy: a field of the map's route value, logged from a
transaction variable), and to its parser, which refuses a line that does not carry
it (reason `forged`): a forged line is a counted refusal, never a sample.

The token is 144 random bits from `secrets`, written in the URL-safe base64
alphabet `[A-Za-z0-9_-]`, so it is a plain token both in nginx's `log_format` and
in a `|`-separated HAProxy map field. It is compared in constant time, and its
`repr` hides it, so it never reaches a log line or /status by way of a value printed.
"""

from __future__ import annotations

import hmac
import re
import secrets
from typing import Final

BYTES: Final = 18  # 144 bits, 24 characters
_FORM = re.compile(r"[A-Za-z0-9_-]{16,64}")


class LogToken:
    """One agent process's log-line secret."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not _FORM.fullmatch(value):
            raise ValueError("a log token must be 16-64 letters, digits, '_' or '-'")
        self._value = value

    @classmethod
    def generate(cls) -> LogToken:
        return cls(secrets.token_urlsafe(BYTES))

    @property
    def value(self) -> str:
        """The text the proxy writes; only the router's rendering asks for it."""
        return self._value

    def matches(self, text: str) -> bool:
        """Whether a line's token is this one, in time independent of where they differ."""
        return hmac.compare_digest(self._value.encode(), text.encode("utf-8", "replace"))

    def __repr__(self) -> str:
        return "LogToken(<hidden>)"

    __str__ = __repr__


__all__ = ["LogToken"]
