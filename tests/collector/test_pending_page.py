"""The pending gauge's page: what prometheus_client writes for the same gauge."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from controlplane.collector.pending_page import HELP, NAME, PendingPage, pending_text


def _as_a_gauge(counts: dict[str, int]) -> bytes:
    registry = CollectorRegistry()
    gauge = Gauge(NAME, HELP, ["service"], registry=registry)
    for service, count in counts.items():
        gauge.labels(service).set(count)
    return generate_latest(registry)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), st.integers(0, 2**40), max_size=8))
def test_the_page_is_what_a_gauge_of_the_same_counts_renders(counts: dict[str, int]) -> None:
    """Any service name (quotes, backslashes, newlines, non-ASCII) and any count."""
    assert pending_text(counts) == _as_a_gauge(counts)


def test_a_look_with_the_same_counts_writes_no_page_and_a_stream_gone_leaves_it() -> None:
    page = PendingPage()
    assert page.text() == _as_a_gauge({})
    page.set_all({"a": 1, "b": 0})
    page.set_all({"a": 1, "b": 0})
    assert page.written == 1
    assert page.text() == _as_a_gauge({"a": 1, "b": 0})
    page.set_all({"b": 3})
    assert page.written == 2
    assert b'service="a"' not in page.text()
    assert page.text() == _as_a_gauge({"b": 3})
