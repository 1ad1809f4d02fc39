"""`canary bench sidecar-python`'s driver: requests really cross both connections."""

from __future__ import annotations

from controlplane.benchmarks.sidecar_python import _script


def test_the_driver_runs_requests_through_the_proxy_and_reports_cpu_per_request() -> None:
    # the driver raises when a request does not reach an upstream connection
    out = _script(None, ["300", "once"])
    assert float(out.split()[-1]) > 0
