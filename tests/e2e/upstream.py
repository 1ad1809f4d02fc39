"""One upstream process for the end-to-end tests: `python -m tests.e2e.upstream`.

It serves the demo's upstream (a lognormal latency profile) on --port and follows a
control file: a JSON object such as {"factor": 5} that the test rewrites to slow the
upstream down (or {"factor": 1} to restore it). The file is re-read whenever its
modification time changes, so a switch takes effect within one poll interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from pathlib import Path

from controlplane.demo.upstreams import LatencyProfile, UpstreamServer

POLL_SEC = 0.02


def apply_control(path: Path, profile: LatencyProfile, seen: float | None) -> float | None:
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return seen
    if mtime == seen:
        return seen
    try:
        data = json.loads(path.read_text())
        profile.degrade(float(data.get("factor", 1.0)))
    except (ValueError, OSError):
        return seen  # half-written: read it again at the next poll
    print(f"upstream factor now {profile.factor:g}", flush=True)
    return mtime


async def serve(args: argparse.Namespace) -> None:
    profile = LatencyProfile(median_ms=args.median_ms, sigma=args.sigma, error_rate=args.error_rate)
    server = UpstreamServer(args.name, profile, seed=args.seed)
    await server.start("127.0.0.1", args.port)
    print(f"upstream {args.name} on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    control = Path(args.control)
    seen: float | None = None
    try:
        while not stop.is_set():
            seen = apply_control(control, profile, seen)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_SEC)
    finally:
        await server.close()
        print(f"upstream {args.name} served {server.stats.requests} requests", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", required=True, help="JSON control file")
    parser.add_argument("--median-ms", type=float, default=50.0)
    parser.add_argument("--sigma", type=float, default=0.3)
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
