"""The sidecar container `canary inject` adds to a Pod, with its volumes.

The same container as deploy/kubernetes/sidecar-patch.yaml: it reads the chart's
ConfigMap and the Secrets the chart's values name (mounted where that ConfigMap's
`*_FILE` variables point), listens on ports few applications use, and runs one proxy
process. Its requests are measured: one worker at 1,000 requests/s
(bench/results/sidecar-resources.json, decision 0055).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CONTAINER = "canary-sidecar"
PROXY_PORT_NAME = "canary-http"
ADMIN_PORT_NAME = "canary-admin"
TMP_VOLUME = "canary-tmp"
# the label the chart's PodMonitor selects; the annotations let a second injection
# find what the first one chose (idempotence)
SIDECAR_LABEL = "canary.dev/sidecar"
SERVICE_ANNOTATION = "canary.dev/service"
UPSTREAM_PORT_ANNOTATION = "canary.dev/upstream-port"
# the supervisor drains for up to 20 s before it kills its workers
TERMINATION_GRACE_SECONDS = 25

# name -> mount path; the paths are those the chart's ConfigMap names (CANARY_*_FILE)
SECRET_MOUNTS: dict[str, str] = {
    "canary-backend-tls": "/etc/canary/backend-tls",
    "canary-etcd-auth": "/etc/canary/etcd-auth",
    "canary-redis-auth": "/etc/canary/redis-auth",
    "canary-sample-keys": "/etc/canary/sample-keys",
    "canary-admin-token": "/etc/canary/admin-token",
}

# measured: bench/results/sidecar-resources.json (`canary bench sidecar-resources`)
RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "140m", "memory": "96Mi"},
    "limits": {"cpu": "1", "memory": "192Mi"},
}


@dataclass(frozen=True)
class SidecarSettings:
    """What an operator may choose; the defaults suit the chart installed as `canary`."""

    image: str = "canary-sidecar:0.1.0"
    config_map: str = "canary-config"
    # Secret volume name -> Secret name (the chart's `secrets.*` values)
    secrets: dict[str, str] = field(default_factory=lambda: {n: n for n in SECRET_MOUNTS})
    proxy_port: int = 15080
    admin_port: int = 15081
    workers: int = 1
    resources: dict[str, dict[str, str]] = field(default_factory=lambda: RESOURCES)


def container(settings: SidecarSettings, *, service: str, upstream_port: int) -> dict[str, Any]:
    """The sidecar container forwarding to the application on `upstream_port` of the
    same Pod (127.0.0.1) while no route is in force."""
    return {
        "name": CONTAINER,
        "image": settings.image,
        "command": [
            "canary",
            "sidecar",
            f"--service={service}",
            f"--listen=0.0.0.0:{settings.proxy_port}",
            f"--admin=0.0.0.0:{settings.admin_port}",
            f"--default-upstream=http://127.0.0.1:{upstream_port}",
            f"--workers={settings.workers}",
        ],
        "envFrom": [{"configMapRef": {"name": settings.config_map}}],
        "ports": [
            {"name": PROXY_PORT_NAME, "containerPort": settings.proxy_port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": settings.admin_port, "protocol": "TCP"},
        ],
        # /readyz: listening, and a route or the default upstream in force
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": ADMIN_PORT_NAME},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": ADMIN_PORT_NAME},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": {kind: dict(values) for kind, values in settings.resources.items()},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
            *(
                {"name": name, "mountPath": SECRET_MOUNTS[name], "readOnly": True}
                for name in settings.secrets
            ),
        ],
    }


def volumes(settings: SidecarSettings) -> list[dict[str, Any]]:
    """The Pod volumes the container mounts. Secrets are optional: a feature the chart's
    values turn off has no Secret, and its ConfigMap then names no file in it."""
    return [
        {"name": TMP_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        *(
            # 0444: the sidecar runs as its own user, whatever the Pod's fsGroup
            {"name": name, "secret": {"secretName": secret, "defaultMode": 0o444,
                                      "optional": True}}
            for name, secret in settings.secrets.items()
        ),
    ]  # fmt: skip
