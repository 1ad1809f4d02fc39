"""API tokens as strings: how they are made, recognised and hashed (pure functions).

A token is `cnry_` + 43 URL-safe characters (32 random bytes). The database keeps only
its SHA-256: a token carries 256 bits of entropy, so a fast hash cannot be brute-forced
and a slow password hash would only cost every request time (decision 0008).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

PREFIX = "cnry_"
TOKEN_BYTES = 32
MAX_TOKEN_CHARS = 256  # anything longer is not one of ours; refused before hashing
_SHAPE = re.compile(r"^cnry_[A-Za-z0-9_-]{20,200}$")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def looks_like_token(text: str) -> bool:
    return len(text) <= MAX_TOKEN_CHARS and _SHAPE.fullmatch(text) is not None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def hashes_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None
