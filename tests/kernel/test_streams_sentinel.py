"""Redis Sentinel: the streams follow the primary the sentinels name, across a failover."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as redis_async

from controlplane.kernel.errors import BackendUnavailable, ConfigError
from controlplane.kernel.keys import COLLECTOR_GROUP
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.streams_redis import split_sentinel_url
from tests.conftest import unique
from tests.support.redis_sentinel import SentinelSet, start_sentinel_set

pytestmark = pytest.mark.real


@pytest.fixture
def own_sentinels() -> Iterator[SentinelSet]:
    found = start_sentinel_set()
    try:
        yield found
    finally:
        found.close()


def batch(seq: int) -> dict[str, bytes]:
    return {"seq": str(seq).encode(), "payload": b"\x00\x01"}


async def test_failover_moves_appends_and_reads_to_the_promoted_replica(
    own_sentinels: SentinelSet,
) -> None:
    stream, _ = open_streams(own_sentinels.url, namespace=unique("canary-test"))
    old = redis_async.Redis(host="127.0.0.1", port=own_sentinels.primary.port)
    try:
        await stream.ensure_group("pay", COLLECTOR_GROUP)
        await stream.append("pay", [batch(1)], maxlen=100)
        assert await old.wait(1, 5000) == 1  # the replica holds it before the kill
        await old.aclose()

        own_sentinels.primary.stop(signal.SIGKILL)
        with pytest.raises(BackendUnavailable):
            await stream.append("pay", [batch(2)], maxlen=100)
        await asyncio.to_thread(own_sentinels.wait_primary, own_sentinels.replica.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                await stream.append("pay", [batch(2)], maxlen=100)
                break
            except BackendUnavailable:
                assert time.monotonic() < deadline, "never wrote to the promoted replica"
                await asyncio.sleep(0.1)  # the promoted replica accepting writes

        got = await stream.read_group(["pay"], COLLECTOR_GROUP, "c1", count=10, block_ms=0)

        assert [entry.fields["seq"] for entry in got] == [b"1", b"2"]
    finally:
        await old.aclose()
        await stream.close()


@pytest.mark.parametrize(
    ("url", "seeds", "service", "db", "tls"),
    [
        ("redis+sentinel://a:26379/main", [("a", 26379)], "main", 0, False),
        ("rediss+sentinel://a:1,b:2/main/3", [("a", 1), ("b", 2)], "main", 3, True),
    ],
)
def test_sentinel_url_names_the_sentinels_and_the_primary(
    url: str, seeds: list[tuple[str, int]], service: str, db: int, tls: bool
) -> None:
    target = split_sentinel_url(url)
    assert target is not None
    assert (target.seeds, target.service, target.db, target.tls) == (seeds, service, db, tls)


def test_sentinel_url_carries_the_data_nodes_credentials() -> None:
    target = split_sentinel_url("redis+sentinel://app:p%40ss@a:26379/main")
    assert target is not None
    assert (target.username, target.password) == ("app", "p@ss")


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://a:26379",  # no primary named
        "redis+sentinel://a:26379/",
        "redis+sentinel://a:26379/main/16",
        "redis+sentinel://a:26379/main/x",
        "redis+sentinel://a:26379/ma in",
        "redis+sentinel://a/main",
        "redis+sentinel://a:26379/main?socket_timeout=1",
    ],
)
def test_malformed_sentinel_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError):
        split_sentinel_url(url)
