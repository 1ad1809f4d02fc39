"""One router agent process: follow the route, steer the proxy, turn its log into samples.

    etcd ─► RouteFollower ─► RouterAgent ─► TrafficRouter (nginx, haproxy)
    proxy access log ─UDP─► LogReceiver ─► LineParser ─► SampleReporter ─► Redis
    AdminServer: /healthz, /readyz (the proxy holds etcd's route), /status, /metrics

The process draws one log token at start (routers/samples/token.py) and hands it to
the router, which makes the proxy write it into every line, and to the parser,
which refuses a line without it as `forged`: the log port is open to any local
process, the token is not. The token is never logged nor shown in /status.

The reporter is the sidecar's own (`sidecar/reporter.py`): the same batches, the same
signing, the same bounded buffer while Redis is away. Nothing here is on a
request's path: the proxy serves whatever happens to the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import CollectorRegistry

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.route_reports import RouteReports
from controlplane.kernel.sample_auth import SampleSigner
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.streams import SampleStream
from routers.agent import RouterAgent
from routers.follow import RouteFollower
from routers.metrics import RouterCollector
from routers.samples.lines import LineParser
from routers.samples.receiver import LogReceiver
from routers.samples.token import LogToken
from routers.seam import TrafficRouter
from sidecar.admin import AdminServer, View
from sidecar.reporter import SampleReporter, instance_id
from sidecar.route_report import RouteReporter

log = logging.getLogger("canary.routers")

# the router is built once the receiver's address is known: the proxy's config names
# it; router and parser are given the process's one log token
RouterFactory = Callable[[tuple[str, int], LogToken], TrafficRouter]
ParserFactory = Callable[[LogToken], LineParser]


@dataclass(frozen=True, slots=True)
class AgentOptions:
    service: str
    etcd_prefix: str = "/canary"
    log_listen: tuple[str, int] = ("127.0.0.1", 0)
    first_route: float = 5.0  # start-up waits this long for the proxy to hold the route
    flush: float = 5.0  # the sample buffer gets this long at shutdown


class RouterProcess:
    """Build, start and stop the parts of one router agent."""

    def __init__(
        self,
        *,
        kv: KeyValueStore,
        stream: SampleStream,
        build_parser: ParserFactory,
        build_router: RouterFactory,
        options: AgentOptions,
        clock: Clock | None = None,
        sample_keys: SampleKeys | None = None,
        admin_token: str | None = None,
        source_tag: str = "router",
        warnings: Sequence[str] = (),
    ) -> None:
        self.options = options
        self.warnings = list(warnings)
        self.clock: Clock = clock or SystemClock()
        signer = SampleSigner(sample_keys) if sample_keys is not None else None
        self.reporter = SampleReporter(
            stream, options.service, clock=self.clock, signer=signer,
            source=instance_id(source_tag),
        )
        self._log_token = LogToken.generate()
        self.parser = build_parser(self._log_token)
        self.receiver = LogReceiver(
            self._line, host=options.log_listen[0], port=options.log_listen[1]
        )
        self._build_router = build_router
        self._kv = kv
        self._stream = stream
        self.route_reporter: RouteReporter | None = None
        self._admin_token = admin_token
        self.agent: RouterAgent | None = None
        self.admin: AdminServer | None = None
        self.proxy_figures: dict[str, float] = {}

    def _held_revision(self) -> int:
        """The revision the proxy holds: etcd's, once the agent read it back in force."""
        agent = self.agent
        if agent is None or not agent.in_step or agent.follower.desired is None:
            return 0
        return agent.follower.desired.revision

    async def _status(self) -> dict[str, Any]:
        assert self.agent is not None
        return {**await self.agent.status(), "warnings": self.warnings}

    def _line(self, datagram: bytes) -> None:
        sample = self.parser.parse(datagram)
        if sample is not None:
            self.reporter.record(*sample)

    async def start(self, admin: tuple[str, int] | None = None) -> None:
        self.receiver.start()
        router = self._build_router(self.receiver.address, self._log_token)
        follower = RouteFollower(
            self._kv, service=self.options.service, prefix=self.options.etcd_prefix
        )
        self.agent = RouterAgent(follower, router, clock=self.clock)
        if isinstance(self._stream, RouteReports):
            self.route_reporter = RouteReporter(
                self._stream, service=self.options.service, instance=self.reporter.source,
                held=self._held_revision, clock=self.clock,
            )  # fmt: skip
            self.route_reporter.start()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(
            RouterCollector(
                agent=self.agent, receiver=self.receiver, parser=self.parser,
                reporter=self.reporter, proxy_figures=lambda: self.proxy_figures,
            )
        )
        views: dict[str, View] = {"/status": self._status}
        self.admin = AdminServer(
            registry=registry,
            refresh=self._refresh_proxy_figures,
            ready=lambda: self.agent is not None and self.agent.in_step,
            token=self._admin_token,
            not_ready=b"not ready: the proxy does not hold the route etcd holds yet\n",
            views=views,
            warnings=self.warnings,
        )
        if admin is not None:
            await self.admin.start(*admin)
        self.reporter.start()
        self.agent.start()
        if not await self.agent.wait_in_step(self.options.first_route):
            log.warning(
                "%s router: the proxy does not hold the route yet (%s); retrying",
                router.kind,
                self.agent.stats.last_error or "etcd has not answered",
            )

    async def _refresh_proxy_figures(self) -> None:
        """What the proxy itself counts, for the next /metrics (routers that can say)."""
        if self.agent is None:
            return
        read = getattr(self.agent.router, "proxy_figures", None)
        if read is not None:
            self.proxy_figures = await read()

    async def stop(self) -> None:
        if self.route_reporter is not None:
            await self.route_reporter.stop()
        if self.agent is not None:
            await self.agent.stop()
            await self.agent.router.close()
        self.receiver.drain()
        self.receiver.close()
        await self.reporter.close(self.options.flush)
        if self.admin is not None:
            await self.admin.stop()


__all__ = ["AgentOptions", "ParserFactory", "RouterFactory", "RouterProcess"]
