"""The reporter signs each batch once, when sealed, and drops what no collector takes."""

from __future__ import annotations

import secrets

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import COLLECTOR_GROUP
from controlplane.kernel.sample_auth import SampleSigner, SampleVerifier
from controlplane.kernel.sample_keys import SampleKey, SampleKeys
from controlplane.kernel.streams_factory import open_streams
from sidecar.reporter import SampleReporter

SERVICE = "svc"
KEYS = SampleKeys((SampleKey("k1", secrets.token_bytes(32)),))


async def test_sealed_batches_carry_a_mac_the_verifier_accepts() -> None:
    stream, _ = open_streams("memory://")
    await stream.ensure_group(SERVICE, COLLECTOR_GROUP)
    reporter = SampleReporter(
        stream, SERVICE, batch_size=4, clock=FakeClock(), signer=SampleSigner(KEYS)
    )
    for i in range(10):
        reporter.record(1_800_000_000.0 + i, "7", "canary", 1_000, 200, 0)
    assert await reporter.flush()
    entries = await stream.read_group([SERVICE], COLLECTOR_GROUP, "t", count=10, block_ms=0)
    assert len(entries) == 3
    for entry in entries:
        assert entry.fields["kid"] == b"k1"
        SampleVerifier(KEYS).verify(SERVICE, entry.fields)
    await stream.close()


async def test_a_malformed_experiment_id_is_dropped_and_counted_not_sent() -> None:
    stream, _ = open_streams("memory://")
    await stream.ensure_group(SERVICE, COLLECTOR_GROUP)
    reporter = SampleReporter(stream, SERVICE, batch_size=4, clock=FakeClock())
    for experiment in ("../etc", "x" * 100, "7"):
        for i in range(4):
            reporter.record(1_800_000_000.0 + i, experiment, "canary", 1_000, 200, 0)
    assert await reporter.flush()
    entries = await stream.read_group([SERVICE], COLLECTOR_GROUP, "t", count=10, block_ms=0)
    assert [e.fields["exp"] for e in entries] == [b"7"]
    assert reporter.stats.samples_dropped == 8 and reporter.stats.batches_dropped == 2
    await stream.close()
