"""`GET /overload` on `canary sidecar --workers 2`: the supervisor reads each worker's
view over its admin socket and answers them merged, behind the admin token.

Real etcd holds the service's overload config; a real upstream answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from tests.sidecar import upstreams
from tests.sidecar.workers.test_workers_e2e import Running, send, until
from tests.support.processes import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.real]

SERVICE = "shop"
TOKEN = "admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUESTS = 60


@pytest.fixture
async def upstream() -> AsyncIterator[upstreams.Upstream]:
    server = upstreams.Upstream("baseline")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def sidecar(
    etcd_endpoint: str, etcd_prefix: str, upstream: upstreams.Upstream, tmp_path: Path
) -> AsyncIterator[Running]:
    kv = open_kv(etcd_endpoint)
    key = EtcdKeys(etcd_prefix).overload(SERVICE)
    await kv.put(key, json.dumps({"min_limit": 50, "max_limit": 50}).encode())
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    port, admin = free_port(), free_port()
    log = tmp_path / "sidecar.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli.main", "sidecar", "--workers", "2",
             "--service", SERVICE, "--listen", f"127.0.0.1:{port}",
             "--admin", f"127.0.0.1:{admin}", "--etcd", etcd_endpoint,
             "--etcd-prefix", etcd_prefix, "--redis", "memory://",
             "--default-upstream", upstream.url, "--admin-token-file", str(token_file)],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ),
        )  # fmt: skip
    running = Running(proc, port, admin, log)
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 30)
        await kv.delete(key)
        await kv.close()


async def test_the_supervisor_merges_its_workers_overload_views(
    sidecar: Running, upstream: upstreams.Upstream
) -> None:
    admin = f"http://127.0.0.1:{sidecar.admin}"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:

        async def view() -> dict[str, Any]:
            answer = await client.get(f"{admin}/overload", headers=AUTH)
            assert answer.status_code == 200, answer.text
            assert answer.headers["content-type"] == "application/json"
            body: dict[str, Any] = answer.json()
            return body

        async def both_enabled() -> bool:
            assert sidecar.proc.poll() is None, sidecar.output()
            try:
                if (await client.get(f"{admin}/readyz")).status_code != 200:
                    return False
            except httpx.TransportError:
                return False
            workers = (await view())["workers"]
            return len(workers) == 2 and all(w.get("enabled") for w in workers)

        await until(both_enabled, "both workers ready with overload protection on")
        assert (await client.get(f"{admin}/overload")).status_code == 401

        # fresh connections, spread by the kernel over both workers
        assert await send(sidecar.proxy_url, REQUESTS) == [200] * REQUESTS
        merged = await view()
    assert merged["enabled"] is True
    assert merged["config"]["max_limit"] == 50
    (gate,) = merged["upstreams"]
    assert gate["upstream"] == upstream.url
    assert gate["admitted"] == REQUESTS
    assert gate["in_flight"] == 0 and gate["queued"] == 0
    assert gate["limit"] == 100 and gate["workers"] == 2  # 50 each
    workers = merged["workers"]
    assert [w["worker"] for w in workers] == [0, 1]
    served = [sum(g["admitted"] for g in w["upstreams"]) for w in workers]
    assert sum(served) == REQUESTS and min(served) > 0, served
    assert merged["shed"] == []
