"""A real grpcio server for the proxy's gRPC tests, without generated code.

Service `test.Echo`, messages as raw bytes:

- `Echo` (unary): answers the request; `fail:<code>` aborts with that status code
  (trailers-only when nothing was sent), `slow:<ms>` answers after that long; while
  `fail_code` is set every call aborts with it;
- `Count` (server streaming): `<n>:<size>` answers n messages of `size` bytes;
- `Chat` (bidirectional): echoes each message.

Every call ends with the trailer `x-served-by: <name>`, so a test sees which upstream
answered and that trailers came through the proxy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc


def _same(data: bytes) -> bytes:
    return data


class GrpcUpstream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.port = 0
        self.fail_code: int | None = None
        self._server: grpc.aio.Server | None = None

    @property
    def url(self) -> str:
        return f"h2c://127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "test.Echo",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(self._echo, _same, _same),
                "Count": grpc.unary_stream_rpc_method_handler(self._count, _same, _same),
                "Chat": grpc.stream_stream_rpc_method_handler(self._chat, _same, _same),
            },
        )
        server.add_generic_rpc_handlers((handler,))
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)

    def _served(self, context: grpc.aio.ServicerContext) -> None:
        self.calls += 1
        context.set_trailing_metadata((("x-served-by", self.name),))

    async def _echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._served(context)
        if self.fail_code is not None:
            await context.abort(status_code(self.fail_code), "this upstream is failing")
        if request.startswith(b"fail:"):
            await context.abort(status_code(int(request[5:])), "asked to fail")
        if request.startswith(b"slow:"):
            await asyncio.sleep(int(request[5:]) / 1000)
        return request

    async def _count(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self._served(context)
        count, size = (int(part) for part in request.split(b":"))
        for i in range(count):
            yield bytes([i % 256]) * size

    async def _chat(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self._served(context)
        async for message in requests:
            yield message


def status_code(value: int) -> grpc.StatusCode:
    return next(code for code in grpc.StatusCode if code.value[0] == value)


def echo(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        "/test.Echo/Echo", request_serializer=_same, response_deserializer=_same
    )


def count(channel: grpc.aio.Channel) -> grpc.aio.UnaryStreamMultiCallable:
    return channel.unary_stream(
        "/test.Echo/Count", request_serializer=_same, response_deserializer=_same
    )


def chat(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(
        "/test.Echo/Chat", request_serializer=_same, response_deserializer=_same
    )
