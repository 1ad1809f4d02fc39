"""deploy/compose/compose.yaml: valid for `docker compose` itself, every long-running
service health-checked, and every dependency waiting on health (or, for a one-shot
job, on its success) rather than on a mere start."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import yaml

from tests.deploy.render import DEPLOY, run, tool
from tests.deploy.servers import collector_server

COMPOSE = DEPLOY / "compose" / "compose.yaml"
ONE_SHOT = {"etcd-auth", "migrate"}  # jobs that run once and exit


def services() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return found


def test_docker_compose_accepts_the_file() -> None:
    resolved = yaml.safe_load(run(tool("docker-compose"), "--file", str(COMPOSE), "config"))
    assert set(resolved["services"]) == set(services())
    # what compose resolved still carries the conditions (none dropped as unknown)
    for name, service in resolved["services"].items():
        for dependency in service.get("depends_on", {}).values():
            assert dependency["condition"] in {
                "service_healthy",
                "service_completed_successfully",
            }, name


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        if name in ONE_SHOT:
            assert "healthcheck" not in service, name
            continue
        check = service.get("healthcheck")
        assert check and check["test"][0] in {"CMD", "CMD-SHELL"}, name
        assert {"interval", "timeout", "retries"} <= set(check), name


def test_every_dependency_waits_for_health_or_success() -> None:
    everything = services()
    for name, service in everything.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on as a list waits for a start only"
        for dependency, rule in depends.items():
            wanted = ("service_completed_successfully" if dependency in ONE_SHOT
                      else "service_healthy")  # fmt: skip
            assert rule == {"condition": wanted}, f"{name} -> {dependency}"
    assert set(everything["control-plane"]["depends_on"]) == {
        "etcd-auth", "migrate", "redis", "postgres"}  # fmt: skip


def test_the_canary_services_run_from_the_control_plane_image_read_only() -> None:
    for name in ("migrate", "control-plane", "collector"):
        service = services()[name]
        assert service["image"].startswith("canary-control-plane:"), name
        assert service["build"]["dockerfile"] == "deploy/images/control-plane.Dockerfile"
    for name in ("control-plane", "collector"):
        assert services()[name]["read_only"] is True and "/tmp" in services()[name]["tmpfs"]


def test_the_api_healthcheck_asks_readyz_over_the_served_scheme() -> None:
    service = services()["control-plane"]
    command = " ".join(service["command"])
    probe = service["healthcheck"]["test"][-1]
    assert "--tls-cert" in command and "https://localhost:8443/readyz" in probe
    assert "--listen 0.0.0.0:8443" in command
    collector = services()["collector"]
    assert "0.0.0.0:9100" in collector["command"]
    assert "http://127.0.0.1:9100/readyz" in collector["healthcheck"]["test"][-1]


def test_the_healthchecks_in_python_compile() -> None:
    for name in ("control-plane", "collector"):
        test = services()[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        compile(test[3], f"{name} healthcheck", "exec")


async def test_the_collector_healthcheck_passes_on_a_ready_collector_only() -> None:
    code = services()["collector"]["healthcheck"]["test"][3]
    async with collector_server(ready=True) as client:
        assert await exit_code(code.replace(":9100/", f":{client.base_url.port}/")) == 0
    async with collector_server(ready=False) as client:
        assert await exit_code(code.replace(":9100/", f":{client.base_url.port}/")) != 0


async def exit_code(code: str) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return await asyncio.wait_for(process.wait(), timeout=30)
