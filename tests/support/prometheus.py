"""A real Prometheus a test owns: Debian's `prometheus` on a free port, its own data
directory, scraping the test's exporter every second.

Readiness is Prometheus's `/-/ready`; "the exporter was scraped" and "this value is
visible" are waited for through the query API, never by sleeping a guessed while.
It can be stopped and started again on the same port and data (the outage tests).
"""

from __future__ import annotations

import json
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.processes import ServiceProcess, free_port
from tests.support.tls import Pki

JOB = "canary-test"


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(found).exists():
        raise RuntimeError("no prometheus binary: apt-get install prometheus (scripts/services.sh)")
    return found


class PrometheusProcess(ServiceProcess):
    def __init__(self, exporter_port: int, *, tls: Pki | None = None) -> None:
        """With `tls`, Prometheus serves HTTPS only and requires a client certificate
        its CA signed."""
        super().__init__("prometheus", free_port())
        self.exporter_port = exporter_port
        self.tls = tls
        self.web_config: str | None = None
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            web = self.workdir / "web.yml"
            web.write_text(
                "tls_server_config:\n"
                f"  cert_file: {tls.server_cert}\n"
                f"  key_file: {tls.server_key}\n"
                "  client_auth_type: RequireAndVerifyClientCert\n"
                f"  client_ca_file: {tls.ca_file}\n"
            )
            self.web_config = str(web)
            self._ssl = ssl.create_default_context(cafile=tls.ca_file)
            self._ssl.load_cert_chain(tls.client_cert, tls.client_key)
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            f"  - job_name: {JOB}\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{exporter_port}']\n"
        )

    @property
    def url(self) -> str:
        scheme = "https" if self.web_config else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = [
            prometheus_binary(),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if self.web_config:
            command.append(f"--web.config.file={self.web_config}")
        return command

    def start(self) -> None:
        super().start()
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(
                    f"{self.url}/-/ready", timeout=1, context=self._ssl
                ) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_until(ready, timeout, f"prometheus on {self.port} not ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector's series (the test's own look, outside the code tested)."""
        data = urllib.parse.urlencode({"query": promql}).encode()
        with urllib.request.urlopen(
            f"{self.url}/api/v1/query", data=data, timeout=5, context=self._ssl
        ) as answer:
            doc = json.load(answer)
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait_value(self, promql: str, expected: float, timeout: float = 20.0) -> None:
        """Until the query's one series has this value (a scrape took the exporter's)."""

        def seen() -> bool:
            result = self.query(promql)
            return len(result) == 1 and float(result[0]["value"][1]) == expected

        wait_until(seen, timeout, f"{promql} never became {expected}")

    def wait_scraped(self, timeout: float = 20.0) -> None:
        self.wait_value(f'up{{job="{JOB}"}}', 1.0, timeout)

    def own_counter(self, name: str, **labels: str) -> float:
        """A sample of Prometheus's own /metrics (read directly: not a query)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5, context=self._ssl) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{"):
                continue
            series, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout} s")
