"""A real webhook receiver for the tests: an ASGI app served by uvicorn on a free port,
in a thread (so synchronous CLI tests and asyncio tests can both send to it).

It records every request (headers, body) and answers from a script of statuses
(then `default`), optionally with a Retry-After header.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn

STARTUP_TIMEOUT_SEC = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    statuses: deque[int] = field(default_factory=deque)
    default: int = 200
    retry_after: str | None = None
    requests: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, *statuses: int) -> None:
        with self._lock:
            self.statuses.extend(statuses)

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.requests)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            self.requests.append(Received(scope["path"], headers, body))
            status = self.statuses.popleft() if self.statuses else self.default
        reply = [(b"content-type", b"text/plain")]
        if self.retry_after is not None:
            reply.append((b"retry-after", self.retry_after.encode()))
        await send({"type": "http.response.start", "status": status, "headers": reply})
        await send({"type": "http.response.body", "body": b"ok" if status < 300 else b"no"})


@contextmanager
def receiving(
    receiver: Receiver, *, certfile: str | None = None, keyfile: str | None = None
) -> Iterator[str]:
    """Serve `receiver` on a free port (over TLS with a certificate); yield its URL."""
    port = free_port()
    config = uvicorn.Config(
        receiver, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="off",
        ssl_certfile=certfile, ssl_keyfile=keyfile,
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="webhook-receiver", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_SEC
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=5)
            raise RuntimeError("the webhook receiver did not start")
        time.sleep(0.01)
    try:
        yield f"{'https' if certfile else 'http'}://127.0.0.1:{port}/hook"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
