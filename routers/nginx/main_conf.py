"""A main nginx.conf for a router's nginx, for a newcomer or a test (pure: paths → text).

Teams that already run nginx add one line to their own `http {}` instead:
`include <conf dir>/canary-*.conf;` — the router owns only its service's include.
This config is the whole of nginx for a machine that has none yet: every path
absolute and under one root, so no packaged default (/var/log/nginx, /run) is needed,
and nothing but the canary includes in `http {}`.
"""

from __future__ import annotations

from pathlib import Path

_TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def include_path(conf_dir: Path, service: str) -> Path:
    """The service's include, the one file its router rewrites."""
    return conf_dir / f"canary-{service}.conf"


def main_config(root: Path, conf_dir: Path, *, workers: str = "auto") -> str:
    """nginx.conf with its pid, error log and temp files under `root`."""
    temp = "\n".join(
        f"    {name}_temp_path {root / 'temp' / name};" for name in _TEMP_DIRS
    )
    return f"""# written by `canary router nginx --print-config`
worker_processes {workers};
pid {root / "nginx.pid"};
error_log {root / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
{temp}
    access_log off;
    include {conf_dir}/canary-*.conf;
}}
"""


def temp_dirs(root: Path) -> list[Path]:
    return [root / "temp" / name for name in _TEMP_DIRS]


__all__ = ["include_path", "main_config", "temp_dirs"]
