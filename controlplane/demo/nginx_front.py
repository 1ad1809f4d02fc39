"""The demo's users through NGINX instead of our sidecar (`canary demo --router nginx`).

A real nginx in a temporary directory, on a free port, from the main config `canary
router nginx --print-config` prints, and its router agent in this process on the
demo's shared stores: the route the controller decides reaches nginx through the
include the agent renders and reloads, and the samples come from nginx's access
log. Needs Debian's nginx (nginx-light).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from pathlib import Path

from controlplane.kernel.clock import Clock
from controlplane.kernel.kv import KeyValueStore
from controlplane.kernel.sample_keys import SampleKeys
from controlplane.kernel.streams import SampleStream
from routers.nginx.log_lines import NginxLineParser
from routers.nginx.main_conf import include_path, main_config, temp_dirs
from routers.nginx.render import RenderOptions, render
from routers.nginx.router import NginxRouter, NginxSettings
from routers.process import AgentOptions, RouterProcess
from routers.samples.token import LogToken

NGINX_CANDIDATES = ("nginx", "/usr/sbin/nginx")


def find_nginx() -> str | None:
    for candidate in NGINX_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class NginxFront:
    """nginx and its agent, started and stopped together."""

    def __init__(
        self, *, service: str, kv: KeyValueStore, stream: SampleStream, etcd_prefix: str,
        default_upstream: str, clock: Clock, sample_keys: SampleKeys | None,
    ) -> None:
        nginx = find_nginx()
        if nginx is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
        self.nginx = nginx
        self.service = service
        self.port = _free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="canary-demo-nginx-")
        self.root = Path(self._tmp.name)
        self._status = _free_port()
        self._default_upstream = default_upstream
        self._proc: asyncio.subprocess.Process | None = None
        conf_dir = self.root / "conf.d"
        self.include = include_path(conf_dir, service)
        self.conf = self.root / "nginx.conf"
        self.process = RouterProcess(
            kv=kv, stream=stream, build_parser=lambda token: NginxLineParser(service, token=token),
            build_router=self._router,
            options=AgentOptions(service=service, etcd_prefix=etcd_prefix), clock=clock,
            sample_keys=sample_keys, source_tag="nginx",
        )  # fmt: skip
        self._conf_dir = conf_dir

    def _options(
        self, log_target: tuple[str, int] | None, token: LogToken | None = None
    ) -> RenderOptions:
        return RenderOptions(
            service=self.service, listen=f"127.0.0.1:{self.port}",
            status_listen=f"127.0.0.1:{self._status}",
            log_target=f"{log_target[0]}:{log_target[1]}" if log_target else None,
            default_upstream=self._default_upstream, log_token=token,
        )  # fmt: skip

    def _router(self, log_target: tuple[str, int], token: LogToken) -> NginxRouter:
        return NginxRouter(NginxSettings(
            render=self._options(log_target, token), include=self.include, main_conf=self.conf,
            nginx=self.nginx, pid_file=self.root / "nginx.pid",
        ))  # fmt: skip

    async def start(self) -> None:
        self._conf_dir.mkdir(parents=True)
        for path in temp_dirs(self.root):
            path.mkdir(parents=True)
        self.conf.write_text(main_config(self.root, self._conf_dir, workers="1"))
        self.include.write_text(render(None, self._options(None)))
        self._proc = await asyncio.create_subprocess_exec(
            self.nginx, "-p", str(self.root), "-c", str(self.conf), "-g", "daemon off;",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await self._wait_listening()
        await self.process.start()

    async def _wait_listening(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                if self._proc is not None and self._proc.returncode is not None:
                    errors = (self.root / "error.log").read_text(errors="replace")[-400:]
                    raise RuntimeError(f"nginx did not start: {errors.strip()}")
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                    writer.close()
                    return
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        await self.process.stop()
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._tmp.cleanup()


__all__ = ["NginxFront", "find_nginx"]
