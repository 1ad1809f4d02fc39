"""Keeps one TrafficRouter in step with its service's route (the seam's driver).

    etcd routes/<service> ─► RouteFollower ─► RouterAgent ─► TrafficRouter.apply
                                                 │ coalesce: at most one apply per
                                                 │ router.min_interval, the latest route
                                                 ├ refused: the last route stays in force,
                                                 │ retried with the shared backoff
                                                 └ every `verify_every` s (1): what the proxy
                                                   holds is read back, and a proxy that
                                                   lost it (restarted) is given it again

The agent never decides and never writes a store: it applies what etcd holds. What
it reports (`status()`) is what the router says is in force, beside the route it is
trying to put there and the last error — the basis of /readyz and of the metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.kernel.backoff import Backoff, BackoffPolicy
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.routes import Route
from controlplane.kernel.tasks import cancel_and_wait
from routers.follow import RouteFollower
from routers.seam import InForce, RouterError, TrafficRouter

log = logging.getLogger("canary.routers")


def apply_delay(last_apply: float | None, min_interval: float, now: float) -> float:
    """Seconds to wait before the next apply: none when the last is old enough."""
    if last_apply is None:
        return 0.0
    return max(0.0, last_apply + min_interval - now)


@dataclass
class AgentStats:
    applied: int = 0
    apply_errors: int = 0
    coalesced: int = 0  # desired routes superseded before they were applied
    drift_repaired: int = 0  # the proxy held another route than the one applied
    verified: int = 0  # read-backs of what the proxy holds
    last_error: str | None = None
    applied_route: Route | None = None
    applied_at: float | None = None  # wall clock
    apply_seconds: list[float] = field(default_factory=list)  # recent, bounded

    def record_duration(self, seconds: float) -> None:
        self.apply_seconds.append(seconds)
        if len(self.apply_seconds) > 256:
            del self.apply_seconds[:128]


class RouterAgent:
    """Follows the route and applies it through one router, fail-static."""

    def __init__(
        self,
        follower: RouteFollower,
        router: TrafficRouter,
        *,
        clock: Clock | None = None,
        policy: BackoffPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        verify_every: float = 1.0,
    ) -> None:
        self.follower = follower
        self._verify_every = verify_every
        self.router = router
        self.stats = AgentStats()
        self._clock: Clock = clock or SystemClock()
        self._backoff = Backoff(policy or BackoffPolicy(initial=0.2, maximum=10.0))
        self._sleep = sleep
        self._applied_generation = 0
        self._has_applied = False
        self._last_apply: float | None = None  # monotonic
        self._task: asyncio.Task[None] | None = None
        self._in_step = asyncio.Event()

    @property
    def in_step(self) -> bool:
        """The route etcd holds is the one the router last put in force."""
        return self._has_applied and self._applied_generation == self.follower.generation

    def start(self) -> None:
        self.follower.start()
        self._task = asyncio.create_task(self._run(), name=f"router-agent:{self.router.kind}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await self.follower.stop()

    async def wait_in_step(self, timeout: float) -> bool:
        """Wait until the router holds the route etcd holds (tests, start-up)."""
        try:
            async with asyncio.timeout(timeout):
                while not self.in_step:
                    await self._in_step.wait()
        except TimeoutError:
            return self.in_step
        return True

    async def _run(self) -> None:
        attempted = 0  # the last generation an apply was tried for
        while True:
            if self.in_step or self.follower.generation == 0:
                current = self.follower.generation
                try:
                    async with asyncio.timeout(self._verify_every):
                        await self.follower.changed(current)
                except TimeoutError:
                    if self.in_step and not await self._still_held():
                        self._has_applied = False  # apply again below
                    else:
                        continue
            delay = apply_delay(self._last_apply, self.router.min_interval, self._clock.monotonic())
            if delay > 0:
                await self._sleep(delay)  # changes meanwhile are applied together below
            generation = self.follower.generation
            behind = max(attempted, self._applied_generation)
            self.stats.coalesced += max(0, generation - behind - 1)
            attempted = generation
            if not await self._apply(self.follower.desired, generation):
                await self._sleep(self._backoff.next_delay())

    async def _still_held(self) -> bool:
        """Whether the proxy still holds the route last applied (a restarted proxy
        comes back with its base config: no route, or an older one)."""
        wanted = InForce.of(self.stats.applied_route)
        self.stats.verified += 1
        try:
            held = await self.router.in_force()
        except RouterError as exc:
            self.stats.last_error = str(exc)
            return True  # cannot tell: applying blindly would not tell either
        except Exception:
            log.exception("%s router: reading what is in force failed", self.router.kind)
            return True
        if held == wanted:
            return True
        self.stats.drift_repaired += 1
        log.warning(
            "%s router: the proxy holds experiment %s revision %s, not %s: applying again",
            self.router.kind, held.experiment, held.revision, _describe(self.stats.applied_route),
        )  # fmt: skip
        return False

    async def _apply(self, route: Route | None, generation: int) -> bool:
        started = self._clock.monotonic()
        self._last_apply = started
        try:
            await self.router.apply(route)
        except RouterError as exc:
            self.stats.apply_errors += 1
            self.stats.last_error = str(exc)
            log.warning(
                "%s router: route %s not applied, the last one stays in force: %s",
                self.router.kind,
                _describe(route),
                exc,
            )
            return False
        except Exception as exc:  # a router bug must not end the agent
            self.stats.apply_errors += 1
            self.stats.last_error = f"unexpected error: {exc!r}"
            log.exception("%s router: applying %s failed", self.router.kind, _describe(route))
            return False
        self._backoff.reset()
        self.stats.applied += 1
        self.stats.last_error = None
        self.stats.applied_route = route
        self.stats.applied_at = self._clock.now()
        self.stats.record_duration(self._clock.monotonic() - started)
        self._applied_generation = generation
        self._has_applied = True
        self._in_step.set()
        self._in_step = asyncio.Event()
        log.info("%s router: %s in force", self.router.kind, _describe(route))
        return True

    async def status(self) -> dict[str, Any]:
        """What the proxy says it holds, what should be there, and the last error."""
        desired = self.follower.desired
        try:
            held: InForce | None = await self.router.in_force()
            read_error = None
        except RouterError as exc:
            held, read_error = None, str(exc)
        return {
            "router": self.router.kind,
            "service": self.follower.service,
            "desired": _in_force_json(InForce.of(desired)),
            "in_force": _in_force_json(held) if held is not None else None,
            "in_step": self.in_step,
            "last_error": self.stats.last_error or read_error,
            "applied": self.stats.applied,
            "apply_errors": self.stats.apply_errors,
            "coalesced": self.stats.coalesced,
            "drift_repaired": self.stats.drift_repaired,
            "verified": self.stats.verified,
            "etcd_connected": self.follower.stats.connected,
        }


def _in_force_json(held: InForce) -> dict[str, Any]:
    return {"experiment": held.experiment, "revision": held.revision}


def _describe(route: Route | None) -> str:
    if route is None:
        return "no route"
    weights = ", ".join(f"{v.name} {v.weight}" for v in route.variants)
    return f"experiment {route.experiment} revision {route.revision} ({weights})"


__all__ = ["AgentStats", "RouterAgent", "apply_delay"]
