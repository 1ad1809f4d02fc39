"""One GET to a worker's admin endpoints over its Unix socket.

The worker's admin server answers one request per connection, with Content-Length,
and closes; anything else (a status line that does not parse, a body longer than
`max_bytes` or not the length announced, no answer within `timeout`) is a
`ScrapeError`.
"""

from __future__ import annotations

import asyncio
import contextlib

MAX_BODY_BYTES = 8 * 1024 * 1024
_CHUNK = 64 * 1024


class ScrapeError(Exception):
    """The worker did not answer, or not with a well-formed response."""


async def get(
    socket_path: str, target: str, *, timeout: float, max_bytes: int = MAX_BODY_BYTES
) -> tuple[int, bytes]:
    """(status, body) of `GET target` on the worker's admin socket."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(socket_path)
            try:
                writer.write(
                    f"GET {target} HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n".encode()
                )
                data = bytearray()
                while chunk := await reader.read(_CHUNK):
                    data += chunk
                    if len(data) > max_bytes + 16 * 1024:
                        raise ScrapeError(f"answer over {max_bytes} bytes")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError as exc:
        raise ScrapeError(f"no answer within {timeout:g} s") from exc
    except OSError as exc:
        raise ScrapeError(str(exc) or type(exc).__name__) from exc
    return parse_response(bytes(data), max_bytes)


def parse_response(data: bytes, max_bytes: int = MAX_BODY_BYTES) -> tuple[int, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise ScrapeError("incomplete response head")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or parts[0] != b"HTTP/1.1" or not parts[1].isdigit() or len(parts[1]) != 3:
        raise ScrapeError("malformed status line")
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"content-length":
            text = value.strip()
            if not text.isdigit() or length is not None:
                raise ScrapeError("malformed Content-Length")
            length = int(text)
    if length is None or length != len(body) or length > max_bytes:
        raise ScrapeError("body length does not match Content-Length")
    return int(parts[1]), body
