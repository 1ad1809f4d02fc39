"""Every probe the manifests declare, asked of the real server it targets the way the
kubelet asks it: no credentials, the pod's IP in the Host header. The API is built with
the trusted hosts the chart renders (the pod's IP filled in as Kubernetes would), the
admin endpoints of the collector and the sidecar with an admin token set; /metrics, the
monitors' path, must refuse a request without the token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.render import VALUES, chart, injected_example, patched_example, pod_spec
from tests.deploy.servers import api_server, collector_server, sidecar_server

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


def server_for(container: dict[str, Any], tmp_path: Path) -> Any:
    command = container["command"][1]
    if command == "serve":
        trusted = expanded_env(container).get("CANARY_TRUSTED_HOSTS", "")
        return api_server(trusted_hosts=trusted, tmp_path=tmp_path)
    if command == "collector":
        return collector_server()
    assert command == "sidecar", container["command"]
    return sidecar_server()


@pytest.mark.parametrize("container", list(probed_containers()))
async def test_every_probe_is_answered_without_credentials(
    container: dict[str, Any], tmp_path: Path
) -> None:
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probes = [container[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
              if kind in container]  # fmt: skip
    assert len(probes) >= 2
    async with server_for(container, tmp_path) as client:
        for probe in probes:
            get = probe["httpGet"]
            host = f"{POD_IP}:{ports[get['port']]}"
            answer = await client.get(get["path"], headers={"Host": host})
            assert answer.status_code == 200, (get, answer.status_code, answer.text)
        # the monitors' path needs credentials: a ServiceMonitor without them scrapes 401
        metrics = await client.get("/metrics", headers={"Host": POD_IP})
        assert metrics.status_code == 401


async def test_the_api_refuses_a_host_the_chart_does_not_trust(tmp_path: Path) -> None:
    (container,) = [c for d in chart("production-values") for c in (pod_spec(d) or {})
                    .get("containers", []) if c["name"] == "serve"]  # fmt: skip
    trusted = expanded_env(container)["CANARY_TRUSTED_HOSTS"]
    async with api_server(trusted_hosts=trusted, tmp_path=tmp_path) as client:
        assert (await client.get("/healthz", headers={"Host": "canary.example.com"})).is_success
        assert (await client.get("/healthz", headers={"Host": "10.42.7.20"})).status_code == 400
        assert (await client.get("/healthz", headers={"Host": "evil.example"})).status_code == 400
