"""The variant's name can only ever be a label value: hostile names against a real
Prometheus select the one series carrying that exact text, or nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from controlplane.kernel.backend_access import PrometheusAccess
from controlplane.kernel.metric_specs import MetricSpec
from controlplane.providers.prometheus import PrometheusClient
from controlplane.providers.promql import promql_string_content, render_query
from tests.support.metrics_exporter import MetricsExporter
from tests.support.prometheus import PrometheusProcess

HOSTILE = [
    'a",__name__=~".+',
    'x"} or vector(1) or x{a="',
    "back\\slash",
    "back\\",
    "new\nline",
    "tab\tand\rreturn",
    "quote'single`tick",
    "ctl\x01\x7f\u0085\u2028",
    "ünïcødé ✓",
]


@pytest.fixture
async def client(access: PrometheusAccess) -> AsyncIterator[PrometheusClient]:
    client = PrometheusClient(access)
    yield client
    await client.aclose()


def test_render_replaces_only_the_placeholders() -> None:
    query = 'sum(rate(h{app="$x_not",variant="$variant"}[$window])) / sum(h{variant="$variant"})'
    with pytest.raises(ValueError, match="unknown placeholder"):
        render_query(query, "canary", 60)
    query = 'sum(rate(h{app="shop",variant="$variant"}[$window:15s])) + 0*foo{v="$variant"}'
    assert render_query(query, "canary", 300) == (
        'sum(rate(h{app="shop",variant="canary"}[300s:15s])) + 0*foo{v="canary"}'
    )


@pytest.mark.parametrize("window", [0, -1, True, 1.5, 10**9])
def test_render_refuses_a_bad_window(window: object) -> None:
    with pytest.raises(ValueError, match="window"):
        render_query('x{v="$variant"}[$window]', "canary", window)  # type: ignore[arg-type]


def test_render_escapes_the_name_as_a_promql_string() -> None:
    assert promql_string_content('a",__name__=~".+') == 'a\\",__name__=~\\".+'
    assert promql_string_content("b\\\n\x01'`") == "b\\\\\\n\\u0001\\x27\\x60"
    with pytest.raises(ValueError, match="Unicode"):
        promql_string_content("\udc80")


def test_render_regex_quotes_the_name_after_a_regex_matcher() -> None:
    assert render_query('x{v=~"$variant"}', "v1.2", 60) == 'x{v=~"v1\\\\.2"}'
    assert render_query('x{v !~ "$variant"}', "a+b", 60) == 'x{v !~ "a\\\\+b"}'
    assert render_query('x{v="$variant"}', "v1.2", 60) == 'x{v="v1.2"}'


async def test_hostile_names_select_only_their_own_series(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    # every other series of this family has a value the sum would betray
    exporter.gauge("hostile_g", {"service": "shop-x", "variant": "baseline"}, 1000)
    exporter.gauge("hostile_g", {"service": "shop-x", "variant": "canary"}, 2000)
    for n, name in enumerate(HOSTILE):
        exporter.gauge("hostile_g", {"service": "shop-x", "variant": name}, n + 1)
    prometheus.wait_value('count(hostile_g{service="shop-x"})', len(HOSTILE) + 2)

    for n, name in enumerate(HOSTILE):
        spec = MetricSpec(name="g", kind="gauge", compare="baseline",
                          query='sum(hostile_g{service="shop-x",variant="$variant"})')
        evidence = await client.read(spec, ("baseline", name), 60)
        assert evidence.canary.value == n + 1, (name, evidence.canary, evidence.queries)
        assert evidence.baseline.value == 1000


async def test_a_crafted_name_without_a_series_is_no_data(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    exporter.gauge("crafted_g", {"service": "shop-c", "variant": "baseline"}, 5)
    exporter.gauge("crafted_g", {"service": "shop-c", "variant": "canary"}, 7)
    prometheus.wait_value('count(crafted_g{service="shop-c"})', 2)
    spec = MetricSpec(name="g", kind="gauge", compare="baseline",
                      query='sum(crafted_g{service="shop-c",variant="$variant"})')
    for crafted in ('x",variant=~".+', 'x"}) or sum(crafted_g{variant="canary', ".+", "canary\n"):
        evidence = await client.read(spec, ("baseline", crafted), 60)
        assert evidence.canary.no_data, (crafted, evidence.canary)
        assert evidence.canary.reason == "no series matched (an empty answer)"


async def test_a_regex_matcher_takes_the_name_literally(
    exporter: MetricsExporter, prometheus: PrometheusProcess, client: PrometheusClient
) -> None:
    exporter.gauge("dotted_g", {"service": "shop-d", "variant": "v1x2"}, 99)
    exporter.gauge("dotted_g", {"service": "shop-d", "variant": "v1.2"}, 3)
    prometheus.wait_value('count(dotted_g{service="shop-d"})', 2)
    spec = MetricSpec(name="g", kind="gauge", compare="baseline",
                      query='sum(dotted_g{service="shop-d",variant=~"$variant"})')

    evidence = await client.read(spec, ("v1.2", "v1.2"), 60)

    assert evidence.canary.value == 3
