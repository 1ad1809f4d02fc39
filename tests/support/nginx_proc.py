"""A real nginx a test owns: its own prefix directory, ports, pid file and error log.

The main config includes one file per service from `conf.d/`; the router under test
rewrites that include and reloads this nginx through its pid file.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.processes import wait_port

NGINX = "/usr/sbin/nginx"
_TEMP_DIRS = ("body", "proxy", "fastcgi", "uwsgi", "scgi")


def main_config(root: Path, include: Path, extra_http: str = "") -> str:
    temp = "\n".join(f"    {name}_temp_path {root / 'temp' / name};" for name in _TEMP_DIRS)
    temp = temp.replace("body_temp_path", "client_body_temp_path")
    return f"""worker_processes 1;
pid {root / "nginx.pid"};
error_log {root / "error.log"} info;
events {{ worker_connections 512; }}
http {{
{temp}
    access_log off;
{extra_http}
    include {include};
}}
"""


class NginxProcess:
    """nginx in the foreground (`daemon off`) with a master, so SIGHUP reloads it."""

    def __init__(self, root: Path, *, service: str, extra_http: str = "") -> None:
        self.root = root
        (root / "conf.d").mkdir(parents=True, exist_ok=True)
        (root / "temp").mkdir(exist_ok=True)
        self.include = root / "conf.d" / f"canary-{service}.conf"
        self.conf = root / "nginx.conf"
        self.pid_file = root / "nginx.pid"
        self.error_log = root / "error.log"
        self.conf.write_text(main_config(root, self.include, extra_http))
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        return [NGINX, "-p", str(self.root), "-c", str(self.conf)]

    def start(self, wait_for_port: int) -> None:
        with open(self.root / "stderr.log", "ab") as stderr:
            self.proc = subprocess.Popen(
                [*self.args(), "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=stderr
            )
        try:
            wait_port(wait_for_port, timeout=10)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"nginx did not start: {self.errors()}") from None

    def errors(self) -> str:
        text = ""
        for name in ("stderr.log", "error.log"):
            path = self.root / name
            if path.exists():
                text += path.read_text(errors="replace")[-2000:]
        return text

    def master_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


__all__ = ["NGINX", "NginxProcess", "main_config"]
