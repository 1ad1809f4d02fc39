"""The steady feed of `canary bench scale`: the sidecars of N services, in one process.

    python -m controlplane.benchmarks.scale_feed REDIS NAMESPACE SAMPLES

Reads one JSON line on stdin, the [experiment, service] pairs; then every second
sends each experiment's sidecar batch of SAMPLES samples (signed with the first key
of CANARY_SAMPLE_KEYS), until stdin ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time

from controlplane.benchmarks.scale import Sidecars
from controlplane.kernel.sample_auth import SampleSigner
from controlplane.kernel.sample_keys import KEYS_ENV, parse_sample_keys
from controlplane.kernel.streams_redis import RedisStreams

PER_SEND = 200  # batches in flight at once


async def _feed(redis_url: str, namespace: str, samples: int) -> None:
    experiments = [(str(e), str(s)) for e, s in json.loads(sys.stdin.readline())]
    ended = asyncio.ensure_future(asyncio.to_thread(sys.stdin.read))
    streams = RedisStreams(redis_url, namespace=namespace)
    keys = parse_sample_keys(os.environ[KEYS_ENV], origin=KEYS_ENV)
    sidecars = Sidecars(streams, SampleSigner(keys), tag="feed")
    try:
        while not ended.done():
            began = time.monotonic()
            for i in range(0, len(experiments), PER_SEND):
                now = time.time()
                await sidecars.send([
                    (service, sidecars.entry(service, experiment, samples, now))
                    for experiment, service in experiments[i : i + PER_SEND]
                ])  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(ended), max(0.0, 1.0 - (time.monotonic() - began))
                )
    finally:
        await streams.close()


def main() -> None:
    redis_url, namespace, samples = sys.argv[1:4]
    asyncio.run(_feed(redis_url, namespace, int(samples)))


if __name__ == "__main__":
    main()
