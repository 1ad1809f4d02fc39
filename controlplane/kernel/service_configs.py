"""A service's configs beside its route: its breaker rule (`rules/<service>`) and its
overload protection (`overload/<service>`).

SQL holds what each should be (db.service_configs); the leader's reconciler makes
etcd hold it. Both sides speak of a config through this module: its kind, its key,
how it is parsed from bytes or a stored document, and the bytes it is published as.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.overload import OverloadConfig, ServiceOverload, parse_overload
from controlplane.kernel.rules import BreakerRule, parse_rule

ServiceConfig = BreakerRule | OverloadConfig


class ConfigKind(StrEnum):
    RULE = "rule"
    OVERLOAD = "overload"

    def prefix(self, keys: EtcdKeys) -> str:
        return keys.rules_prefix if self is ConfigKind.RULE else keys.overload_prefix

    def key(self, keys: EtcdKeys, service: str) -> str:
        return keys.rule(service) if self is ConfigKind.RULE else keys.overload(service)

    @property
    def described(self) -> str:
        return "breaker rule" if self is ConfigKind.RULE else "overload protection"


def parse_config(kind: ConfigKind, service: str, raw: bytes | dict[str, Any]) -> ServiceConfig:
    """A config read from etcd or SQL; ValidationFailed when it is none, or a rule that
    names another service than the one it is kept for."""
    if kind is ConfigKind.OVERLOAD:
        return parse_overload(raw)
    rule = parse_rule(raw)
    if rule.service != service:
        raise ValidationFailed(f"the rule of {service!r} names service {rule.service!r}")
    return rule


def config_bytes(kind: ConfigKind, service: str, config: ServiceConfig) -> bytes:
    """The value published in etcd: what sidecars and controllers of this and the
    previous release read (fields at the defaults of late options left out)."""
    if isinstance(config, BreakerRule):
        return config.to_json().encode()
    return ServiceOverload.model_validate({**config.model_dump(), "service": service}).to_stored()


def config_document(kind: ConfigKind, service: str, config: ServiceConfig) -> dict[str, Any]:
    """The config as SQL keeps it and audit events carry it: the published JSON."""
    document: dict[str, Any] = json.loads(config_bytes(kind, service, config))
    return document
