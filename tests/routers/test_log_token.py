"""The agent's log token, end to end: one router agent process (RouterProcess) on
real etcd and Redis, steering a real nginx or HAProxy, its own receiver on its UDP
port.

- lines the proxy writes carry the process's token and become samples;
- datagrams the test forges in the proxy's own format, with a wrong or no token,
  sent to the same port while real traffic flows, are refused and counted
  `forged`, never samples (each would be a sample with the right token);
- the token is in what the proxy was given, and never in /status, /metrics or the
  agent's logs;
- a second agent on the same proxy draws its own token and takes over at its first
  apply; lines with the first agent's token are then forged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

import controlplane.cli.main as cli
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.route_reports import RouteReports
from controlplane.kernel.routes import Route, RouteState, Sticky, two_way_variants
from controlplane.kernel.streams import SampleStream
from controlplane.kernel.streams_factory import open_streams
from routers.haproxy.log_lines import HaproxyLineParser
from routers.haproxy.router import HaproxyRouter
from routers.haproxy.runtime import StatsSocket
from routers.nginx.log_lines import NginxLineParser
from routers.nginx.render import RenderOptions, render
from routers.nginx.router import NginxRouter, NginxSettings
from routers.process import AgentOptions, ParserFactory, RouterFactory, RouterProcess
from routers.samples.token import LogToken
from tests.support.haproxy_proc import HaproxyProcess, fetch_all, variant_upstreams
from tests.support.nginx_proc import NGINX, NginxProcess
from tests.support.processes import free_port

SERVICE = "shop"
SALT = "s1"
FORGER = "forger-token-0123456789"  # a well-formed token that is not the agent's


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def nginx_line(token: str | None) -> bytes:
    """A line as nginx writes it, for a request of 9 s: any token, or none."""
    record: dict[str, object] = {
        "v": 2, "token": token, "service": SERVICE, "experiment": "42", "salt": SALT,
        "variant": "canary", "status": 200, "request_time": 9.0,
        "upstream_header_time": "9.000", "msec": round(time.time(), 3), "unit_header": "u1",
        "unit_cookie": "", "connection": 1, "connection_requests": 1,
    }  # fmt: skip
    if token is None:
        del record["token"]
    body = json.dumps(record, separators=(",", ":"))
    return f"<190>Dec  6 14:03:01 canary: {body}".encode()


def haproxy_line(token: str | None) -> bytes:
    """A line as HAProxy writes it, for a request of 9 s: any token, or none (`-`)."""
    return (
        f"cx3 {token or '-'} {SERVICE} 42 {SALT} canary 200 9000 0 0 0 9000 9000 "
        f"{time.time():.3f} -- 7531 .\n"
    ).encode()


@dataclass
class Proxy:
    """A running proxy and how an agent for it is built."""

    port: int
    log_port: int
    build_parser: ParserFactory
    build_router: RouterFactory
    forge: Callable[[str | None], bytes]
    given: Callable[[], Awaitable[str]]  # what the proxy holds (include, map value)


@contextlib.asynccontextmanager
async def proxy(kind: str, tmp: Path) -> AsyncIterator[Proxy]:
    log_port = free_udp_port()
    if kind == "haproxy":
        haproxy = HaproxyProcess(log_target=f"127.0.0.1:{log_port}")
        haproxy.start()

        async def held_map() -> str:
            entries = await StatsSocket(haproxy.socket_path).show_map(haproxy.cfg.map_path)
            return " ".join(entry.value for entry in entries)

        try:
            yield Proxy(
                haproxy.port, log_port, lambda t: HaproxyLineParser(SERVICE, token=t),
                lambda _, t: HaproxyRouter(haproxy.cfg, log_token=t), haproxy_line, held_map,
            )  # fmt: skip
        finally:
            haproxy.close()
        return
    nginx = NginxProcess(tmp / "nginx", service=SERVICE)
    port, status = free_port(), free_port()

    def options(log: tuple[str, int], token: LogToken | None) -> RenderOptions:
        return RenderOptions(
            service=SERVICE, listen=f"127.0.0.1:{port}", status_listen=f"127.0.0.1:{status}",
            log_target=f"{log[0]}:{log[1]}", log_token=token,
        )  # fmt: skip

    def nginx_router(log: tuple[str, int], token: LogToken) -> NginxRouter:
        return NginxRouter(NginxSettings(
            render=options(log, token), include=nginx.include, main_conf=nginx.conf,
            nginx=NGINX, prefix=nginx.root, pid_file=nginx.pid_file,
        ))  # fmt: skip

    async def held_include() -> str:
        return nginx.include.read_text()

    nginx.include.write_text(render(None, options(("127.0.0.1", log_port), None)))
    nginx.start(status)
    try:
        yield Proxy(
            port, log_port, lambda t: NginxLineParser(SERVICE, token=t), nginx_router,
            nginx_line, held_include,
        )  # fmt: skip
    finally:
        nginx.close()


@dataclass
class Stores:
    kv: KeyValueStore
    stream: SampleStream
    prefix: str


@pytest.fixture
async def stores(
    etcd_endpoint: str, etcd_prefix: str, redis_url: str, redis_namespace: str
) -> AsyncIterator[Stores]:
    kv = open_kv(etcd_endpoint)
    stream, _ = open_streams(redis_url, namespace=redis_namespace)
    try:
        yield Stores(kv, stream, etcd_prefix)
    finally:
        await kv.close()
        await stream.close()


def agent(p: Proxy, s: Stores) -> RouterProcess:
    return RouterProcess(
        kv=s.kv, stream=s.stream, build_parser=p.build_parser, build_router=p.build_router,
        options=AgentOptions(service=SERVICE, etcd_prefix=s.prefix,
                             log_listen=("127.0.0.1", p.log_port), first_route=10.0),
    )  # fmt: skip


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def admin_get(port: int, path: str) -> str:
    """The body of an admin page."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    head, _, body = answer.decode("latin-1").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200"), head
    return body


async def traffic_and_forgeries(
    p: Proxy, process: RouterProcess, units: list[str], forged: list[bytes]
) -> None:
    """Real requests and forged datagrams side by side, until the agent has seen all."""
    recorded = process.reporter.stats.samples_recorded
    refused = process.parser.rejected["forged"]
    received = process.receiver.stats.datagrams
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    async def forge() -> None:
        for datagram in forged:
            sender.sendto(datagram, ("127.0.0.1", p.log_port))
            await asyncio.sleep(0.002)

    try:
        replies, _ = await asyncio.gather(
            fetch_all(p.port, [{"x-user-id": u} for u in units], concurrency=4), forge()
        )
    finally:
        sender.close()
    assert [r.status for r in replies] == [200] * len(units)
    parser = process.parser
    # a datagram is parsed as it is read: once all are read, all are judged
    await until(lambda: process.receiver.stats.datagrams >= received + len(units) + len(forged))
    # every real line became a sample, no forged one did
    assert process.reporter.stats.samples_recorded == recorded + len(units)
    assert parser.rejected["forged"] == refused + len(forged)


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
async def test_only_lines_with_the_agents_token_become_samples(
    kind: str, tmp_path: Path, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with variant_upstreams("baseline", "canary") as ups, proxy(kind, tmp_path) as p:
        route = Route(
            experiment=42, revision=1, salt=SALT, sticky=Sticky(header="x-user-id"),
            variants=two_way_variants(ups["baseline"].url, ups["canary"].url, 5000),
            state=RouteState.RUNNING,
        )  # fmt: skip
        key = EtcdKeys(stores.prefix).route(SERVICE)
        await stores.kv.put(key, route.model_dump_json().encode())
        forged = [p.forge(FORGER), p.forge(None), p.forge("")] * 10
        # a forged line is one an agent of the forger's token would take as a sample
        assert p.build_parser(LogToken(FORGER)).parse(p.forge(FORGER)) is not None

        first = agent(p, stores)
        await first.start(admin=("127.0.0.1", 0))
        try:
            assert first.agent is not None and first.agent.in_step
            token = first._log_token.value  # the test's look inside: what must not leak
            assert token in await p.given()
            await traffic_and_forgeries(p, first, [f"u{i}" for i in range(60)], forged)
            assert first.parser.rejected.keys() == {"forged"}
            assert first.admin is not None
            status = await admin_get(first.admin.port, "/status")
            metrics = await admin_get(first.admin.port, "/metrics")
            assert json.loads(status)["in_step"] is True
            assert json.loads(status)["warnings"] == []  # joined: real etcd and Redis
            # the agent reports the revision its proxy holds (decision 0053)
            reports = stores.stream
            assert isinstance(reports, RouteReports)
            async with asyncio.timeout(10):
                while 1 not in {r.revision for r in await reports.route_reports(SERVICE)}:
                    await asyncio.sleep(0.05)
            assert first.route_reporter is not None and first.route_reporter.sent >= 1
            (refused,) = [x for x in metrics.splitlines() if '"refused_forged"' in x]
            assert refused.endswith(f" {len(forged)}.0")
            assert token not in status and token not in metrics
        finally:
            await first.stop()

        # a new agent on the same proxy: its own token, in force from its first apply
        second = agent(p, stores)
        await second.start()
        try:
            assert second.agent is not None and second.agent.in_step
            renewed = second._log_token.value
            held = await p.given()
            assert renewed != token and renewed in held and token not in held
            stale = [p.forge(token)] * 5  # the first agent's token is no longer the one
            await traffic_and_forgeries(p, second, [f"v{i}" for i in range(20)], stale)
            assert second.parser.rejected.keys() == {"forged"}
        finally:
            await second.stop()
        assert token not in caplog.text and renewed not in caplog.text
        assert f"{kind} router: experiment 42 revision 1" in caplog.text  # the logs were seen


def test_a_token_is_random_plain_and_never_printed() -> None:
    tokens = {LogToken.generate().value for _ in range(100)}
    assert len(tokens) == 100
    for value in tokens:
        assert len(value) == 24 and re.fullmatch(r"[A-Za-z0-9_-]+", value)  # 144 bits
    token = LogToken(FORGER)
    assert token.matches(FORGER)
    for other in ("", FORGER[:-1], FORGER + "x", FORGER.upper(), FORGER[:-1] + "\xe9", "\ud800"):
        assert not token.matches(other)
    assert FORGER not in repr(token) and FORGER not in str(token) and FORGER not in f"{token}"
    bad_ones = ("short", "a" * 65, "a token with spaces", "a|token|with|bars", "tøken-0123456789")
    for bad in bad_ones:
        with pytest.raises(ValueError):
            LogToken(bad)


def test_haproxys_printed_config_holds_no_token(tmp_path: Path) -> None:
    args = ["router", "haproxy", "--service", SERVICE, "--listen", "127.0.0.1:8080",
            "--socket", str(tmp_path / "a.sock"), "--map", str(tmp_path / "route.map"),
            "--print-config"]  # fmt: skip
    printed = [CliRunner().invoke(cli.app, args) for _ in range(2)]
    assert [p.exit_code for p in printed] == [0, 0]
    config = printed[0].stdout
    # the same text each time: no per-process secret in it; the token comes from the map
    assert printed[1].stdout == config
    assert "set-var(txn.cx_token) var(txn.cx_route),field(6,|)" in config
    assert 'log-format "cx3 %[var(txn.cx_token)] shop ' in config
