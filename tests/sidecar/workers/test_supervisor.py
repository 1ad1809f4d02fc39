"""A supervisor in this process with real worker processes, on the in-process stores.

The fallback listener (one socket every worker inherits) shares the connections:
with either worker stopped, the other takes them all. A worker that keeps exiting
stops the supervisor with exit code 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from sidecar.workers import aggregate
from sidecar.workers.listeners import ListenMode, reserve
from sidecar.workers.policy import RestartPolicy
from sidecar.workers.rundir import make_socket_dir
from sidecar.workers.spec import WorkerSpec
from sidecar.workers.supervisor import Supervisor, run_supervisor
from tests.sidecar import upstreams


def spec_for(port: int, **changes: object) -> WorkerSpec:
    fields: dict[str, object] = dict(
        index=0, service="shop", host="127.0.0.1", port=port, admin_socket="-",
        settings={"etcd": "memory://", "redis_url": "memory://"},
        connect_timeout=2.0, read_timeout=30.0, head_timeout=10.0, tunnel_idle_timeout=300.0,
    )  # fmt: skip
    return WorkerSpec.model_validate({**fields, **changes})


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
async def upstream() -> AsyncIterator[upstreams.Upstream]:
    server = upstreams.Upstream("default")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_with_one_worker_stopped_the_other_takes_every_connection(
    upstream: upstreams.Upstream,
) -> None:
    listener = reserve("127.0.0.1", 0, ListenMode.INHERITED)
    socket_dir = make_socket_dir()
    supervisor = Supervisor(
        spec=spec_for(listener.port, default_upstream=upstream.url),
        workers=2,
        listener=listener,
        socket_dir=socket_dir,
    )
    await supervisor.start()
    try:
        await until(supervisor.ready, "both workers ready")
        pids = [slot.pid for slot in supervisor.slots]
        limits = httpx.Limits(max_keepalive_connections=0)
        url = f"http://127.0.0.1:{listener.port}/echo"
        async with httpx.AsyncClient(trust_env=False, timeout=10, limits=limits) as client:
            for paused in pids:
                assert paused is not None
                os.kill(paused, signal.SIGSTOP)

                async def stopped(pid: int = paused) -> bool:
                    return state(pid) == "T"

                try:
                    await until(stopped, "the worker stopped")
                    responses = [await client.get(url) for _ in range(10)]
                    assert [r.status_code for r in responses] == [200] * 10
                finally:
                    os.kill(paused, signal.SIGCONT)
        await supervisor.refresh()
        served = [
            aggregate.total(slot.current, "canary_sidecar_requests_total")
            for slot in supervisor.slots
        ]
        assert served == [10, 10]
    finally:
        code = await supervisor.stop()
    assert code == 0
    assert all(not slot.running for slot in supervisor.slots)
    assert not socket_dir.exists()


async def test_a_worker_that_keeps_exiting_stops_the_supervisor_with_code_1(
    tmp_path: Path,
) -> None:
    listener = reserve("127.0.0.1", 0, ListenMode.REUSEPORT)
    missing = str(tmp_path / "absent.pem")  # each worker refuses it and exits
    socket_dir = make_socket_dir()
    code = await asyncio.wait_for(
        run_supervisor(
            spec=spec_for(listener.port, tls_cert=missing, tls_key=missing),
            workers=1,
            listener=listener,
            socket_dir=socket_dir,
            policy=RestartPolicy(initial_delay=0.01, max_delay=0.05, max_exits=3),
        ),
        timeout=60,
    )
    assert code == 1
    assert listener.sockets == []  # the port is let go
    assert not socket_dir.exists()
