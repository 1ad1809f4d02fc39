"""Asks admin endpoints' /healthz and /metrics in turn until its stdin closes, then
prints each answer's latency per path as JSON.

`canary bench scale` runs it as a process of its own, as a kubelet or Prometheus is:
a probe thread inside the benchmark's process (which runs the leader's rounds) waited
for that process's GIL at every send and receive, and measured its own waits as the
endpoint's latency.

Run: `python -m controlplane.benchmarks.admin_probe EVERY_SEC TIMEOUT_SEC PORT...`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

PATHS = ("/healthz", "/metrics")


def probe(
    ports: list[int], every: float, timeout: float, stop: threading.Event
) -> dict[str, Any]:
    """Each path's latencies in seconds (an answer not within `timeout` counts as
    that long, and as missed), until `stop`."""
    import httpx

    latencies: dict[str, list[float]] = {path: [] for path in PATHS}
    missed = 0
    with httpx.Client(timeout=timeout) as client:
        while not stop.is_set():
            for port in ports:
                for path in PATHS:
                    began = time.perf_counter()
                    try:
                        client.get(f"http://127.0.0.1:{port}{path}")
                    except httpx.HTTPError:
                        missed += 1
                    latencies[path].append(time.perf_counter() - began)
            stop.wait(every)
    return {"latencies": latencies, "missed": missed}


def main(argv: list[str]) -> int:
    try:
        every, timeout = float(argv[0]), float(argv[1])
        ports = [int(port) for port in argv[2:]]
    except (IndexError, ValueError):
        print("usage: admin_probe EVERY_SEC TIMEOUT_SEC PORT...", file=sys.stderr)
        return 2
    if not ports or not 0 < every <= 60 or not 0 < timeout <= 60:
        print("admin_probe: one port at least, and times within (0, 60] s", file=sys.stderr)
        return 2
    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    print(json.dumps(probe(ports, every, timeout, stop)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
