"""Fixtures of the end-to-end tests: a whole deployment per test, every part a process.

Each test is isolated: its own PostgreSQL database (pg_url), etcd prefix and Redis
namespace, free ports everywhere. Every process it starts is ended by its pid when
the test ends, whatever happened; when a test fails, the tail of every process's
output is added to its report.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Generator, Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from tests.conftest import ETCD
from tests.e2e.helpers import (
    Launch,
    Processes,
    Stack,
    Upstream,
    canary_command,
    http_ok,
    new_port,
    poll,
    reserve_ports,
)
from tests.support.auth import bearer, install_test_tokens
from tests.support.processes import EtcdProcess, environ_with, wait_port

PROCESSES = pytest.StashKey[Processes]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    procs = item.stash.get(PROCESSES, None)
    if procs is not None and report.failed and report.when in ("setup", "call"):
        report.sections.append(("output of the test's processes (tails)", procs.report()))


@pytest.fixture
def own_etcd() -> Iterator[EtcdProcess]:
    """An etcd of the test's own, on its own ports, that it may stop and start again."""
    etcd = EtcdProcess()
    reserve_ports(etcd.port, etcd.peer_port)
    etcd.start()
    try:
        yield etcd
    finally:
        etcd.close()


@pytest.fixture
async def launch(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    pg_url: str,
    redis_url: str,
    redis_namespace: str,
    etcd_prefix: str,
) -> AsyncIterator[Launch]:
    """`await launch(serves=1, collectors=2, etcd=...)` starts a whole deployment."""
    procs = Processes(tmp_path)
    request.node.stash[PROCESSES] = procs
    stacks: list[Stack] = []

    async def start(
        *, serves: int = 1, collectors: int = 2, etcd: str = ETCD, front: str = "sidecar",
        env: dict[str, str] | None = None,
    ) -> Stack:
        env = environ_with(
            CANARY_DATABASE_URL=pg_url,
            CANARY_ETCD=etcd,
            CANARY_ETCD_PREFIX=etcd_prefix,
            CANARY_REDIS_URL=redis_url,
            CANARY_REDIS_NAMESPACE=redis_namespace,
            CANARY_LOG_LEVEL="info",
            PYTHONUNBUFFERED="1",
            **(env or {}),
        )
        upgrade = procs.start("db-upgrade", [*canary_command(), "db", "upgrade"], env)
        code = await asyncio.to_thread(upgrade.wait_exit, 120)
        assert code == 0, f"canary db upgrade failed ({code}):\n{upgrade.tail()}"
        # `canary serve` refuses to start without a token in the database
        await asyncio.to_thread(install_test_tokens, pg_url)

        upstreams = []
        for name, seed in (("baseline", 1), ("canary", 2)):
            port = new_port()
            control = tmp_path / f"{name}.control.json"
            proc = procs.start(
                f"upstream-{name}",
                [sys.executable, "-m", "tests.e2e.upstream",
                 "--name", name, "--port", str(port), "--control", str(control),
                 "--median-ms", "50", "--seed", str(seed)],
                env,
            )  # fmt: skip
            upstreams.append(Upstream(proc, port, control))

        kv = open_kv(etcd)
        http = httpx.AsyncClient(timeout=5.0, trust_env=False, headers=bearer())
        stack = Stack(
            procs=procs, env=env, etcd_endpoint=etcd, keys=EtcdKeys(etcd_prefix), kv=kv,
            http=http, baseline=upstreams[0], canary=upstreams[1], front=front,
        )  # fmt: skip
        stacks.append(stack)
        for index in range(serves):
            stack.start_serve(index)
        for index in range(collectors):
            stack.start_collector(index)
        stack.start_front(tmp_path)
        for upstream in upstreams:
            await asyncio.to_thread(wait_port, upstream.port, timeout=30)
            await poll(
                partial(http_ok, http, upstream.url),
                timeout=10,
                what=f"{upstream.proc.name} answering",
                procs=[upstream.proc],
            )
        await stack.wait_ready()
        return stack

    try:
        yield start
    finally:
        for stack in stacks:
            if stack.load is not None:
                with contextlib.suppress(Exception):
                    await stack.load.stop(drain=1.0)
            if stack.routes is not None:
                await stack.routes.stop()
            await stack.http.aclose()
            with contextlib.suppress(Exception):
                await stack.kv.close()
        await asyncio.to_thread(procs.close)
