"""The supervisor of a `canary sidecar --workers N`: N worker processes on one port.

    start:  admin endpoint, then every worker (`python -m sidecar.workers.worker`,
            its `WorkerSpec` on stdin)
    run:    a worker that exits unasked is restarted after a backoff
            (`policy.after_exit`); one that keeps exiting stops everything, exit 1
    stop:   SIGTERM to every worker (each drains its requests and flushes its
            samples), SIGKILL to any still running after the grace period

The supervisor never touches a request: workers accept on the shared port
themselves (`listeners`). It serves the admin endpoint: /readyz asks every worker,
/metrics reads every worker and sums (`aggregate`), /overload reads every worker's
view of overload protection and merges them (`overload.view`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.registry import CollectorRegistry

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.signals import on_stop_signals
from sidecar.admin import AdminServer
from sidecar.overload.view import MAX_VIEW_BYTES, OverloadView, merge_views, parse_view
from sidecar.workers import aggregate
from sidecar.workers.listeners import Listener
from sidecar.workers.metrics import WorkersCollector
from sidecar.workers.policy import GiveUp, RestartPolicy, after_exit
from sidecar.workers.scrape import ScrapeError, get
from sidecar.workers.slot import WorkerSlot
from sidecar.workers.spec import WorkerSpec

log = logging.getLogger("canary.sidecar.supervisor")

HostPort = tuple[str, int]
WORKER_MODULE = "sidecar.workers.worker"
SCRAPE_TIMEOUT = 2.0  # seconds for a worker to answer /readyz or /metrics
EXITED_UNASKED = 1  # the supervisor's exit code when a worker kept exiting


class Supervisor:
    """Start, watch, restart and stop the workers; answer for them on the admin port."""

    def __init__(
        self,
        *,
        spec: WorkerSpec,
        workers: int,
        listener: Listener,
        socket_dir: Path,
        admin_token: str | None = None,
        policy: RestartPolicy | None = None,
        grace: float = 20.0,
        warnings: Sequence[str] = (),
        clock: Clock | None = None,
        draw: Callable[[], float] = random.random,
        python: str = sys.executable,
    ) -> None:
        if workers < 1:
            raise ValueError("a supervisor needs at least one worker")
        self._spec = spec
        self._listener = listener
        self._policy = policy or RestartPolicy()
        self._grace = grace  # the workers' drain and flush, and a margin
        self._clock: Clock = clock or SystemClock()
        self._draw = draw  # the restart delay's jitter
        self._python = python
        self._dir = socket_dir  # private (see rundir.py); removed at stop
        self.slots = [
            WorkerSlot(index, str(self._dir / f"worker-{index}.sock")) for index in range(workers)
        ]
        self._keepers: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._failed = asyncio.Event()
        self.failure: str | None = None
        self._clean = True  # every worker asked to stop exited with 0
        self._ready = False  # as of the last /readyz or /metrics
        registry = CollectorRegistry(auto_describe=False)
        registry.register(WorkersCollector(self.slots, lambda: self._ready))
        self.admin = AdminServer(
            registry=registry,
            ready=self.ready,
            token=admin_token,
            refresh=self.refresh,
            not_ready=b"not ready: a worker is not running or not ready\n",
            views={"/overload": self.overload_view},
            warnings=warnings,
        )
        registry.register(self.admin.metrics_collector())
        self._admin_started = False

    @property
    def port(self) -> int:
        return self._listener.port

    # --- lifecycle --------------------------------------------------------------

    async def start(self, admin: HostPort | None = None) -> None:
        if admin is not None:
            await self.admin.start(*admin)
            self._admin_started = True
        self._keepers = [
            asyncio.create_task(self._keep(slot), name=f"worker-{slot.index}")
            for slot in self.slots
        ]
        log.info("%d workers on port %d (%s)", len(self.slots), self.port, self._listener.mode)

    async def wait(self, stop: asyncio.Event) -> None:
        """Until `stop` is set or a worker keeps exiting."""
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(self._failed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def stop(self) -> int:
        """Drain every worker; the exit code: 0, or 1 when a worker kept exiting or
        did not stop cleanly."""
        self._stopping.set()
        self._ready = False
        for slot in self.slots:
            _signal(slot, signal.SIGTERM)
        keepers = asyncio.gather(*self._keepers, return_exceptions=True)
        try:
            async with asyncio.timeout(self._grace):
                await asyncio.shield(keepers)
        except TimeoutError:
            for slot in self.slots:
                if slot.running:
                    log.warning("worker %d did not stop in %g s: killed", slot.index, self._grace)
                    _signal(slot, signal.SIGKILL)
            await keepers
        if self._admin_started:
            await self.admin.stop()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self.failure is not None:
            log.error("stopped: %s", self.failure)
            return EXITED_UNASKED
        return 0 if self._clean else EXITED_UNASKED

    async def _keep(self, slot: WorkerSlot) -> None:
        """Run a worker in `slot`, again after each unasked exit, until stopping."""
        while not self._stopping.is_set():
            ended = await self._run_once(slot)
            if self._stopping.is_set():
                return
            decision = after_exit(
                self._policy, slot.exits, self._clock.monotonic(), draw=self._draw()
            )
            if isinstance(decision, GiveUp):
                self.failure = f"worker {slot.index} keeps exiting ({decision.reason})"
                log.error("worker %d exited (%s): %s", slot.index, ended, self.failure)
                self._failed.set()
                return
            slot.exits = decision.recent
            slot.restarts += 1
            log.warning(
                "worker %d exited (%s): restarting in %g s", slot.index, ended, decision.delay
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(decision.delay):
                    await self._stopping.wait()

    async def _run_once(self, slot: WorkerSlot) -> str:
        """Start the slot's worker and wait for it to exit; how it ended."""
        fd = self._listener.fd
        spec = self._spec.model_copy(
            update={"index": slot.index, "admin_socket": slot.admin_socket, "listen_fd": fd}
        )
        try:
            process = await asyncio.create_subprocess_exec(
                self._python,
                "-m",
                WORKER_MODULE,
                stdin=asyncio.subprocess.PIPE,
                pass_fds=() if fd is None else (fd,),
            )
        except OSError as exc:
            return f"not started: {exc}"
        slot.process = process
        try:
            if self._stopping.is_set():  # stop() began while this one was starting
                _signal(slot, signal.SIGTERM)
            assert process.stdin is not None
            process.stdin.write(spec.to_line())  # the pipe then stays open: see worker.py
            with contextlib.suppress(ConnectionError):
                await process.stdin.drain()
            code = await process.wait()
        finally:
            slot.retire()
            if process.stdin is not None:
                process.stdin.close()
        if self._stopping.is_set() and code != 0:
            log.warning("worker %d ended with %s while stopping", slot.index, _ended(code))
            self._clean = False
        return _ended(code)

    # --- the admin endpoint -----------------------------------------------------

    async def ready(self) -> bool:
        """Every worker runs and answers /readyz with 200."""
        if self._stopping.is_set() or not all(slot.running for slot in self.slots):
            self._ready = False
            return False
        answers = await asyncio.gather(
            *(get(slot.admin_socket, "/readyz", timeout=SCRAPE_TIMEOUT) for slot in self.slots),
            return_exceptions=True,
        )
        self._ready = all(not isinstance(a, BaseException) and a[0] == 200 for a in answers)
        return self._ready

    async def refresh(self) -> None:
        """Read every running worker's /metrics into its slot, before a scrape."""
        await asyncio.gather(*(self._scrape(slot) for slot in self.slots))
        self._ready = (
            not self._stopping.is_set()
            and all(slot.running and slot.current_pid == slot.pid for slot in self.slots)
            and all(
                aggregate.value(slot.current, "canary_sidecar_ready") == 1 for slot in self.slots
            )
        )

    async def overload_view(self) -> dict[str, Any]:
        """Every worker's view of its overload protection, merged."""
        views = await asyncio.gather(*(self._overload_of(slot) for slot in self.slots))
        return merge_views([(slot.index, v) for slot, v in zip(self.slots, views, strict=True)])

    async def _overload_of(self, slot: WorkerSlot) -> OverloadView | str:
        """The worker's view, or why there is none."""
        if not slot.running:
            return "not running"
        try:
            status, body = await get(
                slot.admin_socket,
                "/overload",
                timeout=SCRAPE_TIMEOUT,
                max_bytes=MAX_VIEW_BYTES,
            )
            if status != 200:
                raise ScrapeError(f"status {status}")
            return parse_view(body)
        except (ScrapeError, ValueError) as exc:
            log.debug("worker %d overload view not read: %s", slot.index, exc)
            return str(exc)

    async def _scrape(self, slot: WorkerSlot) -> None:
        pid = slot.pid
        if pid is None or not slot.running:
            return
        try:
            status, body = await get(slot.admin_socket, "/metrics", timeout=SCRAPE_TIMEOUT)
            if status != 200:
                raise ScrapeError(f"status {status}")
            families = aggregate.parse(body.decode("utf-8"))
        except (ScrapeError, ValueError) as exc:
            slot.scrape_errors += 1
            log.debug("worker %d metrics not read: %s", slot.index, exc)
            return
        slot.scraped(pid, families)


def _signal(slot: WorkerSlot, sig: signal.Signals) -> None:
    if slot.running and slot.process is not None:
        with contextlib.suppress(ProcessLookupError):
            slot.process.send_signal(sig)


def _ended(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


async def run_supervisor(
    *,
    spec: WorkerSpec,
    workers: int,
    listener: Listener,
    socket_dir: Path,
    admin: HostPort | None = None,
    admin_token: str | None = None,
    stop: asyncio.Event | None = None,
    policy: RestartPolicy | None = None,
    warnings: Sequence[str] = (),
) -> int:
    """Run the workers until SIGTERM/SIGINT (or `stop`); the process's exit code."""
    supervisor = Supervisor(
        spec=spec, workers=workers, listener=listener, socket_dir=socket_dir,
        admin_token=admin_token, policy=policy, warnings=warnings,
    )  # fmt: skip
    stop = stop or asyncio.Event()
    with on_stop_signals(stop.set):
        try:
            await supervisor.start(admin)
            await supervisor.wait(stop)
        finally:
            code = await supervisor.stop()
    return code


__all__: Sequence[str] = ("Supervisor", "run_supervisor")
