"""The access-log receiver: every datagram handed on, drops and oversize counted."""

from __future__ import annotations

import asyncio
import socket

from routers.samples.lines import MAX_LINE
from routers.samples.receiver import LogReceiver


async def _until(predicate: object, timeout: float = 5.0) -> None:
    assert callable(predicate)
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def test_every_datagram_is_handed_on_in_order() -> None:
    got: list[bytes] = []
    receiver = LogReceiver(got.append)
    receiver.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for i in range(2000):
                sender.sendto(b"line %d" % i, receiver.address)
        await _until(lambda: len(got) == 2000)
        assert got == [b"line %d" % i for i in range(2000)]
        assert receiver.stats.datagrams == 2000 and receiver.stats.dropped_kernel == 0
    finally:
        receiver.close()


async def test_a_line_longer_than_the_bound_is_counted_not_handled() -> None:
    got: list[bytes] = []
    receiver = LogReceiver(got.append)
    receiver.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"x" * (MAX_LINE + 1), receiver.address)
            sender.sendto(b"ok", receiver.address)
        await _until(lambda: receiver.stats.datagrams == 2)
        assert got == [b"ok"] and receiver.stats.too_long == 1
    finally:
        receiver.close()


async def test_lines_the_kernel_dropped_for_a_full_buffer_are_counted() -> None:
    got: list[bytes] = []
    # a small buffer and a stalled reader: the kernel must drop, and say how many
    receiver = LogReceiver(got.append, receive_buffer=4096)
    receiver.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for _ in range(500):  # sent before the loop runs the reader again
                sender.sendto(b"y" * 300, receiver.address)
        receiver.refresh_drops()
        await _until(lambda: len(got) + receiver.stats.dropped_kernel >= 500)
        assert receiver.stats.dropped_kernel > 0
        assert len(got) + receiver.stats.dropped_kernel == 500
    finally:
        receiver.close()


async def test_a_handler_that_raises_does_not_stop_the_receiver() -> None:
    got: list[bytes] = []

    def handle(data: bytes) -> None:
        if data == b"bad":
            raise ValueError("a parser bug")
        got.append(data)

    receiver = LogReceiver(handle)
    receiver.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for data in (b"a", b"bad", b"b"):
                sender.sendto(data, receiver.address)
        await _until(lambda: receiver.stats.datagrams == 3)
        assert got == [b"a", b"b"] and receiver.stats.read_errors == 1
    finally:
        receiver.close()
