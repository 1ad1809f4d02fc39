"""Key names shared by every part (architecture §4 and §5): one place to spell them.

Experiment ids and service names reach this module from sample batches, i.e. from
whoever can write to Redis. Both have one pattern each, defined here, checked before
any key is formatted from them: a key never carries `../`, braces (which would move
it to another Redis Cluster hash slot) or kilobytes of attacker bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.values import EXPERIMENT_ID_PATTERN, SERVICE_PATTERN

# ids the control plane assigns are integers; hand-written routes may use short names
EXPERIMENT_ID_MAX = 64
EXPERIMENT_ID = re.compile(EXPERIMENT_ID_PATTERN)
SERVICE_NAME_MAX = 63
SERVICE_NAME = re.compile(SERVICE_PATTERN)
# a controller's identity (host-pid by default) names its member key
CONTROLLER_IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def is_experiment_id(value: str) -> bool:
    """Does `value` match the experiment-id pattern (bounded length, no separators)?"""
    return len(value) <= EXPERIMENT_ID_MAX and EXPERIMENT_ID.fullmatch(value) is not None


def is_service_name(value: str) -> bool:
    return len(value) <= SERVICE_NAME_MAX and SERVICE_NAME.fullmatch(value) is not None


def _checked(kind: str, value: str, valid: bool) -> str:
    if not valid:
        # the value itself is not echoed: it may be anything a Redis writer sent
        raise ValidationFailed(f"malformed {kind} ({len(value)} characters) refused as a key")
    return value


@dataclass(frozen=True)
class EtcdKeys:
    prefix: str = "/canary"

    @property
    def rules_prefix(self) -> str:
        return f"{self.prefix}/rules/"

    @property
    def routes_prefix(self) -> str:
        return f"{self.prefix}/routes/"

    @property
    def overload_prefix(self) -> str:
        return f"{self.prefix}/overload/"

    @property
    def windows_prefix(self) -> str:
        return f"{self.prefix}/windows/"

    def window(self, experiment: str | int) -> str:
        """The window rule of an experiment with a rule of its own (kernel.window_rules)."""
        text = str(experiment)
        return f"{self.windows_prefix}{_checked('experiment id', text, is_experiment_id(text))}"

    def rule(self, service: str) -> str:
        return f"{self.rules_prefix}{service}"

    def route(self, service: str) -> str:
        return f"{self.routes_prefix}{service}"

    def overload(self, service: str) -> str:
        """The service's overload protection (kernel.overload)."""
        return f"{self.overload_prefix}{service}"

    @property
    def election(self) -> str:
        return f"{self.prefix}/election/controller"

    @property
    def controllers_prefix(self) -> str:
        """Sharded controllers (decision 0057): members and shard owners below."""
        return f"{self.prefix}/controllers/"

    @property
    def controller_members_prefix(self) -> str:
        return f"{self.controllers_prefix}members/"

    @property
    def controller_shards_prefix(self) -> str:
        return f"{self.controllers_prefix}shards/"

    def controller_member(self, identity: str) -> str:
        """A replica's member key, under its lease."""
        valid = CONTROLLER_IDENTITY.fullmatch(identity) is not None
        return f"{self.controller_members_prefix}{_checked('controller identity', identity, valid)}"

    def controller_shard(self, shard: int) -> str:
        """The owner key of a shard, under its owner's lease."""
        if not 0 <= shard < 10_000:
            raise ValidationFailed(f"shard {shard} out of range")
        return f"{self.controller_shards_prefix}{shard:04d}"

    def service_of(self, key: str, prefix: str) -> str:
        return key[len(prefix):]


@dataclass(frozen=True)
class RedisKeys:
    namespace: str = "canary"

    def samples(self, service: str) -> str:
        _checked("service name", service, is_service_name(service))
        return f"{self.namespace}:samples:{{{service}}}"

    def source_seq(self, service: str, source: str) -> str:
        """The last batch seq appended from `source` to the service's samples stream;
        `source` must already match the codec's pattern (no braces)."""
        _checked("service name", service, is_service_name(service))
        return f"{self.namespace}:seq:{{{service}}}:{source}"

    def stats(self, experiment: str | int) -> str:
        text = str(experiment)
        _checked("experiment id", text, is_experiment_id(text))
        return f"{self.namespace}:stats:{{{text}}}"

    def route_reports(self, service: str) -> str:
        """The data planes' reports of the route they hold (kernel.route_reports)."""
        _checked("service name", service, is_service_name(service))
        return f"{self.namespace}:inforce:{{{service}}}"

    @property
    def decisions(self) -> str:
        return f"{self.namespace}:decisions"

    @property
    def alarms(self) -> str:
        """The collectors' alarms of canaries that turned worse (kernel.alarms)."""
        return f"{self.namespace}:alarms"

    @property
    def samples_pattern(self) -> str:
        return f"{self.namespace}:samples:*"

    def service_of_samples(self, key: str) -> str:
        return key[len(f"{self.namespace}:samples:{{") : -1]


COLLECTOR_GROUP = "collectors"
