"""Key names shared by every part (DESIGN §4 and §5): one place to spell them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EtcdKeys:
    prefix: str = "/canary"

    @property
    def rules_prefix(self) -> str:
        return f"{self.prefix}/rules/"

    @property
    def routes_prefix(self) -> str:
        return f"{self.prefix}/routes/"

    def rule(self, service: str) -> str:
        return f"{self.rules_prefix}{service}"

    def route(self, service: str) -> str:
        return f"{self.routes_prefix}{service}"

    @property
    def election(self) -> str:
        return f"{self.prefix}/election/controller"

    def service_of(self, key: str, prefix: str) -> str:
        return key[len(prefix):]


@dataclass(frozen=True)
class RedisKeys:
    namespace: str = "canary"

    def samples(self, service: str) -> str:
        return f"{self.namespace}:samples:{{{service}}}"

    def stats(self, experiment: str | int) -> str:
        return f"{self.namespace}:stats:{{{experiment}}}"

    @property
    def decisions(self) -> str:
        return f"{self.namespace}:decisions"

    @property
    def samples_pattern(self) -> str:
        return f"{self.namespace}:samples:*"

    def service_of_samples(self, key: str) -> str:
        return key[len(f"{self.namespace}:samples:{{"):-1]


COLLECTOR_GROUP = "collectors"
