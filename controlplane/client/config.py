"""The CLI's config file: which API, which token file, which CA (TOML).

    # ~/.config/canary/config.toml (or the file $CANARY_CONFIG names)
    api = "https://canary.example.com"
    token_file = "~/.config/canary/token"
    ca_file = "/etc/ssl/canary-ca.pem"

Each setting is the last resort: a flag wins, then the environment (CANARY_API,
CANARY_TOKEN / CANARY_TOKEN_FILE, CANARY_CA_FILE), then this file. It is read
strictly: an unknown key, a value of the wrong type or a file that is not TOML is a
one-line ConfigError naming the file. `CANARY_CONFIG` once named a token file; such
a file (one `cnry_…` line) is refused with the way to the new variable.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from controlplane.kernel.errors import ConfigError

CONFIG_ENV = "CANARY_CONFIG"
MAX_CONFIG_BYTES = 64 * 1024
MAX_VALUE_CHARS = 2048
KEYS = ("api", "token_file", "ca_file")


@dataclass(frozen=True)
class CliConfig:
    api: str | None = None
    token_file: Path | None = None
    ca_file: str | None = None


def config_home(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "canary"


def config_path(env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file, and whether it was named ($CANARY_CONFIG: it must exist)."""
    named = env.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser(), True
    return config_home(env) / "config.toml", False


def _string(data: Mapping[str, object], key: str, source: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_VALUE_CHARS:
        raise ConfigError(f"{source}: {key} must be a non-empty string")
    if not value.isprintable():
        raise ConfigError(f"{source}: {key} holds control characters")
    return value.strip()


def parse_config(text: str, *, source: str, base: Path) -> CliConfig:
    """A CliConfig from TOML text; relative paths are taken from the file's folder."""
    stripped = text.strip()
    if stripped.startswith("cnry_") and len(stripped.split()) == 1:
        raise ConfigError(
            f"{source} holds a token, not a config: {CONFIG_ENV} now names the CLI's config "
            "file (TOML); point CANARY_TOKEN_FILE at the token file instead (or set "
            "token_file in the config)"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not TOML: {exc}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {', '.join(KEYS)}")
    api = _string(data, "api", source)
    if api is not None:
        parts = urlsplit(api)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{source}: api must be an http:// or https:// URL, got {api!r}")
    token_file = _string(data, "token_file", source)
    ca_file = _string(data, "ca_file", source)

    def resolved(value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    ca_path = resolved(ca_file)
    return CliConfig(api=api, token_file=resolved(token_file),
                     ca_file=None if ca_path is None else str(ca_path))


def load_config(env: Mapping[str, str] | None = None) -> CliConfig:
    """The config in force: the file's settings, or none when no file is there."""
    env = os.environ if env is None else env
    path, named = config_path(env)
    if not named and not path.is_file():
        return CliConfig()
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the config file {path} ({CONFIG_ENV}): {exc.strerror}"
        ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the config file {path} is not UTF-8 text") from None
    return parse_config(text, source=f"the config file {path}", base=path.parent)
