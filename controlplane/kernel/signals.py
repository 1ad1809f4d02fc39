"""SIGTERM and SIGINT as a callback on the running event loop, for long-lived processes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[], None]) -> Iterator[list[signal.Signals]]:
    """Call `callback` on SIGTERM/SIGINT while the block runs; yield the signals handled.

    A loop without signal support (some platforms, or not the main thread) handles
    none: the caller still stops by its own means (an event, a cancellation).
    """
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, callback)
        except (NotImplementedError, RuntimeError, ValueError):
            # a loop without signal support (Windows) or outside the main thread: the
            # caller then stops some other way (its own shutdown path, a cancel)
            continue
        handled.append(sig)
    try:
        yield handled
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
