"""Every probe the manifests declare, asked of the real server behind the port it names,
the way the kubelet asks it: no credentials, the pod's IP in the Host header. The API is
built with the trusted hosts the chart renders (the pod's IP filled in as Kubernetes
would), the admin listeners of `canary serve`, the collector and the sidecar with an
admin token set; /metrics, the monitors' path, must refuse a request without the token.
The liveness probes on the admin listeners fail once the main loop's heartbeat is older
than the bound the container is started with, and restart a wedged loop soon after."""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.kernel.admin_thread import Heartbeat
from controlplane.kernel.clock import FakeClock
from tests.deploy.render import VALUES, chart, injected_example, patched_example, pod_spec
from tests.deploy.servers import api_admin_server, api_server, collector_server, sidecar_server

POD_IP = "10.42.7.19"
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def probed_containers() -> Iterator[Any]:
    renderings = {name: chart(name) for name in VALUES}
    renderings["sidecar-patch"] = patched_example()
    renderings["sidecar-inject"] = injected_example()
    for rendering, found in renderings.items():
        for document in found:
            for container in (pod_spec(document) or {}).get("containers", []):
                if container.get("command", [])[:1] == ["canary"]:
                    name = f"{rendering}:{container['name']}"
                    yield pytest.param(container, id=name)


def expanded_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's literal env as the kubelet expands it: $(NAME) of an earlier
    variable, status.podIP from the downward API."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = VARIABLE.sub(lambda m: env.get(m[1], m[0]), item["value"])
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[item["name"]] = POD_IP
    return env


@asynccontextmanager
async def servers_for(
    container: dict[str, Any], tmp_path: Path, heartbeat: Heartbeat | None = None
) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """A client per named port of the container that a probe or a monitor may ask."""
    command = container["command"][1]
    async with AsyncExitStack() as stack:
        if command == "serve":
            trusted = expanded_env(container).get("CANARY_TRUSTED_HOSTS", "")
            yield {
                "api": await stack.enter_async_context(
                    api_server(trusted_hosts=trusted, tmp_path=tmp_path)),
                "admin": await stack.enter_async_context(api_admin_server(heartbeat=heartbeat)),
            }  # fmt: skip
        elif command == "collector":
            yield {"admin": await stack.enter_async_context(collector_server(heartbeat=heartbeat))}
        else:
            assert command == "sidecar", container["command"]
            yield {"canary-admin": await stack.enter_async_context(sidecar_server())}


@pytest.mark.parametrize("container", list(probed_containers()))
async def test_every_probe_is_answered_without_credentials(
    container: dict[str, Any], tmp_path: Path
) -> None:
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probes = [container[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
              if kind in container]  # fmt: skip
    assert len(probes) >= 2
    async with servers_for(container, tmp_path) as clients:
        assert set(clients) <= set(ports), (clients.keys(), ports)
        for probe in probes:
            get = probe["httpGet"]
            host = f"{POD_IP}:{ports[get['port']]}"
            answer = await clients[get["port"]].get(get["path"], headers={"Host": host})
            assert answer.status_code == 200, (get, answer.status_code, answer.text)
        # the monitors' path needs credentials: a ServiceMonitor without them scrapes 401
        for name, client in clients.items():
            metrics = await client.get("/metrics", headers={"Host": f"{POD_IP}:{ports[name]}"})
            assert metrics.status_code == 401, name


def liveness_bound(container: dict[str, Any]) -> float:
    """The bound the container's process starts with: its --liveness-bound, else the
    heartbeat's default."""
    for argument in container["command"]:
        if argument.startswith("--liveness-bound="):
            return float(argument.split("=", 1)[1])
    default: float = inspect.signature(Heartbeat).parameters["bound"].default
    return default


def admin_liveness(rendering: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for document in rendering:
        for container in (pod_spec(document) or {}).get("containers", []):
            if container.get("command", [])[:2] in (["canary", "serve"], ["canary", "collector"]):
                yield container


@pytest.mark.parametrize("values", [
    pytest.param((), id="default"),
    pytest.param(("--set=collector.livenessBound=90", "--set=controlPlane.livenessBound=45",
                  "--set=controlPlane.adminPort=9300",
                  "--set=collector.adminPort=9400"), id="overridden"),
])  # fmt: skip
async def test_the_liveness_probe_fails_once_the_loop_stalls_past_its_bound(
    values: tuple[str, ...], tmp_path: Path
) -> None:
    """Asked of the listener the probe names, with the heartbeat the process would
    beat: alive while the loop beat within the bound, 503 past it."""
    containers = list(admin_liveness(chart("default", *values)))
    assert sorted(c["command"][1] for c in containers) == ["collector", "serve"]
    for container in containers:
        probe = container["livenessProbe"]["httpGet"]
        assert probe["port"] == "admin" and probe["path"] == "/healthz"
        bound = liveness_bound(container)
        clock = FakeClock()
        heartbeat = Heartbeat(clock, bound=bound)
        async with servers_for(container, tmp_path, heartbeat) as clients:
            clock.advance(bound - 1)  # a busy loop: its last beat within the bound
            assert (await clients["admin"].get(probe["path"])).status_code == 200
            clock.advance(2)  # a wedged one
            answer = await clients["admin"].get(probe["path"])
            assert answer.status_code == 503 and "main loop stalled" in answer.text


def restart_window(bound: float, probe: dict[str, Any]) -> tuple[float, float]:
    """Seconds from a loop's last heartbeat to the kubelet's restart, earliest and
    latest: /healthz fails past the bound, the first failing probe comes within a
    period, and failureThreshold failures in a row restart the container."""
    period, failures = probe["periodSeconds"], probe["failureThreshold"]
    return bound + period * (failures - 1), bound + period * failures


@pytest.mark.parametrize("values", list(VALUES))
def test_the_liveness_timing_keeps_a_busy_loop_and_restarts_a_wedged_one(values: str) -> None:
    containers = list(admin_liveness(chart(values)))
    assert len(containers) == 2
    for container in containers:
        probe = container["livenessProbe"]
        bound = liveness_bound(container)
        earliest, latest = restart_window(bound, probe)
        where = f"{values}:{container['name']}"
        # a wedged loop is restarted within a minute of the bound
        assert bound < earliest and latest <= bound + 60, (where, earliest, latest)
        # a slow answer is not a stall: the bound, not the probe, decides. The timeout is
        # far above the listener's slowest answer under load (1.4 s, decision 0062), and
        # a restart takes misses in a row
        assert probe["timeoutSeconds"] >= 5 and probe["failureThreshold"] >= 3, where
        # the kubelet does not ask liveness before the listener has answered
        assert "startupProbe" in container, where


async def test_the_api_refuses_a_host_the_chart_does_not_trust(tmp_path: Path) -> None:
    (container,) = [c for d in chart("production-values") for c in (pod_spec(d) or {})
                    .get("containers", []) if c["name"] == "serve"]  # fmt: skip
    trusted = expanded_env(container)["CANARY_TRUSTED_HOSTS"]
    async with api_server(trusted_hosts=trusted, tmp_path=tmp_path) as client:
        assert (await client.get("/healthz", headers={"Host": "canary.example.com"})).is_success
        assert (await client.get("/healthz", headers={"Host": "10.42.7.20"})).status_code == 400
        assert (await client.get("/healthz", headers={"Host": "evil.example"})).status_code == 400
