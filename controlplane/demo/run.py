"""Orchestration: start every part in one process, run both scenarios, stop cleanly.

The in-process KV store and stream bus only connect the parts that share the very
same objects, so one `Backends` is opened and handed to the API (with its
controller), the collector and the sidecar. With `real` the same parts run on the
configured etcd, Redis and SQL database instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live

from controlplane.demo.load import LoadGenerator
from controlplane.demo.scenarios import (
    ACTOR,
    SERVICE,
    ReleaseManager,
    RouteLog,
    ScenarioRunner,
    ScenarioSpec,
    Timing,
)
from controlplane.demo.summary import ScenarioResult, all_ok, summary_table
from controlplane.demo.upstreams import LatencyProfile, UpstreamServer
from controlplane.demo.view import render
from controlplane.kernel.sample_keys import generate_sample_keys
from controlplane.kernel.settings import Settings, parse_host_port
from controlplane.kernel.signals import on_stop_signals
from controlplane.kernel.streams import PendingSummary, SampleStream, StreamEntry
from controlplane.runtime import Backends

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
LOAD_RATE = 200.0
USERS = 5_000
SAMPLES_SETTLE_SEC = 5.0


@dataclass(frozen=True)
class DemoOptions:
    real: bool = False
    quick: bool = False
    live: bool = True
    api_listen: str = "127.0.0.1:8080"
    rate: float = LOAD_RATE
    router: str = "sidecar"  # or "nginx": users go through a real nginx steered by its agent


class CountingStream:
    """The shared sample stream as the sidecar sees it: counts what it appended, per
    experiment, so the summary can set samples sent against samples counted."""

    def __init__(self, inner: SampleStream) -> None:
        self._inner = inner
        self.sent: dict[str, int] = {}

    async def append(
        self, service: str, batches: Sequence[Mapping[str, bytes]], *, maxlen: int
    ) -> list[str]:
        ids = await self._inner.append(service, batches, maxlen=maxlen)
        for batch in batches:  # only once the append succeeded
            experiment = batch["exp"].decode()
            self.sent[experiment] = self.sent.get(experiment, 0) + int(batch["n"])
        return ids

    async def ensure_group(self, service: str, group: str) -> None:
        await self._inner.ensure_group(service, group)

    async def read_group(
        self, services: Sequence[str], group: str, consumer: str, *, count: int, block_ms: int
    ) -> list[StreamEntry]:
        return await self._inner.read_group(
            services, group, consumer, count=count, block_ms=block_ms
        )

    async def ack(self, service: str, group: str, entry_ids: Sequence[str]) -> int:
        return await self._inner.ack(service, group, entry_ids)

    async def ack_many(self, group: str, entry_ids: Mapping[str, Sequence[str]]) -> int:
        return await self._inner.ack_many(group, entry_ids)

    async def claim_idle(
        self, service: str, group: str, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[StreamEntry]:
        return await self._inner.claim_idle(
            service, group, consumer, min_idle_ms=min_idle_ms, count=count
        )

    async def pending(self, service: str, group: str) -> int:
        return await self._inner.pending(service, group)

    async def pending_many(
        self, group: str, services: Sequence[str], *, min_idle_ms: int
    ) -> dict[str, PendingSummary]:
        return await self._inner.pending_many(group, services, min_idle_ms=min_idle_ms)

    async def services(self) -> list[str]:
        return await self._inner.services()

    async def close(self) -> None:
        return None


@contextlib.contextmanager
def demo_settings(options: DemoOptions) -> Iterator[Settings]:
    """Embedded: SQLite in a temporary directory, in-process etcd and Redis."""
    if options.real:
        yield Settings()
        return
    with tempfile.TemporaryDirectory(prefix="canary-demo-") as tmp:
        path = Path(tmp) / "canary.db"
        yield Settings(database_url=f"sqlite:///{path}", etcd="memory://", redis_url="memory://")


def bind_api_socket(listen: str) -> socket.socket:
    """The asked address if it is free, else a free port on the same host."""
    host, port = parse_host_port(listen)
    for candidate in (port, 0):
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError:
            sock.close()
            if candidate == 0:
                raise
            continue
        sock.listen(512)
        sock.setblocking(False)
        return sock
    raise OSError(f"cannot bind {listen}")  # pragma: no cover - the loop returns or raises


class Demo:
    """Every part of the demo; `run()` starts them, runs the scenarios and stops them."""

    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.timing = Timing.for_mode(quick=options.quick)
        self.started = time.time()
        self.load: LoadGenerator | None = None
        self.runners: list[ScenarioRunner] = []
        self.results: list[ScenarioResult] = []
        self._forgotten_counts: dict[str, int] = {}
        # On shared, real backends a run of its own service: no route or experiment
        # left by an earlier (or a concurrent) run can get in its way.
        self.service = f"{SERVICE}-{uuid.uuid4().hex[:6]}" if options.real else SERVICE
        # the sidecar and the collector run here: they share a key made for this run,
        # so the demo's samples travel signed and are verified as in production
        self.sample_keys = generate_sample_keys("demo")

    def say(self, line: str) -> None:
        if not self.options.live:
            self.console.print(
                f"{time.time() - self.started:6.1f}s  {line}", markup=False, highlight=False
            )

    async def run(self) -> int:
        async with contextlib.AsyncExitStack() as stack:
            settings = stack.enter_context(demo_settings(self.options))
            backends = await self._backends(settings, stack)
            v1, v2, v3 = (
                UpstreamServer(name, LatencyProfile(), seed=seed)
                for seed, name in enumerate(("shop v1", "shop v2", "shop v3"))
            )
            for upstream in (v1, v2, v3):
                await upstream.start()
                stack.push_async_callback(upstream.close)
            if self.options.router == "nginx":
                front_port, reporter, samples = await self._nginx(backends, v1.url, stack)
                front_name = "nginx"
            else:
                sidecar, samples = await self._sidecar(backends, v1.url, stack)
                front_port, reporter, front_name = sidecar.proxy.port, sidecar.reporter, "sidecar"
            collector = await self._collector(backends, stack)
            api_url = await self._api(settings, backends, stack)
            if self.options.real:
                stack.push_async_callback(self._forget_service, backends)
            routes = RouteLog(backends.kv, backends.keys, self.service)
            await routes.start()
            stack.push_async_callback(routes.stop)
            self.load = load = LoadGenerator(
                "127.0.0.1", front_port, rate=self.options.rate, users=USERS
            )
            load.start()
            stack.push_async_callback(load.stop)
            token = await self._token(backends, stack)
            http = httpx.AsyncClient(
                base_url=api_url, timeout=10.0, headers={"Authorization": f"Bearer {token}"}
            )
            stack.push_async_callback(http.aclose)
            self.say(
                f"control plane on {api_url}, {front_name} for {self.service} on "
                f"127.0.0.1:{front_port}, {self.options.rate:g} requests/s"
            )
            from controlplane.api.pages import dashboard_url

            self.say(f"dashboard: {dashboard_url(api_url)} (sign in with the token above)")
            api = ReleaseManager(http)
            specs = [
                ScenarioSpec("healthy", "healthy canary", "promoted", baseline=v1, canary=v2),
                ScenarioSpec(
                    "degraded", "canary slows down x5 after its second step", "rolled_back",
                    baseline=v2, canary=v3, degrade_at_step=2,
                ),
            ]  # fmt: skip
            self.runners = [
                ScenarioRunner(
                    spec,
                    api=api,
                    board=backends.board,
                    routes=routes,
                    load=load,
                    timing=self.timing,
                    service=self.service,
                    say=self.say,
                )
                for spec in specs
            ]
            marks = await self._run_scenarios()
            # quiesce: no new samples, the reporter's buffer sent, the collector caught up
            await load.stop()
            await reporter.flush()
            counted = await self._counted(collector, samples)
            self.results = [
                ScenarioResult(
                    progress=runner.progress,
                    load=after.minus(before),
                    samples_sent=samples.sent.get(str(runner.progress.experiment_id), 0),
                    samples_counted=counted.get(str(runner.progress.experiment_id), 0),
                )
                for runner, (before, after) in zip(self.runners, marks, strict=True)
            ]
            self.console.print()
            self.console.print(summary_table(self.results, front_name))
            total_sidecar = load.stats.sidecar_failed
            ok = all_ok(self.results) and total_sidecar == 0
            if total_sidecar and all_ok(self.results):
                self.console.print(f"[red]{total_sidecar} requests failed by the sidecar[/]")
            return EXIT_OK if ok else EXIT_FAILED
        return EXIT_FAILED  # pragma: no cover - the stack does not swallow errors

    async def _run_scenarios(self) -> list[tuple[Any, Any]]:
        assert self.load is not None
        load = self.load
        marks = []
        live: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.options.live:
            live = Live(
                get_renderable=lambda: render([r.progress for r in self.runners], self.load),
                console=self.console,
                refresh_per_second=4,
            )
        with live:
            for runner in self.runners:
                before = load.stats.copy()
                await runner.run()
                marks.append((before, load.stats.copy()))
        return marks

    # --- the parts ----------------------------------------------------------

    async def _backends(self, settings: Settings, stack: contextlib.AsyncExitStack) -> Backends:
        from controlplane.db import migrate
        from controlplane.runtime import open_backends

        await asyncio.to_thread(migrate.upgrade, settings.database_url)
        backends = await open_backends(settings)
        stack.push_async_callback(backends.close)
        return backends

    async def _token(self, backends: Backends, stack: contextlib.AsyncExitStack) -> str:
        """An admin token for the demo's release manager, revoked when the demo ends."""
        from controlplane.auth.roles import Role
        from controlplane.db.tokens import issue_token, revoke_token
        from controlplane.kernel.clock import utc_now

        name = f"{ACTOR}-{uuid.uuid4().hex[:6]}"
        async with backends.database.transaction() as tx:
            info, token = await tx.run(
                issue_token, name=name, role=Role.ADMIN, created_by="canary demo",
                now=utc_now(backends.clock),
            )  # fmt: skip

        async def revoke() -> None:
            with contextlib.suppress(Exception):
                async with backends.database.transaction() as tx:
                    await tx.run(revoke_token, ref=str(info.id), now=utc_now(backends.clock))

        stack.push_async_callback(revoke)
        self.say(f"API token {name} (admin, revoked at the end): export CANARY_TOKEN={token}")
        return token

    async def _sidecar(
        self, backends: Backends, default_upstream: str, stack: contextlib.AsyncExitStack
    ) -> tuple[Any, CountingStream]:
        from sidecar.choice import Upstream
        from sidecar.main import Sidecar

        assert backends.streams is not None
        samples = CountingStream(backends.streams)
        sidecar = Sidecar(
            sample_keys=self.sample_keys,
            service=self.service,
            kv=backends.kv,
            stream=samples,
            etcd_prefix=backends.settings.etcd_prefix,
            # before the first experiment (and between them) users still get served
            default_upstream=Upstream.parse(default_upstream),
            clock=backends.clock,
        )
        try:
            await sidecar.start(("127.0.0.1", 0))
        except BaseException:
            await sidecar.stop()
            raise
        stack.push_async_callback(sidecar.stop)
        return sidecar, samples

    async def _nginx(
        self, backends: Backends, default_upstream: str, stack: contextlib.AsyncExitStack
    ) -> tuple[int, Any, CountingStream]:
        from controlplane.demo.nginx_front import NginxFront

        assert backends.streams is not None
        samples = CountingStream(backends.streams)
        front = NginxFront(
            service=self.service, kv=backends.kv, stream=samples,
            etcd_prefix=backends.settings.etcd_prefix, default_upstream=default_upstream,
            clock=backends.clock, sample_keys=self.sample_keys,
        )  # fmt: skip
        try:
            await front.start()
        except BaseException:
            await front.stop()
            raise
        stack.push_async_callback(front.stop)
        return front.port, front.process.reporter, samples

    async def _collector(self, backends: Backends, stack: contextlib.AsyncExitStack) -> Any:
        from controlplane.collector.pacing import COALESCE, PUBLISH_EVERY_SEC
        from controlplane.collector.service import Collector

        assert backends.streams is not None and backends.board is not None
        collector = Collector(
            backends.streams, backends.board, backends.kv, backends.keys,
            consumer_name=f"demo-{uuid.uuid4().hex[:8]}", clock=backends.clock,
            sample_keys=self.sample_keys, publish_every=PUBLISH_EVERY_SEC, coalesce=COALESCE,
        )  # fmt: skip
        # a finished scenario's experiment is forgotten after its window: keep its count
        collector.on_forget = self._keep_count
        await collector.load_config()
        stop = asyncio.Event()
        task = asyncio.create_task(collector.run(stop), name="demo-collector")

        async def halt() -> None:
            stop.set()
            try:
                await asyncio.wait_for(task, timeout=10)
            except (TimeoutError, Exception):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

        stack.push_async_callback(halt)
        return collector

    async def _api(
        self, settings: Settings, backends: Backends, stack: contextlib.AsyncExitStack
    ) -> str:
        import uvicorn

        from controlplane.api.app import create_app
        from controlplane.controller.runner import Controller
        from controlplane.notify.dispatcher import dispatcher_for

        class EmbeddedServer(uvicorn.Server):
            # The demo handles SIGINT/SIGTERM itself; uvicorn would re-raise them after
            # its shutdown, interrupting the demo's own clean stop.
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        app = create_app(
            settings, backends=backends, services=[Controller(), dispatcher_for(settings)]
        )
        sock = bind_api_socket(self.options.api_listen)
        host, port = sock.getsockname()[:2]
        config = uvicorn.Config(
            app, log_config=None, log_level="warning", access_log=False, lifespan="on",
            timeout_graceful_shutdown=3,
        )  # fmt: skip
        server = EmbeddedServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name="demo-api")

        async def halt() -> None:
            server.should_exit = True
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, timeout=15)
            sock.close()

        stack.push_async_callback(halt)
        while not server.started:
            if task.done():
                task.result()  # raise why it did not start
                raise RuntimeError("the API stopped while starting")
            await asyncio.sleep(0.02)
        return f"http://{host}:{port}"

    async def _forget_service(self, backends: Backends) -> None:
        """Remove the run's route and rule from etcd; the SQL audit trail stays."""
        for key in (backends.keys.route(self.service), backends.keys.rule(self.service)):
            with contextlib.suppress(Exception):
                await backends.kv.delete(key)

    def _keep_count(self, experiment: str, window: Any) -> None:
        """An ended experiment's window is about to be dropped: keep what it applied."""
        kept = self._forgotten_counts.get(experiment, 0)
        self._forgotten_counts[experiment] = kept + window.counters.ingested

    async def _counted(self, collector: Any, samples: CountingStream) -> dict[str, int]:
        """Samples the collector applied, per experiment, once it has read all there is."""

        def counts() -> dict[str, int]:
            applied = dict(self._forgotten_counts)
            for exp, window in collector.windows.items():
                applied[exp] = applied.get(exp, 0) + window.counters.ingested
            return applied

        deadline = time.monotonic() + SAMPLES_SETTLE_SEC
        while time.monotonic() < deadline:
            if all(counts().get(exp, 0) >= n for exp, n in samples.sent.items()):
                break
            await asyncio.sleep(0.1)
        return counts()


async def run_demo(options: DemoOptions, console: Console | None = None) -> int:
    """Run the demo; the exit code: 0 when both scenarios ended as expected."""
    return await Demo(options, console or Console()).run()


def main(options: DemoOptions, console: Console | None = None) -> int:
    """Run the demo until it ends or SIGINT/SIGTERM arrives; then stop every part."""
    console = console or Console()

    async def entry() -> int:
        task = asyncio.current_task()
        assert task is not None
        interrupted: list[int] = []

        def interrupt() -> None:
            if not interrupted:  # a second signal must not break the clean stop
                interrupted.append(1)
                task.cancel()

        with on_stop_signals(interrupt):
            try:
                return await run_demo(options, console)
            except asyncio.CancelledError:
                if not interrupted:
                    raise
                console.print("canary demo: interrupted, everything stopped")
                return EXIT_INTERRUPTED

    return asyncio.run(entry())
