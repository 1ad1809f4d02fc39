"""The probe of a service's own overload signal against real sources: an HTTP server on
a free port that answers what the test says (or nothing), and files."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.overload import ExternalSignal
from sidecar.overload.levels import Level
from sidecar.overload.probe import MAX_BODY, ExternalProbe, ProbeFailed, parse_value
from sidecar.overload.signals import ExternalReading, Grades


@pytest.mark.parametrize(
    ("body", "value"),
    [
        (b"0", 0.0),
        (b"0.75\n", 0.75),
        (b"  1234 \r\n", 1234.0),
        (b"-3", -3.0),
        (b"1e3", 1000.0),
        (b"2.5E-1", 0.25),
    ],
)
def test_a_value_is_one_decimal_number(body: bytes, value: float) -> None:
    assert parse_value(body) == value


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not_a_number"),
        (b"nan", "not_a_number"),
        (b"inf", "not_a_number"),
        (b"0x10", "not_a_number"),
        (b"1_000", "not_a_number"),
        (b"01", "not_a_number"),
        (b"1.", "not_a_number"),
        (b"+1", "not_a_number"),
        (b"1 2", "not_a_number"),
        (b'{"value": 1}', "not_a_number"),
        (b"1e400", "not_a_number"),
        (b"2e12", "not_a_number"),  # beyond the bound
        (b"\xff", "not_a_number"),
        (b"1" * (MAX_BODY + 1), "too_large"),
    ],
)
def test_anything_else_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(ProbeFailed) as failed:
        parse_value(body)
    assert failed.value.reason == reason


@asynccontextmanager
async def server(answers: list[bytes | None]) -> AsyncIterator[str]:
    """Answers each request with the next raw response (None: says nothing)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                answer = answers.pop(0)
                if answer is None:
                    await asyncio.sleep(30)
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/load"
    finally:
        srv.close()


def ok(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


def probe(source: str, clock: FakeClock, **fields: object) -> ExternalProbe:
    signal = ExternalSignal.model_validate(
        {"source": source, "light": 0.5, "heavy": 0.8, "severe": 0.9, "timeout_ms": 200} | fields
    )
    reading = ExternalReading(
        Grades(0.5, 0.8, 0.9), hysteresis=0.1, stale_after=5.0, failure_level=Level.NORMAL
    )
    return ExternalProbe(signal, reading, monotonic=clock.monotonic)


async def test_http_values_and_failures_are_read_and_counted() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"400\r\n" + b"1" * 1024 + b"\r\n" for _ in range(3)
    )
    answers: list[bytes | None] = [
        ok(b"0.85\n"),
        ok(b"busy"),
        ok(b"0.2", b"503 Service Unavailable"),
        chunked,  # beyond the bound, whatever the framing
        ok(b"0.95"),
        None,  # silence: the timeout
    ]
    clock = FakeClock()
    async with server(answers) as url:
        p = probe(url, clock)
        r = p.reading
        await p.read_once()
        assert (r.value, r.level_at(clock.monotonic())) == (0.85, Level.HEAVY)
        for _ in range(3):
            clock.advance(1.0)
            await p.read_once()
        assert r.failures == {"not_a_number": 1, "bad_status": 1, "too_large": 1}
        assert r.value == 0.85 and r.level_at(clock.monotonic()) is Level.HEAVY  # fresh still
        await p.read_once()
        assert (r.value, r.level, r.failing) == (0.95, Level.SEVERE, False)
        await p.read_once()
        assert r.failures["timeout"] == 1 and r.failing
        await p.close()
    clock.advance(6.0)
    assert r.level_at(clock.monotonic()) is Level.NORMAL  # stale: ignored


async def test_an_unreachable_endpoint_is_counted() -> None:
    async with server([]) as url:
        pass  # closed: nothing listens there any more
    p = probe(url, FakeClock())
    await p.read_once()
    await p.close()
    assert p.reading.failures == {"unreachable": 1} and p.reading.value is None


async def test_a_file_is_read_each_time(tmp_path: Path) -> None:
    path = tmp_path / "queue-depth"
    clock = FakeClock()
    p = probe(f"file:{path}", clock)
    await p.read_once()
    assert p.reading.failures == {"unreachable": 1}  # not there yet
    path.write_text("0.6\n")
    await p.read_once()
    assert (p.reading.value, p.reading.level) == (0.6, Level.LIGHT)
    path.write_text("12 jobs")
    await p.read_once()
    path.write_bytes(b"9" * (MAX_BODY + 10))
    await p.read_once()
    assert p.reading.failures == {"unreachable": 1, "not_a_number": 1, "too_large": 1}
    assert p.reading.value == 0.6


@pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is not None, reason="NVML bindings installed here"
)
async def test_nvml_without_its_bindings_is_reported_unavailable() -> None:
    p = probe("nvml", FakeClock())
    await p.read_once()
    assert p.reading.failures == {"unavailable": 1}
    assert p.reading.last_error == "unavailable: NVML unavailable: nvidia-ml-py is not installed"
    assert p.reading.level_at(0.0) is Level.NORMAL  # never sheds on it


async def test_a_blocked_file_read_is_waited_for_not_repeated(tmp_path: Path) -> None:
    fifo = tmp_path / "signal"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: a hung mount
    p = probe(f"file:{fifo}", FakeClock(), timeout_ms=50)
    await p.read_once()
    await p.read_once()  # the first read's thread is still blocked: no second one
    assert p.reading.failures == {"timeout": 2}
    assert p.reading.last_error == "timeout: the previous read has not returned yet"

    def unblock() -> None:
        with fifo.open("w") as writer:
            writer.write("0.3")

    await asyncio.to_thread(unblock)
    fifo.unlink()
    fifo.write_text("0.7")
    async with asyncio.timeout(10):
        while p.reading.value is None:  # until the blocked thread has returned
            await p.read_once()
            await asyncio.sleep(0.01)
    assert p.reading.value == 0.7  # the late answer of the blocked read is not used
