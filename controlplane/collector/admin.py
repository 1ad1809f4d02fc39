"""The collector's admin endpoints, answered on a thread of their own (decision 0062).

/healthz: the collector's main loop has beaten its heartbeat within the bound (503
and its age otherwise); /readyz: the configuration is loaded and the loop has
completed a round within READY_STALE_SEC (its body adds "samples unauthenticated"
while no sample keys are configured); /metrics: Prometheus text. With a token,
/metrics needs it (kernel/admin_access.py), and refusals are counted.

Everything read here is read from the admin thread: plain attributes the main loop
writes (an asyncio.Event's flag, a float, a bool) and the metrics registry, which
locks its own state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST

from controlplane.collector.service import Collector
from controlplane.kernel.admin_access import allowed, header, warn_if_exposed
from controlplane.kernel.admin_thread import AdminThread, Answer, Heartbeat, Limits, liveness

log = logging.getLogger("canary.collector")
READY_STALE_SEC = 10.0


def respond(
    collector: Collector, heartbeat: Heartbeat, token: str | None
) -> Callable[[str, bytes], Answer]:
    def answer(path: str, head: bytes) -> Answer:
        if not allowed(path, header(head, b"authorization"), token):
            collector.metrics.admin_unauthorized.inc()
            return Answer(401, b"unauthorized\n",
                          headers='WWW-Authenticate: Bearer realm="canary-admin"\r\n')
        if path == "/healthz":
            return liveness(heartbeat.age(), heartbeat.bound)
        if path == "/readyz":
            last = collector.last_loop_ok
            fresh = last is not None and collector.clock.monotonic() - last < READY_STALE_SEC
            ready = collector.config_loaded.is_set() and fresh
            body = b"ready" if ready else b"not ready"
            body += b"\n" if collector.authenticated else b" (samples unauthenticated)\n"
            return Answer(200 if ready else 503, body)
        if path == "/metrics":
            return Answer(200, collector.metrics.exposition(), CONTENT_TYPE_LATEST)
        return Answer(404, b"not found\n")

    return answer


def serve_admin(
    collector: Collector,
    host: str,
    port: int,
    *,
    token: str | None = None,
    heartbeat: Heartbeat | None = None,
    limits: Limits | None = None,
) -> AdminThread:
    """The admin endpoints listening on host:port (OSError if it cannot bind).
    `heartbeat` is the one the collector's loop beats; without it, one of the
    collector's clock that nothing beats (a caller that runs no loop)."""
    warn_if_exposed(host, token, log, "collector")
    beat = heartbeat or Heartbeat(collector.clock)
    admin = AdminThread(respond(collector, beat, token), limits=limits,
                        name="canary-collector-admin")
    admin.start(host, port)
    collector.metrics.registry.register(admin.metrics_collector("canary_collector"))
    return admin
