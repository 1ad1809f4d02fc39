"""`canary serve --admin HOST:PORT`: the API process's /healthz and /metrics on a
thread of their own (decision 0062).

The API's own routes share the event loop with the controller's rounds, so they
answer only between its steps. This listener answers from another thread: /healthz
from the loop's heartbeat (503 past the bound, as the collector's), /metrics from
the app's registry with the admin token (kernel/admin_access.py). /readyz stays on
the API: it pings the database and etcd, which are the loop's.

The registry's collectors read background parts' state that the loop mutates; a
rendering that meets a dictionary changing under it is tried again, and a scrape
that still fails is answered 503 rather than a partial page.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter

from controlplane.kernel.admin_access import allowed, header, warn_if_exposed
from controlplane.kernel.admin_thread import AdminThread, Answer, Heartbeat, liveness
from controlplane.kernel.exposition import render
from controlplane.runtime import Backends

log = logging.getLogger("canary.api.admin")
RENDER_TRIES = 3


def respond(
    registry: CollectorRegistry, heartbeat: Heartbeat, token: str | None, unauthorized: Counter
) -> Callable[[str, bytes], Answer]:
    def answer(path: str, head: bytes) -> Answer:
        if not allowed(path, header(head, b"authorization"), token):
            unauthorized.inc()
            return Answer(401, b"unauthorized\n",
                          headers='WWW-Authenticate: Bearer realm="canary-admin"\r\n')
        if path == "/healthz":
            return liveness(heartbeat.age(), heartbeat.bound)
        if path == "/metrics":
            for _ in range(RENDER_TRIES):
                try:
                    return Answer(200, render(registry), CONTENT_TYPE_LATEST)
                except RuntimeError:  # a collector's dict changed while it was read
                    continue
            return Answer(503, b"metrics changed while rendered: try again\n")
        return Answer(404, b"not found\n")

    return answer


def beating(heartbeat: Heartbeat) -> Callable[[Backends], Awaitable[None]]:
    """The heartbeat as a background task of the API's lifespan (its loop)."""

    async def heartbeat_task(backends: Backends) -> None:
        await heartbeat.run()

    return heartbeat_task


def serve_api_admin(
    registry: CollectorRegistry, heartbeat: Heartbeat, host: str, port: int,
    *, token: str | None,
) -> AdminThread:
    """Listening on host:port (OSError if it cannot bind)."""
    warn_if_exposed(host, token, log, "API")
    unauthorized = Counter("canary_api_admin_unauthorized",
                           "Admin listener requests refused for a missing or wrong bearer token",
                           registry=registry)  # fmt: skip
    admin = AdminThread(respond(registry, heartbeat, token, unauthorized),
                        name="canary-api-admin")  # fmt: skip
    admin.start(host, port)
    registry.register(admin.metrics_collector("canary_api"))
    return admin
