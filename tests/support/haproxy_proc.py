"""A real HAProxy a test owns, on its own ports and in its own temp dir, and tiny
upstreams that say which variant they are.

`HaproxyProcess` renders the base config (`routers.haproxy.render`) and runs
`haproxy -f cfg -db` as a child, so a test can stop it (the stats socket is lost)
and start it again on the same ports and files.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from routers.haproxy.render import BaseConfig, render_config, render_map
from tests.support.processes import ServiceProcess, free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


class HaproxyProcess(ServiceProcess):
    """haproxy in the foreground (-db) with a rendered base config."""

    def __init__(self, cfg: BaseConfig | None = None, **options: object) -> None:
        super().__init__("haproxy", free_port())
        base = cfg or BaseConfig(service="shop", listen="x:1", stats_socket="/s", map_path="/m")
        self.cfg = replace(
            base,
            listen=f"127.0.0.1:{self.port}",
            stats_socket=str(self.workdir / "admin.sock"),
            map_path=str(self.workdir / "route.map"),
            **options,  # type: ignore[arg-type]
        )
        (self.workdir / "haproxy.cfg").write_text(render_config(self.cfg))
        (self.workdir / "route.map").write_text(render_map())

    @property
    def socket_path(self) -> str:
        return self.cfg.stats_socket

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        return [HAPROXY, "-f", str(self.workdir / "haproxy.cfg"), "-db"]

    def start(self) -> None:
        Path(self.socket_path).unlink(missing_ok=True)
        super().start()
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket_path):
            if time.monotonic() > deadline:
                raise TimeoutError("haproxy's stats socket did not appear")
            time.sleep(0.02)

    def log_text(self) -> str:
        return (self.workdir / "haproxy.log").read_text(errors="replace")


_HEAD_MAX = 65_536


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names, the last of each
    body: bytes

    @property
    def served_by(self) -> str | None:
        """The variant whose upstream answered (None: HAProxy answered itself)."""
        if self.headers.get("x-upstream") is None:
            return None
        return str(json.loads(self.body)["variant"])


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > _HEAD_MAX:
        raise ValueError("head too long")
    first, *rows = head.decode("latin-1").split("\r\n")
    headers = {}
    for row in rows:
        name, sep, value = row.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return first, headers


class VariantUpstream:
    """An HTTP/1.1 keep-alive server that answers every request with its variant's
    name and the variant headers it was sent."""

    def __init__(self, variant: str, status: int = 200) -> None:
        self.variant = variant
        self.status = status
        self.seen = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, headers = await _read_head(reader)
                self.seen += 1
                body = json.dumps(
                    {
                        "variant": self.variant,
                        "seen_variant": headers.get("x-canary-variant"),
                        "seen_experiment": headers.get("x-canary-experiment"),
                    }
                ).encode()
                writer.write(
                    f"HTTP/1.1 {self.status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nx-upstream: {self.variant}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        except asyncio.CancelledError:
            pass  # the test is over: the loop cancels the connections left
        finally:
            writer.close()


@asynccontextmanager
async def variant_upstreams(*names: str) -> AsyncIterator[dict[str, VariantUpstream]]:
    """One tiny upstream per variant: variant → its server."""
    servers = {name: VariantUpstream(name) for name in names}
    for server in servers.values():
        await server.start()
    try:
        yield servers
    finally:
        for server in servers.values():
            await server.close()


async def fetch_all(
    port: int, requests: Sequence[Mapping[str, str]], *, concurrency: int = 8
) -> list[Reply]:
    """GET / with each header set, over `concurrency` keep-alive connections; the
    replies in the order of `requests`."""
    replies: list[Reply | None] = [None] * len(requests)
    todo = iter(range(len(requests)))

    async def worker() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for index in todo:
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", port)
            reader, writer = conn
            extra = "".join(f"{k}: {v}\r\n" for k, v in requests[index].items())
            writer.write(f"GET / HTTP/1.1\r\nhost: t\r\n{extra}\r\n".encode("latin-1"))
            first, headers = await _read_head(reader)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            replies[index] = Reply(int(first.split(" ")[1]), headers, body)
            if headers.get("connection", "").lower() == "close":
                writer.close()
                conn = None
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for r in replies if r is not None]


class LogSink:
    """A UDP socket the test binds, to receive HAProxy's log datagrams."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    async def receive(self, count: int, *, timeout: float = 5.0) -> list[bytes]:
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        async with asyncio.timeout(timeout):
            while len(got) < count:
                got.append(await loop.sock_recv(self.sock, 65_536))
        return got

    def drain(self) -> None:
        while True:
            try:
                self.sock.recv(65_536)
            except BlockingIOError:
                return


__all__ = [
    "HaproxyProcess",
    "LogSink",
    "Reply",
    "VariantUpstream",
    "fetch_all",
    "variant_upstreams",
]
