"""Reads the service's own overload signal (`signals.external` of its overload config)
into an `ExternalReading`, every `interval_ms`: the I/O edge of `signals.py`.

Sources: `http://…` (a GET; the body is the number), `file:/…` (the file holds it),
`nvml` (the used share of a GPU's memory, through `pynvml` from the `nvidia-ml-py`
package when it is installed and finds the GPU). Every attempt is bounded: by
`timeout_ms`, and by `MAX_BODY` bytes read. What comes back is parsed strictly
(`parse_value`): one decimal number, nothing else. A failed attempt is counted by
reason and changes nothing else; the reading it did not replace goes stale in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from controlplane.kernel.overload import ExternalSignal, source_kind
from sidecar.overload.signals import (
    BAD_STATUS,
    NOT_A_NUMBER,
    TIMEOUT,
    TOO_LARGE,
    UNAVAILABLE,
    UNREACHABLE,
    ExternalReading,
    FailureReason,
)
from sidecar.proxy.limits import RateLimitedLog

log = logging.getLogger("canary.sidecar.overload")

T = TypeVar("T")
R = TypeVar("R")

MAX_BODY = 1024  # bytes; a number needs far fewer
MAX_VALUE = 1e12
FAILURE_LOG_INTERVAL = 60.0  # seconds between two lines on a failing probe
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,15})?(?:[eE][+-]?[0-9]{1,3})?")


class ProbeFailed(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: FailureReason = reason


def parse_value(body: bytes) -> float:
    """One decimal number, surrounding ASCII whitespace allowed; ProbeFailed otherwise."""
    if len(body) > MAX_BODY:
        raise ProbeFailed(TOO_LARGE, f"more than {MAX_BODY} bytes")
    text = body.strip(b" \t\r\n")
    if not _NUMBER.fullmatch(text):
        raise ProbeFailed(NOT_A_NUMBER, f"not one decimal number: {text[:40]!r}")
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_VALUE:
        raise ProbeFailed(NOT_A_NUMBER, f"out of range: {text[:40]!r}")
    return value


class Nvml:
    """The used share of one GPU's memory through NVML; ProbeFailed(unavailable) when
    `pynvml` cannot be imported or finds no such GPU (said once, then counted)."""

    def __init__(self) -> None:
        self._lib: Any = None

    def memory_share(self, index: int) -> float:
        lib = self._lib
        if lib is None:
            try:
                import pynvml  # optional: from nvidia-ml-py
            except ImportError as exc:
                detail = "NVML unavailable: nvidia-ml-py is not installed"
                raise ProbeFailed(UNAVAILABLE, detail) from exc
            try:
                pynvml.nvmlInit()
            except Exception as exc:  # NVMLError: no driver, no GPU
                raise ProbeFailed(UNAVAILABLE, f"NVML unavailable: {exc}") from exc
            lib = self._lib = pynvml
        try:
            info = lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(index))
            used, total = float(info.used), float(info.total)
        except Exception as exc:  # NVMLError: no GPU at that index, lost driver
            raise ProbeFailed(UNAVAILABLE, f"NVML: GPU {index}: {exc}") from exc
        if not total > 0:
            raise ProbeFailed(UNAVAILABLE, f"NVML: GPU {index} reports no memory")
        return used / total


def _read_file(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(MAX_BODY + 1)


class ExternalProbe:
    def __init__(
        self,
        signal: ExternalSignal,
        reading: ExternalReading,
        *,
        monotonic: Callable[[], float],
        nvml: Nvml | None = None,
    ) -> None:
        self.signal = signal
        self.reading = reading
        self.monotonic = monotonic
        self.kind = source_kind(signal.source)
        self._nvml = nvml or Nvml()
        self._client: Any = None  # httpx.AsyncClient, for an HTTP source
        self._thread: asyncio.Future[Any] | None = None  # a file or NVML read under way
        if self.kind == "http":  # imported here, not within the first read's timeout
            import httpx

            self._client = httpx.AsyncClient(timeout=None, follow_redirects=False, trust_env=False)
        self._log = RateLimitedLog(log, monotonic, FAILURE_LOG_INTERVAL)

    async def read_once(self) -> None:
        """One attempt: the reading gets a value or a counted failure."""
        timeout = self.signal.timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout):
                value = await self._read()
        except ProbeFailed as exc:
            self._failed(exc.reason, str(exc))
        except TimeoutError:
            self._failed(TIMEOUT, f"no answer within {timeout:g} s")
        except OSError as exc:
            self._failed(UNREACHABLE, exc.strerror or type(exc).__name__)
        except Exception as exc:  # whatever else a client library raises: the probe goes on
            self._failed(UNREACHABLE, f"{type(exc).__name__}: {exc}")
        else:
            self.reading.record(self.monotonic(), value)

    async def _read(self) -> float:
        source = self.signal.source
        if self.kind == "file":
            body = await self._in_thread(_read_file, Path(source[len("file:") :]))
            return parse_value(body)
        if self.kind == "nvml":
            return await self._in_thread(self._nvml.memory_share, self.signal.gpu)
        return parse_value(await self._get(source))

    async def _in_thread(self, fn: Callable[[T], R], arg: T) -> R:
        """`fn(arg)` in a thread, one at a time: a thread cannot be cancelled, so a
        read blocked past its timeout (a hung mount, a wedged driver) is waited for
        instead of piling up another thread every interval."""
        if self._thread is not None and not self._thread.done():
            raise ProbeFailed(TIMEOUT, "the previous read has not returned yet")
        future = asyncio.ensure_future(asyncio.to_thread(fn, arg))
        # its outcome is read here, or, after a timeout, by nobody: not an error
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._thread = future
        return await asyncio.shield(future)

    async def _get(self, url: str) -> bytes:
        import httpx

        if self._client is None:
            raise ProbeFailed(UNREACHABLE, "the probe is closed")
        try:
            async with self._client.stream("GET", url) as answer:
                if answer.status_code != 200:
                    raise ProbeFailed(BAD_STATUS, f"status {answer.status_code}")
                body = b""
                async for chunk in answer.aiter_raw():
                    body += chunk
                    if len(body) > MAX_BODY:
                        raise ProbeFailed(TOO_LARGE, f"more than {MAX_BODY} bytes")
                return body
        except httpx.TransportError as exc:
            raise ProbeFailed(UNREACHABLE, f"{type(exc).__name__}: {exc}") from exc

    def _failed(self, reason: FailureReason, detail: str) -> None:
        self.reading.fail(reason, detail)
        self._log.warning(
            "overload signal %s failed: %s (%s)",
            self.signal.source,
            reason,
            detail,
        )

    async def run(self) -> None:
        """Read every `interval_ms` until cancelled."""
        interval = self.signal.interval_ms / 1000
        try:
            while True:
                started = self.monotonic()
                await self.read_once()
                await asyncio.sleep(max(0.0, interval - (self.monotonic() - started)))
        finally:
            await self.close()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
