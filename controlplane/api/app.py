"""The FastAPI application: `create_app(settings)` builds one, its lifespan opens the
backends (or takes already-open ones) and runs the background services.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from controlplane.api import metrics, pages, problems, security
from controlplane.api.deps import get_settings
from controlplane.api.hygiene.body_limit import BodyLimitMiddleware
from controlplane.api.hygiene.header_count import HeaderCountMiddleware
from controlplane.api.hygiene.json_writes import JsonWritesMiddleware
from controlplane.api.hygiene.methods import MethodsMiddleware
from controlplane.api.hygiene.page_headers import PageHeadersMiddleware
from controlplane.api.hygiene.trusted_hosts import TrustedHostsMiddleware
from controlplane.api.routes import (
    experiments,
    health,
    history,
    identity,
    judge,
    notifications,
    overload,
    releases,
    rules,
    tokens,
)
from controlplane.auth.oidc import OidcVerifier
from controlplane.kernel.clock import Clock
from controlplane.kernel.settings import Settings
from controlplane.runtime import (
    Backends,
    Background,
    BackgroundService,
    open_backends,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)


@asynccontextmanager
async def _running(services: Sequence[Background], backends: Backends) -> AsyncIterator[None]:
    """Start the services in order, stop them in reverse; plain coroutines run as tasks.

    Plain asyncio tasks rather than a task group: a lifespan may be entered and left
    from different tasks (test harnesses do), which a task group does not allow.
    """
    started: list[BackgroundService] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for service in services:
            if isinstance(service, BackgroundService):
                await service.start(backends)
                started.append(service)
            else:
                name = getattr(service, "__name__", "background")
                tasks.append(asyncio.create_task(_log_failure(service(backends), name)))
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for service in reversed(started):
            try:
                await service.stop()
            except Exception:
                log.exception("stopping %r failed", service)


async def _log_failure(work: Awaitable[None], name: str) -> None:
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("background service %s failed", name)
        raise


def create_app(
    settings: Settings,
    *,
    backends: Backends | None = None,
    clock: Clock | None = None,
    services: Sequence[Background] = (),
    streams: bool = False,
    insecure: bool = False,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """The API for `settings`.

    backends: already-open backends to share (in-process KV and bus in `canary dev`);
        the app then leaves closing them to the caller. Otherwise the lifespan opens the
        database and the KV store (and the streams if `streams`) and closes them.
    services: background parts (controller, collector) run for the app's lifetime,
        each given the same Backends.
    insecure: serve requests without credentials as `anonymous` admin (only ever from
        an explicit `--insecure`; nothing in the environment turns it on).
    tracer_provider: trace every request into it (`controlplane.tracer`); None: off.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = backends is None
        opened = backends or await open_backends(settings, clock=clock, streams=streams)
        app.state.backends = opened
        try:
            async with _running(services, opened):
                yield
        finally:
            await app.state.auth.aclose()
            app.state.backends = None
            if owned:
                await opened.close()

    app = FastAPI(
        title="canary control plane",
        version="1",
        summary="Canary releases with circuit breaking: experiments, routes and rules.",
        lifespan=lifespan,
        # served by controlplane.api.pages from the package: the defaults load a CDN
        docs_url=None,
        redoc_url=None,
    )
    app.state.backends = None
    app.dependency_overrides[get_settings] = lambda: settings
    exported = metrics.ApiMetrics()
    exported.insecure.set(1 if insecure else 0)
    app.state.auth = security.Authenticator(
        insecure=insecure,
        oidc=OidcVerifier.from_settings(
            settings,
            clock=clock or (backends.clock if backends is not None else None),
            counters=exported,
        ),
        failures=exported.auth_failures,
    )
    # added innermost first: a request meets the metrics, then the field count, Host,
    # method, JSON, size, and the pages' headers on the way out
    app.add_middleware(
        PageHeadersMiddleware, prefixes=(pages.UI_PREFIX, pages.DOCS_PATH, pages.FAVICON_PATH)
    )
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        reject=exported.reject,
        larger={"/v1/judge": judge.MAX_BODY_BYTES},
    )
    app.add_middleware(
        JsonWritesMiddleware, reject=exported.reject, credentials_required=not insecure
    )
    app.add_middleware(MethodsMiddleware, routes=app.router.routes, reject=exported.reject)
    app.add_middleware(
        TrustedHostsMiddleware, trusted=settings.trusted_host_list, reject=exported.reject
    )
    app.add_middleware(HeaderCountMiddleware, reject=exported.reject)
    problems.install(app)
    metrics.install(app, exported)
    if tracer_provider is not None:  # outermost: refusals are traced too
        from controlplane.api.tracing import TracingMiddleware

        app.add_middleware(TracingMiddleware, tracer=tracer_provider.get_tracer("canary.api"))
    for service in services:
        exported.export(service)
    for router in (
        health.router,
        experiments.router,
        history.router,
        rules.router,
        releases.router,
        overload.router,
        judge.router,
        tokens.router,
        notifications.router,
        identity.router,
    ):
        app.include_router(router)
    # the schema, the docs and the dashboard's pages hold no data: their scripts call
    # the API with the user's token, and every data route needs a role
    open_pages = [p for p in (app.openapi_url,) if p] + pages.install(app)
    security.check_guarded(app, open_pages)
    security.document(app)
    return app
