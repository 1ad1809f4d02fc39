"""Write batching shared by both sides of the proxy.

Everything a connection writes between `cork()` and `uncork()` leaves in one send,
so a response head and its first body chunk (or several pipelined responses) cost
one syscall instead of one each.
"""

from __future__ import annotations

import asyncio


class CorkedWriter:
    """A mixin for protocols with `closed` and `transport`; it owns the held writes."""

    __slots__ = ("_out",)

    _out: list[bytes] | None  # set by the protocol's __init__: None while not corked
    closed: bool
    transport: asyncio.Transport | None

    def write(self, data: bytes) -> None:
        out = self._out
        if out is not None:
            out.append(data)
        elif not self.closed and self.transport is not None:
            self.transport.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        out = self._out
        if out is not None:
            out += parts
        elif not self.closed and self.transport is not None:
            self.transport.writelines(parts)

    def cork(self) -> bool:
        """Hold writes until `uncork()`; False if they are held already (nested)."""
        if self._out is not None:
            return False
        self._out = []
        return True

    def send_held(self) -> None:
        """Send what `cork()` held, in one go, and stop holding."""
        out = self._out
        self._out = None
        if out and not self.closed and self.transport is not None:
            if len(out) == 1:
                self.transport.write(out[0])
            else:
                self.transport.write(b"".join(out))
