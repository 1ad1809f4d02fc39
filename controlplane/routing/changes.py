"""The wake-up after a committed route change: which services to reconcile now.

Whoever commits a desired route (the API, the controller) calls `notify(service)`
after the commit, and whoever commits a breaker rule or overload config
`notify_configs()`; the leader's reconciler in the same process wakes at once. Across
replicas the same calls come from PostgreSQL's NOTIFY (db.listen). A process that
does not lead collects names no one takes, so the set is bounded: past
MAX_PENDING names it asks for one full pass instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

MAX_PENDING = 1_024


@dataclass(frozen=True)
class Wake:
    """What to reconcile: these services, or every one (`full`); and the services'
    configs (`configs`, always with `full`)."""

    services: frozenset[str]
    full: bool
    configs: bool = False


@dataclass
class RouteChanges:
    _pending: set[str] = field(default_factory=set)
    _full: bool = False
    _configs: bool = False
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self, service: str) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._pending.clear()
            self._full = True
        elif not self._full:
            self._pending.add(service)
        self._event.set()

    def notify_configs(self) -> None:
        self._configs = True
        self._event.set()

    def notify_all(self) -> None:
        self._pending.clear()
        self._full = True
        self._event.set()

    def take_services(self) -> frozenset[str]:
        """The services notified since the last call or wait, taken without waiting;
        none while a full pass is asked (it covers them). A config or full notice
        stays for the next `wait`."""
        if self._full or not self._pending:
            return frozenset()
        taken, self._pending = frozenset(self._pending), set()
        if not self._configs:
            self._event.clear()
        return taken

    async def wait(self, timeout: float) -> Wake:
        """The changes notified since the last call, waiting up to `timeout` seconds
        for one; an empty Wake when none came."""
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._event.wait()
        self._event.clear()
        wake = Wake(frozenset(self._pending), self._full, self._configs or self._full)
        self._pending, self._full, self._configs = set(), False, False
        return wake
