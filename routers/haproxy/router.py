"""`HaproxyRouter`: the TrafficRouter (routers/seam.py) of a HAProxy started from
`render.py`'s base config, steered through its stats socket with no reload.

`apply` checks the route against the base config (plan.targets), resolves the
upstream hosts (HAProxy's `set server … addr` takes an IP), then runs the plan:
servers ready, the map committed as one version (`prepare map` / `add map @v` /
`commit map @v`, so no request sees half a route), the map read back with `show
map` to confirm, unused servers to maintenance. The map value carries the agent's
log token (`log_token`), which HAProxy logs with every line of the route. Each step
is idempotent, so a lost socket or a refused command retries the whole sequence
with the project's backoff, then raises RouterError; HAProxy keeps the last state
it committed.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.routes import Route
from routers.haproxy import route_value
from routers.haproxy.plan import Plan, PlanError, Target, plan, targets
from routers.haproxy.render import BaseConfig
from routers.haproxy.runtime import CommandRefused, RuntimeApiError, StatsSocket
from routers.samples.token import LogToken
from routers.seam import InForce, RouterError

DEFAULT_ATTEMPTS = 4
DEFAULT_BACKOFF = BackoffPolicy(initial=0.1, maximum=1.0)
RESOLVE_TIMEOUT = 2.0

_T = TypeVar("_T")


class HaproxyRouter:
    """Puts routes in force in one HAProxy (one service) through its stats socket."""

    def __init__(
        self,
        cfg: BaseConfig,
        *,
        log_token: LogToken,
        stats: StatsSocket | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        draw: Callable[[], float] = random.random,
        resolve_timeout: float = RESOLVE_TIMEOUT,
        min_interval: float = 0.0,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.cfg = cfg
        self._log_token = log_token
        self.stats = stats or StatsSocket(cfg.stats_socket)
        self._attempts = attempts
        self._backoff = backoff
        self._sleep = sleep
        self._draw = draw
        self._resolve_timeout = resolve_timeout
        self._min_interval = min_interval

    @property
    def kind(self) -> str:
        return "haproxy"

    @property
    def min_interval(self) -> float:
        return self._min_interval

    async def apply(self, route: Route | None) -> None:
        try:
            wanted = targets(route, self.cfg)
        except PlanError as exc:
            raise RouterError(str(exc)) from None
        addresses = {t.variant: await self._resolve(t) for t in wanted}
        steps = plan(route, self.cfg, addresses, self._log_token)
        await self._retrying("apply the route", lambda: self._put(steps))

    async def in_force(self) -> InForce:
        return await self._retrying("read the route in force", self._read)

    async def close(self) -> None:
        """Nothing held: every command has its own connection."""

    async def proxy_figures(self) -> dict[str, float]:
        """HAProxy's own count of log lines it could not send (`show info`
        DroppedLogs): with the agent's count of what the kernel dropped, every lost
        line is accounted for."""
        try:
            info = await self.stats.command("show", "info")
        except RuntimeApiError:
            return {}
        for line in info.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == "DroppedLogs" and value.strip().isdigit():
                return {"dropped_log_lines": float(value.strip())}
        return {}

    async def _put(self, steps: Plan) -> None:
        for step in steps.ready:
            if step.address is not None:
                ip, port = step.address
                await self.stats.set_server_addr(step.backend, step.server, ip, port)
            await self.stats.set_server_state(step.backend, step.server, step.state)
        path = self.cfg.map_path
        version = await self.stats.prepare_map(path)
        if steps.value is not None:
            await self.stats.add_map(version, path, route_value.KEY, steps.value)
        await self.stats.commit_map(version, path)
        entries = await self.stats.show_map(path)
        held = [(e.key, e.value) for e in entries]
        wanted = [] if steps.value is None else [(route_value.KEY, steps.value)]
        if held != wanted:
            raise CommandRefused("the map read back after commit is not the route sent")
        for step in steps.maint:
            await self.stats.set_server_state(step.backend, step.server, step.state)

    async def _read(self) -> InForce:
        entries = await self.stats.show_map(self.cfg.map_path)
        if not entries:
            return InForce(None, None)
        if len(entries) != 1 or entries[0].key != route_value.KEY:
            raise CommandRefused("the map holds entries the router did not write")
        try:
            decoded = route_value.decode(entries[0].value, len(self.cfg.variants))
        except ValueError as exc:
            raise CommandRefused(f"the map's route value is unreadable: {exc}") from None
        return InForce(decoded.experiment, decoded.revision)

    async def _retrying(self, what: str, step: Callable[[], Awaitable[_T]]) -> _T:
        backoff = Backoff(self._backoff, draw=self._draw)
        while True:
            try:
                return await step()
            except RuntimeApiError as exc:
                if backoff.failures + 1 >= self._attempts:
                    raise RouterError(
                        f"haproxy could not {what} after {self._attempts} attempts: {exc}"
                    ) from exc
                await self._sleep(backoff.next_delay())

    async def _resolve(self, target: Target) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._resolve_timeout):
                infos = await loop.getaddrinfo(
                    target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                )
        except (OSError, TimeoutError) as exc:
            raise RouterError(
                f"variant {target.variant}'s upstream host does not resolve: "
                f"{getattr(exc, 'strerror', None) or 'no answer in time'}"
            ) from None
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                return str(sockaddr[0]), target.port
        raise RouterError(f"variant {target.variant}'s upstream host has no IP address")


__all__ = ["DEFAULT_ATTEMPTS", "HaproxyRouter"]
