"""Samples and snapshots over rediss:// with an ACL user, on a redis-server the test
owns (TLS port only, no default user).

The whole path runs over TLS: a sidecar's reporter appends batches, a collector reads
and publishes snapshots, and the controller's reader merges them, each with its own
connections. The password is given once in a file and once in the URL; neither
ever reaches a log line.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.collector.service import Collector
from controlplane.collector.sharding import read_merged_snapshots
from controlplane.kernel.backend_access import RedisAccess, redis_access
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.errors import BackendUnavailable, ConfigError
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.secrets import mask_url
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_factory import open_streams
from controlplane.kernel.streams_redis import RedisStreams
from sidecar.reporter import SampleReporter
from tests.support.tls import Pki, TlsRedisProcess, make_pki

WAIT = 20.0  # upper bound so a broken path fails instead of hanging
USER = "canary"
PASSWORD = "redis-" + uuid.uuid4().hex[:12]
SERVICE = "payment-api"
EXPERIMENT = "42"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_redis(pki: Pki) -> Iterator[TlsRedisProcess]:
    proc = TlsRedisProcess(pki, user=USER, password=PASSWORD, client_certs="optional")
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture(scope="module")
def mtls_redis(pki: Pki) -> Iterator[TlsRedisProcess]:
    proc = TlsRedisProcess(pki, user=USER, password=PASSWORD, client_certs="yes")
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture
def password_file(tmp_path: Path) -> str:
    path = tmp_path / "redis-password"
    path.write_text(PASSWORD + "\n")
    return str(path)


def no_password_url(proc: TlsRedisProcess) -> str:
    return f"rediss://{USER}@127.0.0.1:{proc.port}/0"


async def test_samples_and_snapshots_travel_over_tls_and_the_password_is_never_logged(
    secure_redis: TlsRedisProcess, pki: Pki, password_file: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    namespace = "t-" + uuid.uuid4().hex[:8]
    # the sidecar and the collector: password from a file
    by_file = Settings(redis_url=no_password_url(secure_redis), redis_namespace=namespace,
                       redis_ca_file=pki.ca_file, redis_password_file=password_file)
    # the controller's reader: password in the URL
    in_url = Settings(redis_url=secure_redis.url, redis_namespace=namespace,
                      redis_ca_file=pki.ca_file)
    clock = SystemClock()
    sidecar_stream, _ = open_streams(by_file.redis_url, namespace=namespace,
                                     access=redis_access(by_file))
    streams, board = open_streams(by_file.redis_url, namespace=namespace,
                                  access=redis_access(by_file), clock=clock)
    _, reader = open_streams(in_url.redis_url, namespace=namespace,
                             access=redis_access(in_url), clock=clock)
    kv = open_kv("memory://", clock=clock)
    keys = EtcdKeys("/t")
    await kv.put(keys.rule(SERVICE),
                 b'{"service": "payment-api", "threshold_ms": 100, "window_sec": 60}')
    collector = Collector(streams, board, kv, keys, consumer_name="tls-1", clock=clock,
                          block_ms=20)
    reporter = SampleReporter(sidecar_stream, SERVICE, clock=clock)
    samples = 300
    try:
        async with asyncio.timeout(WAIT):
            await collector.load_config()
            for i in range(samples):
                variant = "canary" if i % 3 == 0 else "baseline"
                reporter.record(clock.now(), EXPERIMENT, variant, 20_000 + i, 200, i)
            assert await reporter.flush()
            total = 0
            while total < samples:
                await collector.step()
                merged = await read_merged_snapshots(reader, EXPERIMENT, clock.now())
                total = sum(s.count for s in merged.values())
        assert total == samples
        assert merged["canary"].count == samples // 3
    finally:
        await reporter.close(1.0)
        await collector.stop_watching()
        for closing in (sidecar_stream, streams, reader):
            await closing.close()
        await kv.close()
    assert PASSWORD not in caplog.text


async def test_a_wrong_password_is_a_clear_error_without_the_password(
    secure_redis: TlsRedisProcess, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = f"rediss://{USER}:not-{PASSWORD}@127.0.0.1:{secure_redis.port}/0"
    stream = RedisStreams(wrong, access=RedisAccess(ca_file=pki.ca_file))
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(BackendUnavailable, match="refused the credentials") as caught:
                await stream.append(SERVICE, [{"k": b"v"}], maxlen=10)
    finally:
        await stream.close()
    assert PASSWORD not in str(caught.value) and "\n" not in str(caught.value)
    assert PASSWORD not in caplog.text


async def test_a_wrong_ca_is_unavailable(secure_redis: TlsRedisProcess, pki: Pki) -> None:
    stream = RedisStreams(secure_redis.url, access=RedisAccess(ca_file=pki.other_ca_file))
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(BackendUnavailable) as caught:
                await stream.append(SERVICE, [{"k": b"v"}], maxlen=10)
    finally:
        await stream.close()
    assert PASSWORD not in str(caught.value)


async def test_client_certificates_when_redis_requires_them(
    mtls_redis: TlsRedisProcess, pki: Pki
) -> None:
    without = RedisStreams(mtls_redis.url, access=RedisAccess(ca_file=pki.ca_file))
    settings = Settings(redis_url=mtls_redis.url, redis_ca_file=pki.ca_file,
                        redis_cert_file=pki.client_cert, redis_key_file=pki.client_key)
    with_cert = RedisStreams(mtls_redis.url, access=redis_access(settings))
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(BackendUnavailable):
                await without.append(SERVICE, [{"k": b"v"}], maxlen=10)
            assert len(await with_cert.append(SERVICE, [{"k": b"v"}], maxlen=10)) == 1
    finally:
        await without.close()
        await with_cert.close()


def test_misconfigurations_are_one_line_config_errors(
    pki: Pki, password_file: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="not rediss://"):
        RedisStreams("redis://127.0.0.1:1/0", access=RedisAccess(ca_file=pki.ca_file))
    both = Settings(redis_password_file=password_file)
    with pytest.raises(ConfigError, match="give it once") as caught:
        RedisStreams(f"rediss://u:{PASSWORD}@127.0.0.1:1/0", access=redis_access(both))
    assert PASSWORD not in str(caught.value)
    for settings in (Settings(redis_cert_file=pki.client_cert),
                     Settings(redis_ca_file=str(tmp_path / "missing.pem")),
                     Settings(redis_password_file=str(tmp_path / "missing"))):
        with pytest.raises(ConfigError) as caught:
            redis_access(settings)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        open_streams(f"redis+tls://u:{PASSWORD}@h:1/0")
    assert PASSWORD not in str(caught.value)


@pytest.mark.parametrize(("url", "masked"), [
    ("rediss://canary:pw@h:6380/0", "rediss://canary:***@h:6380/0"),
    ("redis://:pw@h/0", "redis://:***@h/0"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("rediss://u:p@[::1:6380/0", "rediss://***"),
])  # fmt: skip
def test_mask_url_hides_only_the_password(url: str, masked: str) -> None:
    assert mask_url(url) == masked
