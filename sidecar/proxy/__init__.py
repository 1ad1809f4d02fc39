"""The sidecar's reverse proxy: asyncio protocols with httptools parsers on both sides.

A leaner path than an ASGI stack (see the proxy figures in the benchmarks docs).
`server` listens and holds what connections share; `client` parses each client's
requests and runs each as an `exchange`, which asks the injected `Chooser` where it
goes and streams it through a keep-alive pool (`upstream`). `options` holds the
settings, `pausing` the reasons a client is not read, `conformance` the request
checks, `headers` rewrites the heads, `errors` writes the problem+json answers,
`limits` sizes the connection cap, `metrics` keeps plain counters.
"""

from sidecar.proxy.metrics import ProxyMetrics, ProxyMetricsCollector
from sidecar.proxy.options import ProxyOptions
from sidecar.proxy.server import ProxyServer

__all__ = ["ProxyMetrics", "ProxyMetricsCollector", "ProxyOptions", "ProxyServer"]
