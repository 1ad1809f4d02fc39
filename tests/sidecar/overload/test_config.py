"""The overload config as read from etcd: strict, bounded, ordered."""

from __future__ import annotations

import json

import pytest

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.overload import MAX_OVERLOAD_BYTES, OverloadConfig, parse_overload


def test_defaults_and_key() -> None:
    config = parse_overload(b"{}")
    assert config == OverloadConfig()
    assert config.enabled and config.shed_status == 429
    assert EtcdKeys("/canary").overload("checkout") == "/canary/overload/checkout"


def test_a_full_config_round_trips() -> None:
    raw = {
        "min_limit": 2,
        "max_limit": 64,
        "queue_timeout_ms": 20,
        "light_shed_share": 0.3,
        "shed_status": 503,
        "low_priority_paths": ["/batch/", "/reports"],
    }
    config = parse_overload(json.dumps(raw))
    assert parse_overload(config.model_dump_json()) == config
    assert config.low_priority_paths == ("/batch/", "/reports")


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"surprise": 1}',
        b'{"min_limit": 0}',
        b'{"max_limit": 1000001}',
        b'{"min_limit": 5, "max_limit": 4}',
        b'{"min_limit": "5"}',
        b'{"min_limit": 5.0}',
        b'{"enabled": "yes"}',
        b'{"rtt_buffer": NaN}',
        b'{"percentile": 0}',
        b'{"queue_timeout_ms": -1}',
        b'{"light_at": 2.0, "heavy_at": 1.5}',
        b'{"shed_status": 500}',
        b'{"shed_status": "429"}',
        b'{"low_priority_paths": ["batch"]}',
        b'{"low_priority_paths": ["/a b"]}',
        json.dumps({"low_priority_paths": [f"/{i}" for i in range(65)]}).encode(),
        b" " * (MAX_OVERLOAD_BYTES + 1),
    ],
)
def test_refuses_what_is_not_a_valid_config(raw: bytes) -> None:
    with pytest.raises(ValidationFailed):
        parse_overload(raw)
