"""`canary inject -f deployment.yaml`: the manifest with the sidecar in each workload's
Pod and its Services pointed at it, on stdout (like `istioctl kube-inject`).

    canary inject -f app.yaml | kubectl apply -f -
    kubectl get deploy/shop -o yaml | canary inject -f - | kubectl apply -f -

What changed is said on stderr; nothing is printed unless every changed object is
valid for the Kubernetes version asked (strict: an unknown field fails).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli.remote import fail

COMMAND = "canary inject"
# a DNS subdomain, as Kubernetes names a ConfigMap
_OBJECT_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def register(app: typer.Typer) -> None:
    @app.command("inject")
    def inject_command(
        filename: Annotated[
            str,
            typer.Option(
                "--filename", "-f", help="the manifest (multi-document YAML); - for stdin"
            ),
        ],
        service: Annotated[
            str | None,
            typer.Option(
                "--service",
                help="the service's name in routes (default: the Service in the input that "
                "selects the Pods, else the workload's name)",
            ),
        ] = None,
        upstream_port: Annotated[
            str | None,
            typer.Option(
                "--upstream-port",
                help="the application's port, a number or a container port's name "
                "(default: the one its Service targets, else the first declared)",
            ),
        ] = None,
        image: Annotated[
            str, typer.Option("--image", help="the sidecar's image")
        ] = "canary-sidecar:0.1.0",
        config_map: Annotated[
            str,
            typer.Option(
                "--config-map", help="the chart's ConfigMap (release canary: the default)"
            ),
        ] = "canary-config",
        proxy_port: Annotated[
            int, typer.Option("--proxy-port", help="the sidecar's proxy port (named canary-http)")
        ] = 15080,
        admin_port: Annotated[
            int, typer.Option("--admin-port", help="/healthz, /readyz, /metrics (canary-admin)")
        ] = 15081,
        kubernetes_version: Annotated[
            str | None,
            typer.Option(
                "--kubernetes-version",
                help="validate for this version, e.g. 1.30.0 (default: the newest known)",
            ),
        ] = None,
    ) -> None:
        """Add the canary sidecar to Deployments, StatefulSets and DaemonSets."""
        from controlplane.injection import manifests
        from controlplane.injection.inject import InjectionError, Request, inject
        from controlplane.injection.sidecar_container import SidecarSettings

        for name, port in (("--proxy-port", proxy_port), ("--admin-port", admin_port)):
            if not 1 <= port <= 65535:
                raise fail(COMMAND, f"{name} must be a port number (1-65535), got {port}")
        if proxy_port == admin_port:
            raise fail(COMMAND, "--proxy-port and --admin-port must differ")
        if _OBJECT_NAME.fullmatch(config_map) is None:
            raise fail(COMMAND, f"--config-map {config_map!r} is not a Kubernetes object name")
        if not image or any(char.isspace() for char in image):
            raise fail(COMMAND, f"--image {image!r} is not an image reference")
        try:
            text = _read(filename)
            documents = manifests.parse(text, source=filename)
            settings = SidecarSettings(
                image=image, config_map=config_map, proxy_port=proxy_port, admin_port=admin_port
            )
            request = Request(settings=settings, service=service, upstream_port=upstream_port)
            injected = inject(documents, request)
            version = kubernetes_version or manifests.latest_kubernetes_version()
            manifests.validate(injected.changed, version)
        except InjectionError as exc:
            raise fail(COMMAND, str(exc)) from exc
        for note in injected.notes:
            typer.echo(f"{COMMAND}: {note}", err=True)
        sys.stdout.write(manifests.dump(injected.documents))


def _read(filename: str) -> str:
    from controlplane.injection.inject import InjectionError
    from controlplane.injection.manifests import MAX_BYTES

    try:
        if filename == "-":
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with Path(filename).open("rb") as handle:
                data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise InjectionError(f"cannot read {filename}: {exc.strerror or exc}") from exc
    if len(data) > MAX_BYTES:
        raise InjectionError(f"{filename}: larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise InjectionError(f"{filename}: not UTF-8 text") from exc
