"""`canary bench sidecar-python`: the proxy's own work per request, without sockets.

Requests go through `ClientConnection` and `UpstreamConnection` as the event loop
would hand them over (a GET as wrk sends it, nginx's answer to it), with transports
that take the bytes and do nothing: what is left is the proxy's Python (and the
httptools parser), none of the kernel's work. Two figures:

- CPU µs per request in this process (best of 5 runs), which a busy machine inflates;
- instructions per request under valgrind's callgrind, when valgrind is installed:
  a run of N requests minus a run of none, the same on a loaded machine as on a
  quiet one (user space only).

When this tree's proxy modules are compiled (decision 0034), they are measured as
`now` and again as pure Python (`now_pure`, with CANARY_PURE_PYTHON=1): the ratios
`compiled_over_pure` say what compiling is worth. With
`CANARY_BENCH_BEFORE=<git revision>`, the same driver runs that revision's proxy too
(`before`, never compiled), and the ratios say what changed.

The driver runs as a script (`python sidecar_python.py N [once]`), so that a
revision unpacked elsewhere is imported in its place through PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"  # wrk's request
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Wed, 02 Dec 2026 08:00:00 GMT\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n"
)
# `varied`: answers whose head changes from one response to the next (a length per
# response, more distinct heads than a pool keeps), so that no response head is ever
# found parsed before: the cost of the caches when they miss
VARIED = [
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Wed, 02 Dec 2026 08:00:00 GMT\r\n"
    b"Content-Type: text/plain\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
    % (n, b"x" * n)
    for n in range(1, 98)
]
VARIED_NOTE = "97 responses of different lengths in turn, none found parsed before"
CONNECTIONS = 4
WARMUP = 2_000
SCRIPT = Path(__file__).resolve()


class NullTransport:
    """Takes whatever is written; says it is connected to 127.0.0.1."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, parts: Sequence[bytes]) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


async def _drive(count: int, repeats: int, responses: Sequence[bytes] = (RESPONSE,)) -> float:
    """Best CPU µs per request over `repeats` runs of `count` requests."""
    from controlplane.kernel.codec import BatchBuilder
    from sidecar.choice import Choice, Upstream
    from sidecar.proxy import ProxyServer
    from sidecar.proxy.client import ClientConnection
    from sidecar.proxy.upstream import UpstreamConnection

    upstream = Upstream.parse("http://127.0.0.1:9")
    choice = Choice(experiment="bench", variant="baseline", upstream=upstream, unit_hash=0)

    class FixedChooser:
        def choose(self, headers: Any) -> Choice:
            return choice

    class BatchingRecorder:  # as `canary bench sidecar`'s proxy records
        def __init__(self) -> None:
            self.batch = BatchBuilder()

        def record_many(self, samples: Sequence[Any]) -> None:  # a revision before columns
            ts, _, variants, rt_us, outcomes, units, first = zip(*samples, strict=True)
            self._add(ts, variants, rt_us, outcomes, units, first)

        def record_columns(self, columns: Any) -> None:
            self._add(
                columns.ts, columns.variants, columns.rt_us, columns.outcomes,
                columns.units, columns.first_byte_us,
            )  # fmt: skip

        def _add(self, *columns: Sequence[Any]) -> None:
            self.batch.add_columns(*columns)
            if len(self.batch) >= 512:
                self.batch.encode()
                self.batch = BatchBuilder()

    server = ProxyServer(FixedChooser(), BatchingRecorder())  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    server._loop = loop  # the proxy is driven here, not listening
    server.time = loop.time
    pool = server.pool_for(upstream)
    clients = []
    for _ in range(CONNECTIONS):
        client = ClientConnection(server)
        client.connection_made(NullTransport())  # type: ignore[arg-type]
        conn = UpstreamConnection(pool)
        conn.connection_made(NullTransport())  # type: ignore[arg-type]
        pool.release(conn)
        clients.append(client)

    kinds = len(responses)

    def requests(n: int) -> None:
        for i in range(n):
            client = clients[i % CONNECTIONS]
            client.data_received(REQUEST)
            exchange = client.current
            if exchange is None or exchange.upstream is None:
                raise RuntimeError("the request did not reach an upstream connection")
            exchange.upstream.data_received(responses[i % kinds])

    requests(WARMUP)
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        requests(count)
        best = min(best, (time.process_time() - started) / max(count, 1) * 1e6)
    server.flush_samples()
    return best


def _main(argv: list[str]) -> None:
    count = int(argv[0])
    repeats = 1 if "once" in argv else 5
    responses = VARIED if "varied" in argv else [RESPONSE]
    try:
        import uvloop
    except ImportError:
        per_request = asyncio.run(_drive(count, repeats, responses))
    else:
        per_request = uvloop.run(_drive(count, repeats, responses))
    print(f"{per_request:.4f}")


# --- the benchmark -------------------------------------------------------------


def _script(
    tree: Path | None, args: list[str], *, valgrind: str | None = None, pure: bool = False
) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree if tree is not None else SCRIPT.parents[2])}
    if pure:
        from sidecar.compiled import PURE_ENV

        env[PURE_ENV] = "1"
    command = [sys.executable, str(SCRIPT), *args]
    if valgrind is not None:
        command = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return done.stdout + done.stderr


def _instructions(
    tree: Path | None, valgrind: str, count: int, *, pure: bool, varied: bool = False
) -> int:
    """User-space instructions per request: a run of `count` minus a run of none."""
    from controlplane.benchmarks.callgrind import instructions_per

    args = ["once", *(["varied"] if varied else [])]
    return instructions_per(
        count, lambda n: _script(tree, [str(n), *args], valgrind=valgrind, pure=pure)
    )


def _measure(
    tree: Path | None,
    *,
    count: int,
    valgrind: str | None,
    progress: bool,
    pure: bool = False,
    varied: bool = False,
) -> dict[str, Any]:
    name = "before" if tree is not None else ("now_pure" if pure else "now")
    name += "_varied" if varied else ""
    if progress:
        print(f"[{name}] CPU per request ...", file=sys.stderr, flush=True)
    out = _script(tree, [str(count), *(["varied"] if varied else [])], pure=pure)
    figures: dict[str, Any] = {"cpu_us_per_request": float(out.split()[-1])}
    if valgrind is not None:
        if progress:
            print(f"[{name}] instructions per request (callgrind) ...", file=sys.stderr, flush=True)
        figures["instructions_per_request"] = _instructions(
            tree, valgrind, count // 10, pure=pure, varied=varied
        )
    return figures


def run(*, quick: bool, progress: bool) -> dict[str, Any]:
    # here, not at the top: the driver runs with another revision's tree on the path
    from controlplane.benchmarks.revision import measure_before, ratios

    count = 20_000 if quick else 100_000
    valgrind = shutil.which("valgrind")
    result: dict[str, Any] = {
        "benchmark": "sidecar-python",
        "quick": quick,
        "requests": count,
        "request": REQUEST.decode(),
        "instructions": f"callgrind, {count // 10} requests" if valgrind else None,
    }
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = round(os.getloadavg()[0], 2)
    from sidecar import compiled

    use, result["proxy_build"] = compiled.select()
    result["now"] = _measure(None, count=count, valgrind=valgrind, progress=progress)
    # the same with heads that never repeat: what the response-head caches cost a
    # response they do not know (only this tree's driver has this mode)
    result["response_heads_varied"] = VARIED_NOTE
    result["now_varied"] = _measure(
        None, count=count, valgrind=valgrind, progress=progress, varied=True
    )
    if use:
        result["now_pure"] = _measure(
            None, count=count, valgrind=valgrind, progress=progress, pure=True
        )
        result["compiled_over_pure"] = ratios(result["now"], result["now_pure"])
    measure_before(
        result, lambda tree: _measure(tree, count=count, valgrind=valgrind, progress=progress)
    )
    return result


if __name__ == "__main__":
    # run as a script, this file's folder comes first on sys.path, and its
    # `sidecar.py` would hide the `sidecar` package: PYTHONPATH says which one
    if sys.path and Path(sys.path[0]).resolve() == SCRIPT.parent:
        sys.path.pop(0)
    _main(sys.argv[1:])
