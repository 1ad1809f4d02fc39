"""`python -m sidecar.workers.worker`: one worker process of a supervised sidecar.

It reads its `WorkerSpec` from the first line of stdin and then runs an ordinary
sidecar (`run_sidecar`) on the shared port, with its own route watcher, its own
sample reporter (its own instance id, so its batches' (src, seq) never collide with
another worker's) and its admin endpoints on a Unix socket the supervisor reads.

It stops, draining as on SIGTERM, when the supervisor asks (SIGTERM) or goes away:
the supervisor holds the other end of stdin open for the worker's whole life, so
end-of-file on stdin means there is no supervisor any more.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from collections.abc import Callable

from pydantic import ValidationError

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.logs import configure_logging
from controlplane.kernel.sample_keys import SampleKeys, load_sample_keys
from controlplane.kernel.settings import Settings
from sidecar.choice import Upstream
from sidecar.main import ClientBounds, Timeouts, listen_tls_context, run_loop, run_sidecar
from sidecar.reporter import instance_id
from sidecar.workers.spec import MAX_SPEC_BYTES, WorkerSpec

CONFIG_ERROR = 2  # exit code: the spec or what it names cannot be used


class _SupervisorPipe(asyncio.Protocol):
    """Calls `gone` once stdin reaches end-of-file (or fails): the supervisor is gone."""

    def __init__(self, gone: Callable[[], None]) -> None:
        self._gone = gone

    def data_received(self, data: bytes) -> None:
        pass  # nothing follows the spec line

    def eof_received(self) -> bool | None:
        self._gone()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()


async def serve(
    spec: WorkerSpec,
    settings: Settings,
    sample_keys: SampleKeys | None,
    listen_tls: ssl.SSLContext | None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(lambda: _SupervisorPipe(stop.set), sys.stdin)
    if spec.listen_fd is not None:
        listen: tuple[str, int] | socket.socket = socket.socket(fileno=spec.listen_fd)
    else:
        listen = (spec.host, spec.port)
    try:
        await run_sidecar(
            settings,
            service=spec.service,
            listen=listen,
            reuse_port=spec.listen_fd is None,
            admin=spec.admin_socket,
            reporter_source=instance_id(f"w{spec.index}"),
            default_upstream=spec.default_upstream,
            force_header_enabled=spec.force_header_enabled,
            timeouts=Timeouts(
                connect=spec.connect_timeout,
                read=spec.read_timeout,
                head=spec.head_timeout,
                tunnel_idle=spec.tunnel_idle_timeout,
                tls_handshake=spec.tls_handshake_timeout,
            ),
            max_connections=spec.max_connections,
            max_tunnels=spec.max_tunnels,
            bounds=ClientBounds(
                max_connections_per_client=spec.max_connections_per_client,
                ipv6_prefix=spec.client_ipv6_prefix,
                max_headers=spec.max_headers,
            ),
            stop=stop,
            sample_keys=sample_keys,
            listen_tls=listen_tls,
        )
    finally:
        transport.close()


def main() -> int:
    line = sys.stdin.buffer.readline(MAX_SPEC_BYTES + 1)
    try:
        spec = WorkerSpec.from_line(line)
        # the worker's admin socket is read by its supervisor alone, inside a private
        # directory: the admin token guards the supervisor's endpoint instead
        settings = Settings.model_validate(spec.settings).model_copy(
            update={"admin_token_file": None}
        )
        sample_keys = load_sample_keys(spec.sample_keys_file)
        listen_tls = listen_tls_context(spec.tls_cert, spec.tls_key)
        if spec.default_upstream:
            Upstream.parse(spec.default_upstream)
    except (ValidationError, ConfigError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"canary sidecar worker: {first}", file=sys.stderr)
        return CONFIG_ERROR
    configure_logging(
        settings.log_level,
        settings.log_format,
        text_format=f"%(asctime)s %(levelname)s %(name)s[worker {spec.index}]: %(message)s",
        fields={"worker": spec.index},
    )
    run_loop(serve(spec, settings, sample_keys, listen_tls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
