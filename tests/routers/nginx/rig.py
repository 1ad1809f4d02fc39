"""Real parts for the nginx router tests: nginx on private ports, small upstreams
that say which variant they are, a pipelining HTTP/1.1 client and the UDP socket
nginx's access log is sent to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.kernel.routes import Route, RouteState, RouteVariant, Sticky
from routers.nginx.render import DEFAULT_CA, RenderOptions, render
from routers.nginx.router import NginxRouter, NginxSettings
from routers.samples.token import LogToken
from routers.seam import TrafficRouter
from tests.support.nginx_proc import NGINX, NginxProcess
from tests.support.processes import free_port

SERVICE = "pay-api"
SALT = "s1"
MAX_HEAD = 65_536


class VariantUpstream:
    """Answers every request with JSON naming itself and the tags it was sent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                target = lines[0].split(" ")[1]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                self.requests += 1
                body = json.dumps(
                    {
                        "upstream": self.name,
                        "target": target,
                        "host": headers.get("host"),
                        "variant": headers.get("x-canary-variant"),
                        "experiment": headers.get("x-canary-experiment"),
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"X-Canary-Variant: the-upstream-says\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        self._writers.discard(writer)
        writer.close()


@dataclass
class Response:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> dict[str, str]:
        data: dict[str, str] = json.loads(self.body)
        return data


async def _read_response(reader: asyncio.StreamReader) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        if line:
            key, _, value = line.partition(":")
            headers.setdefault(key.strip().lower(), []).append(value.strip())
    length = int(headers.get("content-length", ["0"])[0])
    return Response(status, headers, await reader.readexactly(length))


async def fetch_many(
    port: int, requests: Sequence[Mapping[str, str]], *, path: str = "/", per_connection: int = 400
) -> list[Response]:
    """Sends each request (its extra headers) pipelined, `per_connection` a connection
    (below nginx's keepalive_requests), the connections side by side."""

    async def one_connection(batch: Sequence[Mapping[str, str]]) -> list[Response]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            data = b"".join(
                (
                    f"GET {path} HTTP/1.1\r\nHost: shop.test\r\n"
                    + "".join(f"{k}: {v}\r\n" for k, v in extra.items())
                    + "\r\n"
                ).encode("latin-1")
                for extra in batch
            )
            writer.write(data)
            await writer.drain()
            return [await _read_response(reader) for _ in batch]
        finally:
            writer.close()

    batches = [requests[i : i + per_connection] for i in range(0, len(requests), per_connection)]
    results = await asyncio.gather(*(one_connection(b) for b in batches))
    return [response for batch in results for response in batch]


async def fetch(port: int, headers: Mapping[str, str] | None = None, path: str = "/") -> Response:
    return (await fetch_many(port, [headers or {}], path=path))[0]


def route(
    revision: int,
    variants: Sequence[tuple[str, str, int]],
    *,
    experiment: int | str = 42,
    sticky: Sticky | None = None,
    salt: str = SALT,
) -> Route:
    return Route(
        experiment=experiment,
        revision=revision,
        salt=salt,
        sticky=sticky or Sticky(header="X-User-Id", cookie="uid"),
        variants=tuple(RouteVariant(name=n, upstream=u, weight=w) for n, u, w in variants),
        state=RouteState.RUNNING,
    )


@dataclass
class Rig:
    nginx: NginxProcess
    router: NginxRouter
    options: RenderOptions
    port: int
    log: socket.socket
    upstreams: dict[str, VariantUpstream] = field(default_factory=dict)
    token: LogToken = field(default_factory=LogToken.generate)

    def two_way(self, revision: int, canary_bp: int, **kwargs: object) -> Route:
        return route(
            revision,
            [
                ("baseline", self.upstreams["baseline"].url, 10_000 - canary_bp),
                ("canary", self.upstreams["canary"].url, canary_bp),
            ],
            **kwargs,  # type: ignore[arg-type]
        )

    def datagrams(self, count: int, timeout: float = 5.0) -> list[bytes]:
        self.log.settimeout(timeout)
        return [self.log.recv(65_536) for _ in range(count)]


@contextlib.asynccontextmanager
async def nginx_rig(
    tmp: Path,
    *,
    allow_force: bool = False,
    extra_http: str = "",
    pid_file: Path | None = None,
    reload_by_command: bool = False,
    confirm_timeout: float = 5.0,
    trusted_ca: str | None = None,
    default_upstream: bool = False,
) -> AsyncIterator[Rig]:
    upstreams = {name: VariantUpstream(name) for name in ("baseline", "canary", "canary-b")}
    for upstream in upstreams.values():
        await upstream.start()
    default = upstreams["baseline"].url + "/home" if default_upstream else None
    log = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    log.bind(("127.0.0.1", 0))
    port, status_port = free_port(), free_port()
    token = LogToken.generate()
    options = RenderOptions(
        service=SERVICE,
        listen=f"127.0.0.1:{port}",
        status_listen=f"127.0.0.1:{status_port}",
        log_target=f"127.0.0.1:{log.getsockname()[1]}",
        allow_force=allow_force,
        trusted_ca=trusted_ca or DEFAULT_CA,
        default_upstream=default,
        log_token=token,
    )
    proc = NginxProcess(tmp / "nginx", service=SERVICE, extra_http=extra_http)
    proc.include.write_text(render(None, options))
    proc.start(status_port)
    router = NginxRouter(
        NginxSettings(
            render=options,
            include=proc.include,
            main_conf=proc.conf,
            nginx=NGINX,
            prefix=proc.root,
            pid_file=None if reload_by_command else pid_file or proc.pid_file,
            confirm_timeout=confirm_timeout,
        )
    )
    _: TrafficRouter = router  # the seam, checked by mypy
    try:
        yield Rig(proc, router, options, port, log, upstreams, token)
    finally:
        await router.close()
        proc.close()
        log.close()
        for upstream in upstreams.values():
            await upstream.close()
