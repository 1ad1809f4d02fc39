"""`canary serve` and `canary dev` stop on the first SIGINT/SIGTERM, whenever it arrives.

uvicorn's own handler only sets a flag, and reads it once the app's lifespan startup
has returned: a stop during a startup that waits (a backend that does not answer)
would wait with it. So the lifespan runs here, as a task a stop signal cancels, and
uvicorn serves with `lifespan="off"`, handling the signals itself only while it serves.
Before the event loop (settings, migrations check, tokens), a stop signal raises
`Stopped` wherever the main thread is, so blocking calls are left at once.

A stopped process ends the way the signal's default would end it, once it has shut
down: SIGINT as an interrupt (exit 130), SIGTERM by the signal itself, which systemd
and the kubelet take as a clean stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from controlplane.kernel.tasks import cancel_and_wait

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

log = logging.getLogger("canary")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# the exit code a shell gives a process interrupted by SIGINT; typer's for Ctrl-C too
INTERRUPTED_EXIT = 128 + signal.SIGINT
# uvicorn's exit code when the app's lifespan startup fails
STARTUP_FAILED = 3

Handler = Callable[[int, FrameType | None], object] | int | None


class Stopped(BaseException):
    """A stop signal arrived before the process served (BaseException: no `except
    Exception` on the way retries or swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextlib.contextmanager
def handling(handler: Callable[[int, FrameType | None], object]) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM while the block runs, then the previous ones.

    Outside the main thread (where Python runs no signal handler) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Handler] = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def exit_stopped(signum: int) -> None:
    """End the process as the signal's default would, once the stop is done."""
    if signum == signal.SIGINT:
        import typer

        raise typer.Exit(INTERRUPTED_EXIT)
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


async def serve_app(server: uvicorn.Server, app: Starlette) -> int | None:
    """Run `app`'s lifespan around uvicorn's serving (its config: `lifespan="off"`);
    the first stop signal received, or None.

    A stop signal during the lifespan's startup cancels it (its own cleanup closes what
    it had opened) and nothing is served. While uvicorn serves, its handler takes the
    signals; it drains, and hands the signal back here once it has returned."""
    loop = asyncio.get_running_loop()
    received: list[int] = []
    stop = asyncio.Event()

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        # uvicorn reads the flag if it is entering `serve` as the signal lands
        server.should_exit = True
        loop.call_soon_threadsafe(stop.set)  # from a handler: wake the loop

    with handling(note):
        lifespan = app.router.lifespan_context(app)
        starting = asyncio.ensure_future(lifespan.__aenter__())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not starting.done():
            log.warning(
                "%s during startup: cancelling it, nothing will be served", signal_name(received[0])
            )
            await cancel_and_wait(starting)
            return received[0]
        try:
            starting.result()
        except Exception as exc:
            import typer

            log.exception("the application's startup failed")
            raise typer.Exit(STARTUP_FAILED) from exc
        try:
            if not received:  # else the startup completed as the signal came: stop at once
                await server.serve()
        finally:
            await lifespan.__aexit__(None, None, None)
    return received[0] if received else None


@contextlib.contextmanager
def stopping_on_signals(command: str) -> Iterator[None]:
    """A stop signal in the block raises `Stopped` (the event loop's own handling takes
    over while it runs); the process then says so and ends as the signal would."""
    try:
        with handling(raise_stopped):
            yield
    except Stopped as stopped:
        log.warning("canary %s: stopped by %s", command, stopped)
        exit_stopped(stopped.signum)
