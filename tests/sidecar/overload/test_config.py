"""The overload config as read from etcd: strict, bounded, ordered."""

from __future__ import annotations

import json

import pytest

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.overload import (
    MAX_OVERLOAD_BYTES,
    OverloadConfig,
    ServiceOverload,
    parse_overload,
)


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
        b'{"statistic": "median"}',
        b'{"queue_standing_lifo": 1}',
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


def test_the_statistic_and_queue_order_are_stored_only_when_not_the_defaults() -> None:
    plain = ServiceOverload.model_validate({"service": "checkout"}).to_stored()
    assert b"statistic" not in plain and b"queue_standing_lifo" not in plain
    assert parse_overload(plain).statistic == "mean" and parse_overload(plain).queue_standing_lifo
    raw = {"statistic": "percentile", "percentile": 0.9, "queue_standing_lifo": False}
    stored = ServiceOverload.model_validate({"service": "checkout"} | raw).to_stored()
    config = parse_overload(stored)
    assert (config.statistic, config.percentile, config.queue_standing_lifo) == (
        "percentile",
        0.9,
        False,
    )


EXT = {"source": "http://127.0.0.1:9100/load", "light": 0.7, "heavy": 0.85, "severe": 0.95}


def test_signals_round_trip_and_are_stored_only_when_set() -> None:
    raw = {
        "hysteresis": 0.2,
        "signals": {
            "rate": {"light": 500, "heavy": 800, "severe": 1200},
            "external": EXT | {"interval_ms": 500, "on_failure": "heavy"},
        },
    }
    config = parse_overload(json.dumps(raw))
    assert parse_overload(config.model_dump_json()) == config
    assert config.signals.external is not None and config.signals.external.timeout_ms == 200
    stored = ServiceOverload.model_validate({"service": "checkout"}).to_stored()
    assert b"signals" not in stored and b"hysteresis" not in stored  # older sidecars read it
    stored = ServiceOverload.model_validate({"service": "checkout"} | raw).to_stored()
    assert parse_overload(stored) == config
    for source in ("file:/run/checkout/queue-depth", "nvml", "http://[::1]:80/x"):
        assert parse_overload({"signals": {"external": EXT | {"source": source}}})


@pytest.mark.parametrize(
    "signals",
    [
        {"rate": {"light": 0, "heavy": 1, "severe": 2}},
        {"rate": {"light": 3, "heavy": 2, "severe": 4}},
        {"rate": {"light": 1, "heavy": 2}},
        {"rate": {"light": 1, "heavy": 2, "severe": float("inf")}},
        {"rate": {"light": "1", "heavy": 2, "severe": 3}},
        {"rate": {"light": 1, "heavy": 2, "severe": 2e12}},
        {"external": EXT | {"source": "https://example.org/load"}},
        {"external": EXT | {"source": "ftp://example.org/load"}},
        {"external": EXT | {"source": "http:///load"}},
        {"external": EXT | {"source": "http://user:pw@host/load"}},
        {"external": EXT | {"source": "http://host:99999/load"}},
        {"external": EXT | {"source": "file://host/path"}},
        {"external": EXT | {"source": "file:relative"}},
        {"external": EXT | {"source": "http://host/a b"}},
        {"external": EXT | {"source": "http://169.254.169.254/latest/meta-data"}},
        {"external": EXT | {"source": "http://0xa9fea9fe/load"}},
        {"external": EXT | {"source": "http://[::ffff:127.0.0.1]:9100/load"}},
        {"external": EXT | {"source": "http://2130706433:9100/load"}},
        {"external": EXT | {"source": "nvml:0"}},
        {"external": EXT | {"source": "http://h/" + "x" * 2100}},
        {"external": EXT | {"timeout_ms": 2000, "interval_ms": 1000}},
        {"external": EXT | {"stale_after_ms": 100, "interval_ms": 1000}},
        {"external": EXT | {"on_failure": "panic"}},
        {"external": EXT | {"gpu": -1}},
        {"external": EXT | {"extra": 1}},
        {"surprise": {}},
    ],
)
def test_refuses_invalid_signals(signals: dict[str, object]) -> None:
    with pytest.raises(ValidationFailed):
        parse_overload({"signals": signals})


@pytest.mark.parametrize("hysteresis", [-0.1, 1.0, "0.1", None])
def test_refuses_invalid_hysteresis(hysteresis: object) -> None:
    with pytest.raises(ValidationFailed):
        parse_overload({"hysteresis": hysteresis})
