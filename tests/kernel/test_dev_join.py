"""The join file `canary dev` writes and data planes read: strict, loopback only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.kernel.dev_join import (
    DevJoin,
    in_process_backends,
    parse_join,
    read_join,
    write_join,
)
from controlplane.kernel.errors import ConfigError

GOOD: dict[str, Any] = {
    "version": 1, "etcd": "127.0.0.1:2379", "etcd_prefix": "/canary",
    "redis_url": "redis://127.0.0.1:6379/0", "sample_keys_file": "/tmp/keys",
    "api": "http://127.0.0.1:8080",
}


def test_a_written_join_file_reads_back_and_is_private(tmp_path: Path) -> None:
    join = parse_join(json.dumps(GOOD), source="f")
    path = tmp_path / "join.json"
    write_join(path, join)
    assert read_join(path) == join
    assert path.stat().st_mode & 0o777 == 0o600
    assert join.settings() == {"etcd": "127.0.0.1:2379", "etcd_prefix": "/canary",
                               "redis_url": "redis://127.0.0.1:6379/0"}


@pytest.mark.parametrize(("change", "message"), [
    ({"extra": 1}, "unknown keys ['extra']"),
    ({"api": None}, "api must be a string"),
    ({"version": 2}, "version 2; this canary reads version 1"),
    ({"version": True}, "version True"),
    ({"etcd": "10.0.0.5:2379"}, "etcd must be a loopback HOST:PORT"),
    ({"etcd": "127.0.0.1:0"}, "etcd must be a loopback HOST:PORT"),
    ({"etcd": "nohost"}, "expected HOST:PORT"),
    ({"redis_url": "redis://cache.example:6379/0"}, "redis_url must be redis://LOOPBACK:PORT"),
    ({"redis_url": "rediss://127.0.0.1:6379/0"}, "redis_url must be"),
    ({"redis_url": "redis://127.0.0.1:99999/0"}, "redis_url must be"),
    ({"sample_keys_file": "keys"}, "sample_keys_file must be an absolute path"),
    ({"etcd_prefix": "canary"}, "etcd_prefix must start with '/'"),
    ({"api": "ftp://x"}, "api must be an http(s) URL"),
    ({"api": "http://x\n"}, "api holds control characters"),
    ({"api": "x" * 2000}, "api must be a string of 1-1024 characters"),
])
def test_a_join_file_is_refused_with_one_line(change: dict[str, Any], message: str) -> None:
    data = {**GOOD, **change}
    with pytest.raises(ConfigError) as caught:
        parse_join(json.dumps(data), source="join file f")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("join file f: ") or "HOST:PORT" in str(caught.value)


def test_a_missing_key_and_non_json_are_refused() -> None:
    partial = {k: v for k, v in GOOD.items() if k != "redis_url"}
    with pytest.raises(ConfigError, match=r"missing keys \['redis_url'\]"):
        parse_join(json.dumps(partial), source="f")
    with pytest.raises(ConfigError, match="not a JSON join file"):
        parse_join("etcd=1", source="f")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        parse_join("[1]", source="f")


def test_a_large_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "join.json"
    path.write_text(" " * 5000)
    with pytest.raises(ConfigError, match="larger than 4096 bytes"):
        read_join(path)


@pytest.mark.parametrize(("etcd", "redis", "expected"), [
    ("memory://", "memory://", ["etcd", "Redis"]),
    ("127.0.0.1:2379", "MEMORY://", ["Redis"]),
    ("memory://", "redis://127.0.0.1:6379/0", ["etcd"]),
    ("127.0.0.1:2379", "redis://127.0.0.1:6379/0", []),
])
def test_in_process_backends_are_named(etcd: str, redis: str, expected: list[str]) -> None:
    assert in_process_backends(etcd, redis) == expected


def test_dev_join_is_frozen() -> None:
    join = DevJoin(**{k: v for k, v in GOOD.items() if k != "version"})
    with pytest.raises(AttributeError):
        join.etcd = "x"  # type: ignore[misc]
