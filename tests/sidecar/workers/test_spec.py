"""The line a supervisor hands its worker is parsed strictly."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sidecar.workers.spec import MAX_SPEC_BYTES, WorkerSpec

SPEC = WorkerSpec(
    index=1, service="shop", host="127.0.0.1", port=8080, admin_socket="/run/w1.sock",
    settings={"etcd": "127.0.0.1:2379"}, connect_timeout=2.0, read_timeout=30.0,
    head_timeout=10.0, tunnel_idle_timeout=300.0,
)  # fmt: skip


def test_a_spec_survives_its_line() -> None:
    line = SPEC.to_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert WorkerSpec.from_line(line) == SPEC


@pytest.mark.parametrize(
    "change",
    [
        {"surprise": 1},  # unknown field
        {"port": "8080"},  # a number as a string
        {"port": 0},
        {"port": 70000},
        {"index": -1},
        {"connect_timeout": 0},
        {"force_header_enabled": "yes"},
        {"settings": {"etcd": 5}},
        {"listen_fd": -3},
        {"max_connections_per_client": -1},
        {"client_ipv6_prefix": 16},
        {"max_headers": 0},
        {"tls_handshake_timeout": 0},
    ],
)
def test_a_malformed_spec_is_refused(change: dict[str, object]) -> None:
    fields = {**json.loads(SPEC.to_line()), **change}
    with pytest.raises(ValidationError):
        WorkerSpec.from_line(json.dumps(fields).encode() + b"\n")


@pytest.mark.parametrize(
    "line",
    [b"", b"{}", SPEC.to_line().rstrip(b"\n"), b" " * MAX_SPEC_BYTES + SPEC.to_line()],
)
def test_anything_but_one_bounded_line_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError):
        WorkerSpec.from_line(line)
