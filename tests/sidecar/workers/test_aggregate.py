"""Worker metrics merged into one sidecar's, and kept monotonic across restarts."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from sidecar.proxy import ProxyMetrics, ProxyMetricsCollector
from sidecar.workers import aggregate
from sidecar.workers.metrics import WorkersCollector
from sidecar.workers.slot import WorkerSlot


def worker_text(
    requests: dict[tuple[str, int], int],
    overheads: list[float],
    *,
    connections: int = 0,
    ready: int = 1,
    revision: int = 7,
) -> str:
    """What a worker's /metrics says: the proxy's real collector, and the gauges."""
    metrics = ProxyMetrics()
    for (variant, status), count in requests.items():
        for _ in range(count):
            metrics.observe(variant, status, None)
    for overhead in overheads:
        metrics.observe("baseline", 200, overhead)
        metrics.requests[("baseline", 200)] -= 1  # the overheads are of counted requests
    metrics.connections = connections
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProxyMetricsCollector(metrics))
    gauges = (
        "# TYPE canary_sidecar_ready gauge\n"
        f"canary_sidecar_ready {ready}\n"
        "# TYPE canary_sidecar_route_revision gauge\n"
        f'canary_sidecar_route_revision{{experiment="9"}} {revision}\n'
    )
    return generate_latest(registry).decode() + gauges


def samples(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def render(families: list[Metric]) -> str:
    class Fixed(Collector):
        def collect(self) -> list[Metric]:  # type: ignore[override]
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return generate_latest(registry).decode()


ONE = worker_text({("baseline", 200): 3, ("canary", 503): 1}, [0.0001, 0.002], connections=4)
TWO = worker_text({("baseline", 200): 5}, [0.0003], connections=2, revision=6)


def test_counters_histograms_and_quantity_gauges_add_up() -> None:
    merged = samples(aggregate.merge([aggregate.parse(ONE), aggregate.parse(TWO)]))
    requests = "canary_sidecar_requests_total"
    assert merged[(requests, (("status", "200"), ("variant", "baseline")))] == 8
    assert merged[(requests, (("status", "503"), ("variant", "canary")))] == 1
    assert merged[("canary_sidecar_proxy_overhead_seconds_count", ())] == 3
    assert merged[("canary_sidecar_proxy_overhead_seconds_bucket", (("le", "0.0005"),))] == 2
    assert merged[("canary_sidecar_proxy_overhead_seconds_bucket", (("le", "+Inf"),))] == 3
    assert merged[("canary_sidecar_proxy_overhead_seconds_sum", ())] == pytest.approx(0.0024)
    assert merged[("canary_sidecar_client_connections", ())] == 6


def test_state_gauges_take_the_minimum() -> None:
    ready = worker_text({}, [], ready=1)
    not_ready = worker_text({}, [], ready=0, revision=3)
    merged = samples(aggregate.merge([aggregate.parse(ready), aggregate.parse(not_ready)]))
    assert merged[("canary_sidecar_ready", ())] == 0
    assert merged[("canary_sidecar_route_revision", (("experiment", "9"),))] == 3


def test_the_merge_renders_as_prometheus_text_that_parses_back() -> None:
    text = render(aggregate.merge([aggregate.parse(ONE), aggregate.parse(TWO)]))
    again = {f.name: f for f in text_string_to_metric_families(text)}
    assert again["canary_sidecar_requests"].type == "counter"
    assert again["canary_sidecar_proxy_overhead_seconds"].type == "histogram"
    assert "canary_sidecar_requests_total{" in text


def test_a_family_of_another_type_under_a_known_name_is_left_out() -> None:
    odd = (
        "# TYPE canary_sidecar_client_connections counter\n"
        "canary_sidecar_client_connections_total 99\n"
    )
    merged = aggregate.merge([aggregate.parse(ONE), aggregate.parse(odd)])
    kinds = {f.name: f.type for f in merged}
    assert kinds["canary_sidecar_client_connections"] == "gauge"
    assert samples(merged)[("canary_sidecar_client_connections", ())] == 4


def test_skipped_families_are_not_merged() -> None:
    merged = aggregate.merge([aggregate.parse(ONE)], skip=frozenset({"canary_sidecar_ready"}))
    assert "canary_sidecar_ready" not in {f.name for f in merged}


@pytest.mark.parametrize("text", ["canary_sidecar_ready one\n", "{not a metric}\n"])
def test_text_that_does_not_parse_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        aggregate.parse(text)


def test_a_restarted_worker_never_takes_the_sums_back() -> None:
    slot = WorkerSlot(0, "unused")

    class Proc:
        pid = 101
        returncode: int | None = None

    proc = Proc()
    slot.process = proc  # type: ignore[assignment]
    slot.scraped(101, aggregate.parse(ONE))
    before = samples(aggregate.merge(slot.families()))
    proc.returncode = -9
    slot.retire()
    slot.process = None
    after = samples(aggregate.merge(slot.families()))
    key = ("canary_sidecar_requests_total", (("status", "200"), ("variant", "baseline")))
    assert after[key] == before[key] == 3
    assert ("canary_sidecar_client_connections", ()) not in after  # gauges die with it

    # the new process counts from zero; the slot's sum goes on from 3
    proc2 = Proc()
    proc2.pid = 102
    slot.process = proc2  # type: ignore[assignment]
    slot.scraped(102, aggregate.parse(TWO))
    assert samples(aggregate.merge(slot.families()))[key] == 8


def test_a_scrape_of_a_process_no_longer_in_the_slot_is_ignored() -> None:
    slot = WorkerSlot(0, "unused")
    slot.scraped(55, aggregate.parse(ONE))  # no process at all
    assert slot.current == []


def test_the_supervisor_exports_per_worker_requests_and_one_readiness() -> None:
    one, two = WorkerSlot(0, "a"), WorkerSlot(1, "b")
    one.current, two.retired = aggregate.parse(ONE), aggregate.lasting(aggregate.parse(TWO))
    two.restarts = 1
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector([one, two], ready=lambda: False))
    text = generate_latest(registry).decode()
    assert 'canary_sidecar_worker_requests_total{worker="0"} 4.0' in text
    assert 'canary_sidecar_worker_requests_total{worker="1"} 5.0' in text
    assert 'canary_sidecar_worker_restarts_total{worker="1"} 1.0' in text
    assert 'canary_sidecar_worker_up{worker="0"} 0.0' in text
    assert "canary_sidecar_workers 2.0" in text
    assert text.count("\ncanary_sidecar_ready ") == 1  # the supervisor's, not a worker's
    assert "\ncanary_sidecar_ready 0.0" in text
