"""`redis+cluster://` URLs: parsed strictly into the first seed's plain URL and the rest."""

from __future__ import annotations

import pytest

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.streams_redis import MAX_CLUSTER_SEEDS, split_cluster_url


@pytest.mark.parametrize(
    ("url", "first", "others"),
    [
        ("redis+cluster://10.0.0.1:7000", "redis://10.0.0.1:7000", []),
        (
            "redis+cluster://a:7000,b:7001,c:7002/",
            "redis://a:7000/",
            [("b", 7001), ("c", 7002)],
        ),
        ("REDISS+CLUSTER://u:p%40w@a:7000/0", "rediss://u:p%40w@a:7000/", []),
        (
            "redis+cluster://a:7000,[::1]:7001?socket_timeout=1",
            "redis://a:7000?socket_timeout=1",
            [("::1", 7001)],
        ),
        (
            "redis+cluster://a:7000/?socket_timeout=1",
            "redis://a:7000/?socket_timeout=1",
            [],
        ),
        ("redis+cluster://[::1]:7000", "redis://[::1]:7000", []),
    ],
)
def test_cluster_url_becomes_the_first_seed_and_the_others(
    url: str, first: str, others: list[tuple[str, int]]
) -> None:
    assert split_cluster_url(url) == (first, others)


@pytest.mark.parametrize("url", ["redis://a:6379/0", "rediss://a:6379", "memory://"])
def test_other_urls_are_not_cluster_urls(url: str) -> None:
    assert split_cluster_url(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://a",  # no port
        "redis+cluster://a:0",
        "redis+cluster://a:65536",
        "redis+cluster://a:7000,",  # an empty seed
        "redis+cluster://a:7000/1",  # a cluster has only db 0
        "redis+cluster://a b:7000",
        "redis+cluster://:7000",
        "redis+cluster://a:70x0",
        "redis+cluster://" + ",".join(f"h{i}:7000" for i in range(MAX_CLUSTER_SEEDS + 1)),
    ],
)
def test_malformed_cluster_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        split_cluster_url(url)
    assert "\n" not in str(info.value)
