"""`NginxRouter`: puts a route in force in a running nginx (the TrafficRouter seam).

The operator's main config includes one file per service (`include`); the router
owns that file. `apply(route)`:

1. renders the include (render.py); a route nginx cannot serve is refused here;
2. writes it as a candidate next to the live include and runs `nginx -t` on a
   check config of its own that includes only the candidate, so a bad render is
   caught before anything live changes;
3. replaces the live include with the candidate (rename: atomic) and runs
   `nginx -t` on the main config, which also catches a clash with the rest of it;
4. reloads nginx (SIGHUP to the master named by the pid file, else `nginx -s
   reload`);
5. polls the include's status server until nginx itself answers the new
   experiment and revision, and (on Linux) until the workers that served before
   the reload have stopped accepting connections (workers.py: nginx keeps both
   generations accepting for about 100 ms after a reload);
   bounded by `confirm_timeout`.

Any failure after step 3 puts the previous include back (and reloads again if the
reload had been sent) and raises RouterError with nginx's own message; the route
in force before the call stays in force. `in_force()` asks the status server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from controlplane.kernel.routes import Route
from routers.nginx.render import STATUS_PATH, RenderOptions, address, render
from routers.nginx.workers import master_of, serving_workers
from routers.seam import InForce, RouterError

_STATUS_MAX: Final = 4_096
_STDERR_MAX: Final = 65_536
_MESSAGE_MAX: Final = 400
_PID_MAX: Final = 32
_TEMP_DIRS: Final = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
# `nginx: [emerg] …` before the error log is open, `2026/12/06 14:03:50 [emerg] 1#1: …` after
_SEVERE: Final = re.compile(
    r"(?:nginx: )?(?:[0-9/]{10} [0-9:]{8} )?\[(?:emerg|alert|crit|error)\] (?:[0-9]+#[0-9]+: )?"
)


@dataclass(frozen=True, slots=True)
class NginxSettings:
    """Where the router finds nginx and the files it owns.

    `include` is the file the main config (`main_conf`) includes for this service;
    `prefix` is nginx's `-p` when the main config relies on one. `pid_file` names
    the master to SIGHUP; without it the router runs `nginx -s reload`.
    """

    render: RenderOptions
    include: Path
    main_conf: Path
    nginx: str = "/usr/sbin/nginx"
    prefix: Path | None = None
    pid_file: Path | None = None
    min_interval: float = 0.25
    command_timeout: float = 10.0
    confirm_timeout: float = 5.0
    poll_interval: float = 0.02


@dataclass
class NginxStats:
    applies: int = 0  # routes put in force and confirmed
    reloads: int = 0  # reload signals sent (restores included)
    failures: int = 0  # applies that raised RouterError
    restores: int = 0  # times the previous include was put back
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class IncludeFiles:
    """The live include and the router's files beside it."""

    live: Path
    candidate: Path
    scratch: Path  # for atomic writes of a restore
    check_dir: Path
    check_conf: Path

    @classmethod
    def of(cls, include: Path) -> IncludeFiles:
        # dot-names: a main config's `include conf.d/*.conf` never picks them up
        check_dir = include.parent / f".{include.name}.check"
        return cls(
            live=include,
            candidate=include.parent / f".{include.name}.candidate",
            scratch=include.parent / f".{include.name}.restore",
            check_dir=check_dir,
            check_conf=check_dir / "nginx.conf",
        )


def check_config(files: IncludeFiles) -> str:
    """A main config that includes only the candidate, with every path nginx writes
    during `-t` inside the check directory."""
    temps = "\n".join(f"    {name}_temp_path {files.check_dir / name};" for name in _TEMP_DIRS)
    return (
        f"pid {files.check_dir / 'nginx.pid'};\n"
        f"error_log {files.check_dir / 'error.log'};\n"
        "events { worker_connections 64; }\n"
        "http {\n"
        f"{temps}\n"
        f"    include {files.candidate};\n"
        "}\n"
    )


def nginx_message(stderr: str) -> str:
    """nginx's one line that says what is wrong, without its time, level and pid:
    `host not found in upstream "x:80" in /etc/nginx/conf.d/x.conf:5`."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    found = [m for m in map(_SEVERE.match, lines) if m is not None]
    chosen = lines[-1] if lines else ""
    if found:
        chosen = found[0].string[found[0].end() :]
    chosen = "".join(char if char.isprintable() else "?" for char in chosen)
    return chosen[:_MESSAGE_MAX] or "no message from nginx"


@dataclass(frozen=True, slots=True)
class StatusAnswer:
    """What the status endpoint says: the route in force, and the worker that said it."""

    in_force: InForce
    worker: int


def parse_status(raw: bytes, service: str) -> StatusAnswer:
    """The status server's answer (an HTTP/1.0 response); ValueError when not ours."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith((b"HTTP/1.1 200 ", b"HTTP/1.0 200 ")):
        raise ValueError("the nginx status endpoint did not answer 200")
    data: Any = json.loads(body.decode("ascii"))
    if not isinstance(data, dict) or set(data) != {"service", "experiment", "revision", "worker"}:
        raise ValueError("the nginx status endpoint answered an unexpected object")
    if data["service"] != service:
        raise ValueError("the nginx status endpoint belongs to another service")
    experiment, revision, worker = data["experiment"], data["revision"], data["worker"]
    if not (experiment is None or isinstance(experiment, str)):
        raise ValueError("the nginx status endpoint's experiment is not a string")
    if not (revision is None or _is_int(revision)):
        raise ValueError("the nginx status endpoint's revision is not an integer")
    if not _is_int(worker) or worker <= 1:
        raise ValueError("the nginx status endpoint's worker is not a pid")
    return StatusAnswer(InForce(experiment, revision), worker)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _write_atomically(path: Path, scratch: Path, text: bytes) -> None:
    with open(scratch, "wb") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(scratch, path)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class NginxRouter:
    """One service's route in one nginx (TrafficRouter)."""

    def __init__(
        self,
        settings: NginxSettings,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.stats = NginxStats()
        self._files = IncludeFiles.of(settings.include)
        self._status = address(settings.render.status_listen, what="the status address")
        self._sleep = sleep
        self._monotonic = monotonic
        self._lock = asyncio.Lock()

    @property
    def kind(self) -> str:
        return "nginx"

    @property
    def min_interval(self) -> float:
        return self.settings.min_interval

    async def apply(self, route: Route | None) -> None:
        async with self._lock:
            try:
                try:
                    await self._apply(route)
                except OSError as exc:  # the include's directory: permissions, disk
                    raise RouterError(f"cannot write the nginx include: {exc}") from None
            except RouterError as exc:
                self.stats.failures += 1
                self.stats.last_error = str(exc)
                raise
            self.stats.applies += 1

    async def in_force(self) -> InForce:
        return (await self._status_answer()).in_force

    async def _status_answer(self) -> StatusAnswer:
        host, port = self._status
        timeout = self.settings.command_timeout
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), port), timeout
            )
        except (OSError, TimeoutError) as exc:
            raise RouterError(f"nginx status endpoint {host}:{port} unreachable: {exc}") from exc
        try:
            request = f"GET {STATUS_PATH} HTTP/1.0\r\nHost: canary-status\r\n\r\n"
            writer.write(request.encode())
            raw = await asyncio.wait_for(reader.read(_STATUS_MAX + 1), timeout)
            while raw and len(raw) <= _STATUS_MAX:
                more = await asyncio.wait_for(reader.read(_STATUS_MAX + 1 - len(raw)), timeout)
                if not more:
                    break
                raw += more
        except (OSError, TimeoutError) as exc:
            raise RouterError(f"nginx status endpoint {host}:{port} failed: {exc}") from exc
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if len(raw) > _STATUS_MAX:
            raise RouterError("the nginx status endpoint answered too much")
        try:
            return parse_status(raw, self.settings.render.service)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RouterError(str(exc)) from None

    async def close(self) -> None:
        return None

    # -- the steps ------------------------------------------------------------------

    async def _apply(self, route: Route | None) -> None:
        try:
            text = render(route, self.settings.render).encode()
        except ValueError as exc:
            raise RouterError(f"nginx cannot serve this route: {exc}") from None
        wanted = InForce.of(route)
        previous = _read(self._files.live)
        if previous == text and await self._holds(wanted):
            return
        await self._check_candidate(text)
        os.replace(self._files.candidate, self._files.live)
        reloaded = False
        try:
            await self._test_main()
            master, old = await self._reload()
            reloaded = True
            await self._confirm(wanted, master, old)
        except RouterError:
            await self._restore(previous, reload=reloaded)
            raise

    async def _holds(self, wanted: InForce) -> bool:
        try:
            return await self.in_force() == wanted
        except RouterError:
            return False

    async def _check_candidate(self, text: bytes) -> None:
        files = self._files
        files.check_dir.mkdir(exist_ok=True)
        for name in _TEMP_DIRS:
            (files.check_dir / name).mkdir(exist_ok=True)
        files.check_conf.write_text(check_config(files))
        _write_atomically(files.candidate, files.scratch, text)
        code, stderr = await self._nginx(
            "-t", "-q", "-p", str(files.check_dir), "-c", str(files.check_conf)
        )
        if code != 0:
            files.candidate.unlink(missing_ok=True)
            raise RouterError(f"nginx refused the route: {nginx_message(stderr)}")

    def _main_args(self) -> list[str]:
        prefix = ["-p", str(self.settings.prefix)] if self.settings.prefix else []
        return [*prefix, "-c", str(self.settings.main_conf)]

    async def _test_main(self) -> None:
        code, stderr = await self._nginx("-t", "-q", *self._main_args())
        if code != 0:
            raise RouterError(f"nginx refused its config with the route: {nginx_message(stderr)}")

    async def _reload(self) -> tuple[int | None, set[int]]:
        """Sends the reload; returns the master's pid (when known) and the workers
        that served before it, which must stop accepting before the route holds."""
        self.stats.reloads += 1
        if self.settings.pid_file is None:
            master = await self._master_from_status()
            old = serving_workers(master) if master is not None else set()
            code, stderr = await self._nginx(*self._main_args(), "-s", "reload")
            if code != 0:
                raise RouterError(f"nginx reload failed: {nginx_message(stderr)}")
            return master, old
        master = self._master_from_pid_file(self.settings.pid_file)
        old = serving_workers(master)
        try:
            os.kill(master, signal.SIGHUP)
        except OSError as exc:
            raise RouterError(f"cannot signal nginx to reload: {exc}") from None
        return master, old

    @staticmethod
    def _master_from_pid_file(pid_file: Path) -> int:
        try:
            with open(pid_file, "rb") as handle:
                raw = handle.read(_PID_MAX + 1)
        except OSError as exc:
            raise RouterError(f"cannot read the nginx pid file: {exc}") from None
        text = raw.decode("ascii", errors="replace").strip()
        if len(raw) > _PID_MAX or not text.isascii() or not text.isdigit() or int(text) <= 1:
            raise RouterError(f"nginx pid file {pid_file} does not hold a pid")
        return int(text)

    async def _master_from_status(self) -> int | None:
        try:
            answer = await self._status_answer()
        except RouterError:
            return None  # nginx down: the reload says so
        return master_of(answer.worker)

    async def _confirm(self, wanted: InForce, master: int | None, old: set[int]) -> None:
        deadline = self._monotonic() + self.settings.confirm_timeout
        seen: InForce | str = "no answer"
        while True:
            try:
                seen = await self.in_force()
            except RouterError as exc:
                seen = str(exc)
            if seen == wanted:
                if master is None or not old & serving_workers(master):
                    return
                seen = "its previous workers still accepting connections"
            if self._monotonic() >= deadline:
                raise RouterError(
                    f"nginx did not put revision {wanted.revision} in force within "
                    f"{self.settings.confirm_timeout:g} s ({seen})"
                )
            await self._sleep(self.settings.poll_interval)

    async def _restore(self, previous: bytes | None, *, reload: bool) -> None:
        self.stats.restores += 1
        if previous is None:
            self._files.live.unlink(missing_ok=True)
        else:
            _write_atomically(self._files.live, self._files.scratch, previous)
        if reload:
            # best effort: the error raised is the one that made us restore
            with contextlib.suppress(RouterError):
                await self._reload()

    async def _nginx(self, *args: str) -> tuple[int, str]:
        timeout = self.settings.command_timeout
        try:
            proc = await asyncio.create_subprocess_exec(
                self.settings.nginx,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise RouterError(f"cannot run {self.settings.nginx}: {exc.strerror}") from None
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RouterError(f"nginx {args[0]} did not finish within {timeout:g} s") from None
        assert proc.returncode is not None
        return proc.returncode, stderr[:_STDERR_MAX].decode("utf-8", errors="replace")


__all__ = [
    "IncludeFiles",
    "NginxRouter",
    "NginxSettings",
    "NginxStats",
    "StatusAnswer",
    "check_config",
    "nginx_message",
    "parse_status",
]
