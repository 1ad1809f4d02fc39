"""The key set that signs and verifies sample batches (see sample_auth.py).

Lines `kid:secret`, the secret in hex or base64, at least 32 bytes once decoded;
blank lines and `#` comments are skipped. The **first** key is the one sidecars sign
with; collectors accept every key listed. Rotation with one file everywhere: add the
new key as a second line, then move it first, then remove the old one.

From a file (`--sample-keys-file`, or `CANARY_SAMPLE_KEYS_FILE`) or from the
environment (`CANARY_SAMPLE_KEYS`, entries separated by commas or whitespace). A
secret never appears in an error message, a log line, a repr or a metric.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.secrets import read_bounded_file

MIN_KEY_BYTES = 32
MAX_KEYS = 16
MAX_FILE_BYTES = 64 * 1024
KID = re.compile(r"[A-Za-z0-9._-]{1,32}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
FILE_ENV = "CANARY_SAMPLE_KEYS_FILE"
KEYS_ENV = "CANARY_SAMPLE_KEYS"


@dataclass(frozen=True)
class SampleKey:
    kid: str
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class SampleKeys:
    """Keys by id; `current` signs. Its repr names the kids only."""

    keys: tuple[SampleKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("a sample key set needs at least one key")
        kids = [key.kid for key in self.keys]
        if len(set(kids)) != len(kids):
            raise ConfigError("sample key ids must be unique")

    def __repr__(self) -> str:
        return f"SampleKeys(kids={[key.kid for key in self.keys]!r})"

    @property
    def current(self) -> SampleKey:
        return self.keys[0]

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(key.kid for key in self.keys)


def _secret(text: str) -> bytes | None:
    """Hex when the text is only hex digits (even count), else strict base64."""
    if _HEX.fullmatch(text):
        return bytes.fromhex(text)
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None


def parse_sample_keys(text: str, *, origin: str) -> SampleKeys:
    """Parse `kid:secret` entries (one per line, or comma/space separated).

    ConfigError names the origin and entry number, never the secret.
    """
    entries = [
        part
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for part in re.split(r"[\s,]+", line)
        if part
    ]
    if len(entries) > MAX_KEYS:
        raise ConfigError(f"{origin}: {len(entries)} sample keys, at most {MAX_KEYS}")
    keys: list[SampleKey] = []
    for number, entry in enumerate(entries, start=1):
        kid, sep, encoded = entry.partition(":")
        if not sep or not KID.fullmatch(kid):
            raise ConfigError(
                f"{origin}: key {number}: expected kid:secret with a kid of 1-32 letters, "
                "digits, '.', '_' or '-'"
            )
        secret = _secret(encoded)
        if secret is None:
            raise ConfigError(f"{origin}: key {kid!r}: the secret is neither hex nor base64")
        if len(secret) < MIN_KEY_BYTES:
            raise ConfigError(
                f"{origin}: key {kid!r}: {len(secret)} bytes, at least {MIN_KEY_BYTES} needed"
            )
        keys.append(SampleKey(kid, secret))
    if not keys:
        raise ConfigError(f"{origin}: no sample keys")
    return SampleKeys(tuple(keys))


def load_sample_keys(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> SampleKeys | None:
    """The configured key set: `path` (a flag), else $CANARY_SAMPLE_KEYS_FILE, else
    $CANARY_SAMPLE_KEYS; None when none is set (samples travel unauthenticated)."""
    env = os.environ if environ is None else environ
    file = path if path is not None else env.get(FILE_ENV) or None
    if file is not None:
        where = Path(file)
        raw = read_bounded_file(where, what="sample keys file", max_bytes=MAX_FILE_BYTES)
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not ASCII text") from exc
        return parse_sample_keys(text, origin=str(where))
    inline = env.get(KEYS_ENV)
    if inline:
        return parse_sample_keys(inline, origin=KEYS_ENV)
    return None


def generate_sample_keys(kid: str = "embedded") -> SampleKeys:
    """A random key for one process that both signs and verifies (`canary dev`/`demo`)."""
    return SampleKeys((SampleKey(kid, secrets.token_bytes(MIN_KEY_BYTES)),))
