"""The sidecar's reverse proxy: asyncio protocols with httptools parsers on both sides.

A leaner path than an ASGI stack (see the proxy figures in the benchmarks docs): the
client side (`server`) parses requests, asks the injected `Chooser` where each goes,
and streams it through a keep-alive pool (`upstream`); `headers` rewrites the heads,
`errors` writes the problem+json answers, `metrics` keeps plain counters.
"""

from sidecar.proxy.metrics import ProxyMetrics, ProxyMetricsCollector
from sidecar.proxy.server import ProxyOptions, ProxyServer

__all__ = ["ProxyMetrics", "ProxyMetricsCollector", "ProxyOptions", "ProxyServer"]
