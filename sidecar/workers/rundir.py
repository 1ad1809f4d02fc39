"""Where the workers' admin sockets live: a private directory the supervisor makes.

Only the owner may enter it (mode 0700), which is what guards the workers' admin
endpoints: they answer without a token, and only the supervisor reads them. The
first writable place wins: systemd's RuntimeDirectory, $XDG_RUNTIME_DIR, $TMPDIR,
/tmp, /var/tmp, then /dev/shm (writable in most containers whose root file system is
read-only). A socket path must fit in a `sockaddr_un` (108 bytes on Linux).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from controlplane.kernel.errors import ConfigError

MAX_SOCKET_PATH = 100  # below sun_path's 108 bytes (104 on the BSDs)
LONGEST_NAME = len("/worker-999.sock")


def candidates(env: Mapping[str, str]) -> list[str]:
    found = [
        (env.get("RUNTIME_DIRECTORY") or "").split(":")[0],
        env.get("XDG_RUNTIME_DIR", ""),
        env.get("TMPDIR", ""),
        "/tmp",
        "/var/tmp",
        "/dev/shm",
    ]
    return list(dict.fromkeys(place for place in found if place))


def make_socket_dir(env: Mapping[str, str] | None = None) -> Path:
    """A fresh private directory for the admin sockets, or ConfigError naming the
    places tried."""
    tried = candidates(os.environ if env is None else env)
    for place in tried:
        try:
            made = Path(tempfile.mkdtemp(prefix="canary-sidecar-", dir=place))
        except OSError:
            continue
        if len(str(made)) + LONGEST_NAME <= MAX_SOCKET_PATH:
            return made
        made.rmdir()
    raise ConfigError(
        "no writable directory with a short enough path for the workers' admin sockets "
        f"(tried {', '.join(tried)}): set TMPDIR"
    )
