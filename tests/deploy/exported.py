"""Every metric series name the processes export, read from their real registries."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from controlplane.api.app import create_app
from controlplane.collector.service import CollectorMetrics
from controlplane.controller.runner import Controller
from controlplane.kernel.kv_memory import MemoryKV
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_memory import MemoryStreams
from controlplane.notify.dispatcher import dispatcher_for
from sidecar.main import Sidecar
from sidecar.workers.metrics import WorkersCollector

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}


def series_names(exposition: str) -> set[str]:
    """The sample names a text exposition can carry, from its `# TYPE` lines."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            base = family.removesuffix("_total") if kind == "counter" else family
            names.update(base + suffix for suffix in _SUFFIXES[kind])
    return names


def exported_series(tmp_path: Path) -> set[str]:
    """The API with its controller and dispatcher, a collector, a sidecar and the
    sidecar workers' supervisor."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'names.db'}")
    app = create_app(settings, services=[Controller(), dispatcher_for(settings)])
    expositions = [app.state.metrics.render()]  # what the API's /metrics answers
    expositions.append(CollectorMetrics(CollectorRegistry()).exposition())
    sidecar = Sidecar(service="web", kv=MemoryKV(), stream=MemoryStreams())
    expositions.append(generate_latest(sidecar.registry))
    supervisor = CollectorRegistry()
    supervisor.register(WorkersCollector([], ready=lambda: True))
    expositions.append(generate_latest(supervisor))
    names: set[str] = set()
    for text in expositions:
        names |= series_names(text.decode())
    return names
