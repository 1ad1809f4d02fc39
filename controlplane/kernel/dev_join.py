"""The join file `canary dev` writes so a sidecar or router joins it with one flag.

`canary dev` on local backends (real etcd and Redis children on loopback ports)
writes one small JSON object naming where they listen and the file holding the
sample key its embedded collector verifies with; `canary sidecar --join FILE` and
`canary router … --join FILE` read it instead of four flags (decision 0053).

The file is read strictly: one JSON object of exactly these keys, a version, loopback
addresses only (a development control plane never reaches past this machine), and a
bounded size. Anything else is a one-line ConfigError naming the file.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.secrets import read_bounded_file
from controlplane.kernel.settings import parse_host_port

JOIN_VERSION = 1
MAX_JOIN_BYTES = 4096
MAX_PATH_CHARS = 1024
_KEYS = frozenset({"version", "etcd", "etcd_prefix", "redis_url", "sample_keys_file", "api"})


@dataclass(frozen=True)
class DevJoin:
    """Where a `canary dev` control plane's backends listen."""

    etcd: str  # host:port on loopback
    etcd_prefix: str
    redis_url: str  # redis://127.0.0.1:PORT/0
    sample_keys_file: str  # absolute path of the kid:secret file
    api: str  # the API's base URL, for the CLI sentence a joiner prints

    def settings(self) -> dict[str, str]:
        """The kernel Settings fields the file stands for."""
        return {"etcd": self.etcd, "etcd_prefix": self.etcd_prefix, "redis_url": self.redis_url}

    def to_json(self) -> str:
        return json.dumps({"version": JOIN_VERSION, **asdict(self)}, indent=2, sort_keys=True)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _text(data: dict[str, object], key: str, source: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value or len(value) > MAX_PATH_CHARS:
        raise ConfigError(f"{source}: {key} must be a string of 1-{MAX_PATH_CHARS} characters")
    if not value.isprintable():
        raise ConfigError(f"{source}: {key} holds control characters")
    return value


def parse_join(text: str, *, source: str) -> DevJoin:
    """A DevJoin from the file's text, or a ConfigError naming `source`."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigError(f"{source}: not a JSON join file written by `canary dev`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    unknown, missing = set(data) - _KEYS, _KEYS - set(data)
    if unknown or missing:
        parts = ([f"unknown keys {sorted(unknown)}"] if unknown else []) + (
            [f"missing keys {sorted(missing)}"] if missing else []
        )
        raise ConfigError(f"{source}: {', '.join(parts)}")
    if data["version"] != JOIN_VERSION or isinstance(data["version"], bool):
        raise ConfigError(
            f"{source}: version {data['version']!r}; this canary reads version {JOIN_VERSION}"
        )
    etcd = _text(data, "etcd", source)
    host, port = parse_host_port(etcd)
    if not _loopback(host) or port == 0:
        raise ConfigError(f"{source}: etcd must be a loopback HOST:PORT, got {etcd!r}")
    redis_url = _text(data, "redis_url", source)
    redis_parts = urlsplit(redis_url)
    try:
        redis_port = redis_parts.port
    except ValueError:
        redis_port = None
    if (redis_parts.scheme != "redis" or not _loopback(redis_parts.hostname or "")
            or not redis_port):
        raise ConfigError(f"{source}: redis_url must be redis://LOOPBACK:PORT, got {redis_url!r}")
    api = _text(data, "api", source)
    if urlsplit(api).scheme not in ("http", "https"):
        raise ConfigError(f"{source}: api must be an http(s) URL, got {api!r}")
    keys_file = _text(data, "sample_keys_file", source)
    if not os.path.isabs(keys_file):
        raise ConfigError(f"{source}: sample_keys_file must be an absolute path")
    prefix = _text(data, "etcd_prefix", source)
    if not prefix.startswith("/"):
        raise ConfigError(f"{source}: etcd_prefix must start with '/'")
    return DevJoin(etcd=etcd, etcd_prefix=prefix, redis_url=redis_url,
                   sample_keys_file=keys_file, api=api)  # fmt: skip


def read_join(path: str | os.PathLike[str]) -> DevJoin:
    raw = read_bounded_file(path, what="join file", max_bytes=MAX_JOIN_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"join file {path}: not UTF-8 text") from None
    return parse_join(text, source=f"join file {path}")


def write_join(path: Path, join: DevJoin) -> None:
    """Write the file readable by its owner only (it names the sample key's file)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(join.to_json() + "\n")
    os.replace(tmp, path)


def in_process_backends(etcd: str, redis_url: str) -> list[str]:
    """Which of a data plane's backends are in-process (memory://): such a sidecar or
    router sees no route any control plane publishes, and its samples reach no
    collector."""
    found = []
    if etcd.strip().lower().startswith("memory:"):
        found.append("etcd")
    if redis_url.strip().lower().startswith("memory:"):
        found.append("Redis")
    return found


def in_process_warning(kind: str, backends: list[str]) -> str:
    """The loud line a data plane on in-process backends logs and shows in its status."""
    return (
        f"IN-PROCESS {' and '.join(backends)} (memory://): this {kind} is alone; it sees no "
        "route a control plane publishes (503 'no route in force') and its samples reach no "
        "collector. Join a control plane with --join FILE (the command `canary dev` prints) "
        "or give --etcd and --redis"
    )
