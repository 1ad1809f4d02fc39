"""File descriptors: how many the process may open, and how many clients that allows.

Every client connection is one descriptor, and one more while its request holds an
upstream connection. Without a cap, enough idle clients exhaust the descriptors; then
accept() fails on every listener, the admin endpoints' included (asyncio retries
each second, uvloop stops listening for good). So the proxy caps its clients below
what the descriptor limit allows, keeping a reserve for the pools, the admin
listener, Redis, etcd and logs.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from typing import Any

# descriptors kept out of the clients' share: listeners, admin connections, Redis,
# etcd, log files, idle pooled upstream connections beyond the clients' own
FD_RESERVE = 256
DEFAULT_MAX_CONNECTIONS = 10_000


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as far as allowed); the soft
    limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):  # e.g. capped by the kernel's nr_open
            pass
    return int(soft) if soft != resource.RLIM_INFINITY else 1_048_576


def connection_capacity(fd_limit: int) -> int:
    """The most client connections `fd_limit` descriptors carry: each may hold an
    upstream connection as well, and the reserve stays free."""
    return max(1, (fd_limit - FD_RESERVE) // 2)


def default_max_connections(fd_limit: int) -> int:
    return min(DEFAULT_MAX_CONNECTIONS, connection_capacity(fd_limit))


class RateLimitedLog:
    """Logs at most once per `interval` seconds, saying how many were held back."""

    __slots__ = ("_interval", "_last", "_logger", "_now", "_suppressed")

    def __init__(
        self, logger: logging.Logger, now: Callable[[], float], interval: float = 10.0
    ) -> None:
        self._logger = logger
        self._now = now
        self._interval = interval
        self._last: float | None = None
        self._suppressed = 0

    def warning(self, message: str, *args: Any) -> None:
        now = self._now()
        if self._last is not None and now - self._last < self._interval:
            self._suppressed += 1
            return
        if self._suppressed:
            message += " (%d more like it since the last report)"
            args = (*args, self._suppressed)
        self._last = now
        self._suppressed = 0
        self._logger.warning(message, *args)
