"""Secrets from a file or a variable, and URLs with their passwords masked.

A secret file wins over a secret given inline: a file can be mounted from a secret
store with tight permissions, while a variable leaks into `ps e`, crash dumps and
child processes. Secret files are re-read on every call, so a rotated password is
picked up by the next (re-)authentication without a restart.

No error raised here ever carries the secret itself, only the file's name.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from controlplane.kernel.errors import ConfigError

# A password or token is a line, not a document: anything larger is a wrong path.
MAX_SECRET_BYTES = 4096
MASK = "***"


def read_bounded_file(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """A configuration file's bytes, refused past `max_bytes`: a key, certificate or
    key set is small, and a wrong path (a log, a device) must not be read whole."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise ConfigError(f"{what}: {path} is larger than {max_bytes} bytes")
    return raw


def read_secret_file(path: str, *, what: str) -> str:
    """The first line of a secret file, without its line ending; never empty."""
    raw = read_bounded_file(path, what=what, max_bytes=MAX_SECRET_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: {path} is not UTF-8 text") from None
    lines = text.splitlines()
    if len(lines) > 1 and any(line.strip() for line in lines[1:]):
        raise ConfigError(f"{what}: {path} must hold one line")
    secret = lines[0].strip() if lines else ""
    if not secret:
        raise ConfigError(f"{what}: {path} is empty")
    return secret


def secret_from(*, value: str | None, file: str | None, what: str) -> str | None:
    """The file's secret if a file is named, else the inline value (None: neither)."""
    if file:
        return read_secret_file(file, what=what)
    return value or None


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***, for logs and error messages."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        # unparseable: show the scheme at most, never what might be credentials
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"{scheme}://{MASK}" if scheme else MASK
    if password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    netloc = f"{user}:{MASK}@{hostinfo}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def url_password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None
