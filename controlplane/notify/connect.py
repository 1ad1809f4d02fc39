"""Webhook connections made only to addresses the notification policy admits.

The URL's text was judged when it was accepted, but a name can resolve to anything
at send time (DNS rebinding: a name that answered with a public address at
subscription time answers 169.254.169.254 later). So the network backend resolves
the name once, judges every address it resolved to, and connects the socket to a
judged address itself; the Host header and the TLS server name keep the name, since
httpcore still sees it as the origin. One blocked address refuses the whole name: a
name that can lead to a metadata service is not a webhook.

httpx has no setting for the network backend, so `CheckedTransport` is the small
adapter between httpx's request and an `httpcore.AsyncConnectionPool` built with
ours (the same few lines as httpx's own transport, through public APIs only).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence

import httpcore
import httpx

from controlplane.kernel.hosts import IPAddress

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
# why a connection to (host as the URL names it, address it resolved to) is refused
Judge = Callable[[str, IPAddress], str | None]


class RefusedAddress(Exception):
    """The name resolved to an address the policy refuses; no connection was made."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The addresses getaddrinfo gives for `host`, in its order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        # an IPv6 link-local answer carries its zone ("fe80::1%eth0"): judged without it
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


class CheckedBackend(httpcore.AsyncNetworkBackend):
    def __init__(
        self,
        judge: Judge,
        resolve: Resolver = system_resolver,
        inner: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self._judge = judge
        self._resolve = resolve
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await self._resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no address for the host within {timeout:g}s") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve the host: {exc}") from exc
        if not addresses:
            raise httpcore.ConnectError("the host resolved to no address")
        for address in addresses:
            reason = self._judge(host, address)
            if reason is not None:
                raise RefusedAddress(f"{reason} ({address})")
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options,
                )  # fmt: skip
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc  # the next address may answer
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise RefusedAddress("webhooks are sent over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _ResponseBody(httpx.AsyncByteStream):
    def __init__(self, response: httpcore.Response) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_stream():
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class CheckedTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over a `CheckedBackend`; no proxies (a proxy would make the connection
    the check cannot see)."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend, ssl_context: ssl.SSLContext) -> None:
        self._pool = httpcore.AsyncConnectionPool(ssl_context=ssl_context, network_backend=backend)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        response = await self._pool.handle_async_request(
            httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
        )
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseBody(response),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
