"""Where the CLI finds its API token: `--token-file`, else CANARY_TOKEN, else the file
CANARY_TOKEN_FILE names, else the config file's `token_file` (client/config.py), else
~/.config/canary/token. None: send no token.

A token file holds the token on one line; anything else in it is refused.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from controlplane.client.config import config_home
from controlplane.kernel.errors import ConfigError

MAX_FILE_BYTES = 4096
MAX_TOKEN_CHARS = 16 * 1024  # an OIDC JWT may be long; our own tokens are ~50


TOKEN_FILE_ENV = "CANARY_TOKEN_FILE"


def default_token_path(env: Mapping[str, str]) -> Path:
    return config_home(env) / "token"


def check_token(text: str, source: str) -> str:
    token = text.strip()
    if not token or len(token) > MAX_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(f"{source} does not hold one token on one line")
    if not token.isascii() or not token.isprintable():
        raise ConfigError(f"{source} holds characters a token cannot have")
    return token


def read_token_file(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
            mode = os.fstat(handle.fileno()).st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"the token file {path} is larger than {MAX_FILE_BYTES} bytes")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"canary: warning: {path} is readable by others (chmod 600 it)", file=sys.stderr)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"the token file {path} is not ASCII text") from None
    return check_token(text, f"the token file {path}")


def find_token(
    token_file: Path | None,
    env: Mapping[str, str] | None = None,
    *,
    config_token_file: Path | None = None,
) -> str | None:
    env = os.environ if env is None else env
    if token_file is not None:
        return read_token_file(token_file.expanduser())
    given = env.get("CANARY_TOKEN")
    if given:
        return check_token(given, "CANARY_TOKEN")
    named = env.get(TOKEN_FILE_ENV)
    if named:
        return read_token_file(Path(named).expanduser())
    if config_token_file is not None:
        return read_token_file(config_token_file)
    default = default_token_path(env)
    if default.is_file():
        return read_token_file(default)
    return None
