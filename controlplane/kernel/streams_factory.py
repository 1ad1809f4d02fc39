"""Choose the sample-stream and snapshot backend from a URL (CANARY_REDIS_URL).

    memory://            MemoryStreams, in this process
    redis://…, rediss://…  RedisStreams, one server
    redis+cluster://host:port[,host:port…], rediss+cluster://…
                         RedisStreams on a Redis Cluster (seeds: any of its nodes)
    redis+sentinel://host:port[,host:port…]/service[/db], rediss+sentinel://…
                         RedisStreams on the primary the sentinels name, followed
                         through failovers

Both halves of the returned pair are the same object, which implements
`SampleStream` and `SnapshotBoard` at once: close it once (closing twice is harmless).
Each memory:// call makes a new, empty bus, so the in-process parts that must talk
to each other (sidecar, collector, controller in `canary dev`) share one pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.kernel.clock import Clock
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.secrets import mask_url
from controlplane.kernel.streams import SampleStream, SnapshotBoard

# the URL forms, as the CLI's --redis help states them
URL_FORMS = (
    "redis://… or rediss://… (one server); redis+cluster://host:port,host:port… or "
    "rediss+cluster://… (a Redis Cluster, any of its nodes as seeds); "
    "redis+sentinel://host:port,…/PRIMARY (the primary Redis Sentinel names, "
    "optionally /PRIMARY/DB); or memory://"
)

if TYPE_CHECKING:
    from controlplane.kernel.backend_access import RedisAccess


def open_streams(
    url: str,
    *,
    namespace: str = "canary",
    clock: Clock | None = None,
    access: RedisAccess | None = None,
) -> tuple[SampleStream, SnapshotBoard]:
    """access: TLS files and a password file for redis:// and rediss:// (see
    `controlplane.kernel.backend_access.redis_access`)."""
    scheme, sep, _ = url.strip().partition("://")
    scheme = scheme.lower()
    if sep and scheme == "memory":
        from controlplane.kernel.streams_memory import MemoryStreams

        bus = MemoryStreams(clock=clock)
        return bus, bus
    if sep and scheme in (
        "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel",
    ):  # fmt: skip
        # Imported here so the embedded mode never needs the Redis driver loaded.
        from controlplane.kernel.streams_redis import RedisStreams

        redis_backend = RedisStreams(url.strip(), namespace=namespace, access=access)
        return redis_backend, redis_backend
    raise ConfigError(
        f"unsupported stream URL {mask_url(url)!r}: expected memory://, redis://, "
        "rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or "
        "rediss+sentinel://"
    )
