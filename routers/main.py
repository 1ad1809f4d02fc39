"""Run one router agent until SIGTERM/SIGINT: open the stores, start, stop cleanly.

Only the kernel, the sidecar's reporter and admin server, and `routers/` are
imported: an agent never loads the API or the SQL layer.
"""

from __future__ import annotations

import asyncio
import logging

from controlplane.kernel.admin_access import admin_token
from controlplane.kernel.backend_access import etcd_access, redis_access
from controlplane.kernel.dev_join import in_process_backends, in_process_warning
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.settings import Settings
from controlplane.kernel.signals import on_stop_signals
from controlplane.kernel.streams_factory import open_streams
from routers.process import AgentOptions, ParserFactory, RouterFactory, RouterProcess

log = logging.getLogger("canary.routers")


async def run_router_agent(
    settings: Settings,
    *,
    build_parser: ParserFactory,
    build_router: RouterFactory,
    options: AgentOptions,
    admin: tuple[str, int] | None,
    sample_keys: SampleKeys | None = None,
    source_tag: str = "router",
    stop: asyncio.Event | None = None,
) -> None:
    token = admin_token(settings.admin_token_file)
    backends = in_process_backends(settings.etcd, settings.redis_url)
    warnings = [in_process_warning("router agent", backends)] if backends else []
    for warning in warnings:
        log.warning("%s", warning)
    kv = open_kv(settings.etcd, access=etcd_access(settings))
    try:
        stream, _ = open_streams(
            settings.redis_url, namespace=settings.redis_namespace, access=redis_access(settings)
        )
    except BaseException:
        await kv.close()
        raise
    process = RouterProcess(
        kv=kv, stream=stream, build_parser=build_parser, build_router=build_router, options=options,
        sample_keys=sample_keys, admin_token=token, source_tag=source_tag, warnings=warnings,
    )  # fmt: skip
    if sample_keys is None:
        log.warning("no sample keys configured: samples are sent unsigned")
    stop = stop or asyncio.Event()
    try:
        with on_stop_signals(stop.set):
            try:
                await process.start(admin)
            except BaseException:
                await process.stop()
                raise
            await stop.wait()
            log.info("router agent for %s stopping", options.service)
            await process.stop()
    finally:
        for close in (kv.close, stream.close):
            try:
                await close()
            except Exception as exc:  # the process is going away; say so and go on
                log.warning("closing a store failed: %s", exc)


__all__ = ["run_router_agent"]
