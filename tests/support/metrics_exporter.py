"""A tiny exporter on a real socket: Prometheus text whose series a test sets.

Prometheus (tests/support/prometheus.py) scrapes it; the test sets counters, gauges
and histogram buckets per label set at run time. Served from a thread so scrapes are
answered whatever the test's event loop is doing. Label values are escaped as the
exposition format requires, so a test may give a series a hostile label value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Labels = Mapping[str, str]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _series(name: str, labels: Labels) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


class MetricsExporter:
    """Series by (name, labels) → value; `scrapes` counts the GETs of /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._types: dict[str, str] = {}
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.scrapes = 0
        self.port = 0

    def set(self, name: str, labels: Labels, value: float, kind: str = "gauge") -> None:
        with self._lock:
            self._types[name] = kind
            self._values[(name, tuple(sorted(labels.items())))] = value

    def counter(self, name: str, labels: Labels, value: float) -> None:
        self.set(name, labels, value, "counter")

    def gauge(self, name: str, labels: Labels, value: float) -> None:
        self.set(name, labels, value, "gauge")

    def histogram(self, name: str, labels: Labels, buckets: Mapping[float, float]) -> None:
        """Cumulative `buckets` (upper bound → count); +Inf is the last bound's count."""
        with self._lock:
            self._types[name] = "histogram"
            count = 0.0
            for bound, value in sorted(buckets.items()):
                le = "+Inf" if bound == float("inf") else repr(float(bound))
                key = tuple(sorted({**labels, "le": le}.items()))
                self._values[(f"{name}_bucket", key)] = value
                count = max(count, value)
            if float("inf") not in buckets:
                inf = tuple(sorted({**labels, "le": "+Inf"}.items()))
                self._values[(f"{name}_bucket", inf)] = count
            key = tuple(sorted(labels.items()))
            self._values[(f"{name}_count", key)] = count
            self._values[(f"{name}_sum", key)] = 0.0

    def remove(self, name: str) -> None:
        with self._lock:
            self._values = {k: v for k, v in self._values.items() if not k[0].startswith(name)}

    def text(self) -> bytes:
        with self._lock:
            lines = []
            for family, kind in sorted(self._types.items()):
                lines.append(f"# TYPE {family} {kind}")
                for (name, labels), value in sorted(self._values.items()):
                    if name == family or (
                        kind == "histogram" and name in (f"{family}_bucket", f"{family}_count",
                                                         f"{family}_sum")
                    ):
                        lines.append(f"{_series(name, dict(labels))} {value!r}")
            return ("\n".join(lines) + "\n").encode()


@contextmanager
def serving(exporter: MetricsExporter) -> Iterator[MetricsExporter]:
    """The exporter listening on a free loopback port (its `port` set)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = exporter.text()
            with exporter._lock:
                exporter.scrapes += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    exporter.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="metrics-exporter", daemon=True)
    thread.start()
    try:
        yield exporter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
