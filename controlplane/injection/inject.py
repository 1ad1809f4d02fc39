"""Add the sidecar to every workload of a manifest and point its Services at it.

Pure: documents in, documents out, with one note per change for the operator. A
workload (Deployment, StatefulSet, DaemonSet) gets the container, its volumes, the
label the chart's PodMonitor selects and two annotations recording the service and
the application port chosen; a Service of the same input selecting that workload's
Pods has each port that reached the application sent to the sidecar's port instead.
Everything else passes through unchanged, `List` items included; an input without a
workload is refused.

Injecting an injected workload gives the same document: the sidecar is rebuilt from
the annotations, never added twice (`inject(inject(x)) == inject(x)`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from controlplane.injection.sidecar_container import (
    CONTAINER,
    PROXY_PORT_NAME,
    SERVICE_ANNOTATION,
    SIDECAR_LABEL,
    TERMINATION_GRACE_SECONDS,
    UPSTREAM_PORT_ANNOTATION,
    SidecarSettings,
    container,
    volumes,
)
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.keys import is_service_name

WORKLOADS = frozenset({"Deployment", "StatefulSet", "DaemonSet"})
MAX_PORT = 65535


class InjectionError(ConfigError):
    """An input `canary inject` cannot rewrite; the message names the object."""


@dataclass(frozen=True)
class Request:
    """What the operator asked for; None: found in the input."""

    settings: SidecarSettings = field(default_factory=SidecarSettings)
    service: str | None = None
    upstream_port: str | None = None  # a number, or the name of a container port


@dataclass(frozen=True)
class Injected:
    documents: list[Any]
    changed: list[dict[str, Any]]  # the objects rewritten, to be validated
    notes: list[str]


def inject(documents: Iterable[Any], request: Request) -> Injected:
    """The documents with every workload injected and its Services repointed."""
    out = [copy.deepcopy(doc) for doc in documents]
    objects = list(_objects(out))
    services = [obj for obj in objects if obj.get("kind") == "Service"]
    notes: list[str] = []
    workloads = [obj for obj in objects if obj.get("kind") in WORKLOADS]
    if not workloads:  # most likely the wrong file: say so rather than echo it
        raise InjectionError("no Deployment, StatefulSet or DaemonSet in the input")
    repointed: list[dict[str, Any]] = []
    for workload in workloads:
        notes += _inject_workload(workload, services, request, repointed)
    changed = workloads + [s for s in services if any(s is r for r in repointed)]
    return Injected(out, changed, notes)


def _objects(documents: list[Any]) -> Iterator[dict[str, Any]]:
    """Every Kubernetes object, `List` items included; refuses what is not one."""
    for index, doc in enumerate(documents, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str) or not isinstance(
            doc.get("apiVersion"), str
        ):
            raise InjectionError(f"document {index} is not a Kubernetes object "
                                 "(a mapping with apiVersion and kind)")  # fmt: skip
        if doc["kind"] == "List" or (doc["kind"].endswith("List") and "items" in doc):
            items = doc.get("items")
            if not isinstance(items, list):
                raise InjectionError(f"document {index}: a {doc['kind']} without items")
            yield from _objects(items)
        else:
            yield doc


def _name(obj: dict[str, Any]) -> str:
    name = _mapping(obj, "metadata").get("name")
    return f"{obj['kind'].lower()}/{name if isinstance(name, str) else '?'}"


def _mapping(parent: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise InjectionError(f"{where or key}: {key} is not a mapping")
    return value


def _list(parent: dict[str, Any], key: str, where: str, *, create: bool = False) -> list[Any]:
    """The list under `key` ([] when absent, added to `parent` only if `create`)."""
    value = parent.get(key)
    if value is None:
        value = []
        if create:
            parent[key] = value
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InjectionError(f"{where}: {key} is not a list of mappings")
    return value


def _inject_workload(
    workload: dict[str, Any],
    services: list[dict[str, Any]],
    request: Request,
    repointed: list[dict[str, Any]],
) -> list[str]:
    where = _name(workload)
    template = _mapping(_mapping(workload, "spec", where), "template", where)
    metadata = _mapping(template, "metadata", where)
    pod = _mapping(template, "spec", where)
    labels = _mapping(metadata, "labels", where)
    annotations = _mapping(metadata, "annotations", where)
    containers = _list(pod, "containers", where)
    own = [c for c in containers if c.get("name") != CONTAINER]
    if not own:
        raise InjectionError(f"{where}: no container of its own to put the sidecar beside")
    selecting = [s for s in services if _selects(s, workload, labels)]
    port, port_name = _upstream_port(where, own, selecting, annotations, request)
    service = _service_name(where, workload, selecting, annotations, request)
    settings = request.settings
    taken = {
        p.get("containerPort") for c in own + _list(pod, "initContainers", where)
        for p in _list(c, "ports", where)
    }  # fmt: skip
    clashes = sorted({settings.proxy_port, settings.admin_port} & taken)
    if clashes:
        raise InjectionError(f"{where}: port {clashes[0]} is the application's; choose the "
                             "sidecar's with --proxy-port/--admin-port")  # fmt: skip
    sidecar = container(settings, service=service, upstream_port=port)
    index = next((i for i, c in enumerate(containers) if c.get("name") == CONTAINER), None)
    if index is None:
        containers.append(sidecar)
    else:
        containers[index] = sidecar
    pod_volumes = _list(pod, "volumes", where, create=True)
    ours = volumes(settings)
    names = {volume["name"] for volume in ours}
    pod_volumes[:] = [v for v in pod_volumes if v.get("name") not in names] + ours
    grace = pod.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace < TERMINATION_GRACE_SECONDS:
        pod["terminationGracePeriodSeconds"] = TERMINATION_GRACE_SECONDS
    labels[SIDECAR_LABEL] = "true"
    annotations[SERVICE_ANNOTATION] = service
    annotations[UPSTREAM_PORT_ANNOTATION] = str(port)
    verb = "re-injected" if index is not None else "injected"
    notes = [f"{where}: {verb} {CONTAINER} (service {service}, forwarding to 127.0.0.1:{port})"]
    for selected in selecting:
        changes = _repoint(selected, port, port_name)
        if changes:
            repointed.append(selected)
        notes += changes
    if not selecting:
        notes.append(f"{where}: no Service in the input selects its Pods; point yours at "
                     f"port {PROXY_PORT_NAME}")  # fmt: skip
    return notes


def _selects(service: dict[str, Any], workload: dict[str, Any], labels: dict[str, Any]) -> bool:
    spec = service.get("spec")
    selector = spec.get("selector") if isinstance(spec, dict) else None
    if not isinstance(selector, dict) or not selector:
        return False
    same_namespace = _namespace(service) == _namespace(workload)
    return same_namespace and all(labels.get(k) == v for k, v in selector.items())


def _namespace(obj: dict[str, Any]) -> str | None:
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) else None


def _container_ports(own: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    return [p for c in own for p in _list(c, "ports", where)]


def _upstream_port(
    where: str,
    own: list[dict[str, Any]],
    selecting: list[dict[str, Any]],
    annotations: dict[str, Any],
    request: Request,
) -> tuple[int, str | None]:
    """(number, name) of the application's port: asked for, recorded by an earlier
    injection, the one a selecting Service targets, or the first one declared."""
    declared = _container_ports(own, where)
    wanted: Any = request.upstream_port
    if wanted is None:
        wanted = annotations.get(UPSTREAM_PORT_ANNOTATION)
    if wanted is None:
        targets = [
            port.get("targetPort", port.get("port"))
            for service in selecting
            for port in _list(_mapping(service, "spec"), "ports", _name(service))
        ]
        wanted = next((t for t in targets if t != PROXY_PORT_NAME and t is not None), None)
    if wanted is None:
        first = next((p for p in declared if p.get("protocol", "TCP") == "TCP"), None)
        if first is None:
            raise InjectionError(f"{where}: no container port to forward to; name one "
                                 "with --upstream-port")  # fmt: skip
        wanted = first.get("containerPort")
    text = str(wanted)
    if text.isdigit():
        number = int(text)
        if not 1 <= number <= MAX_PORT:
            raise InjectionError(f"{where}: upstream port {number} is not in 1-{MAX_PORT}")
        name = next((p.get("name") for p in declared if p.get("containerPort") == number), None)
        return number, name if isinstance(name, str) else None
    for port in declared:
        if port.get("name") == text and isinstance(port.get("containerPort"), int):
            return port["containerPort"], text
    raise InjectionError(f"{where}: no container port named {text!r}")


def _service_name(
    where: str,
    workload: dict[str, Any],
    selecting: list[dict[str, Any]],
    annotations: dict[str, Any],
    request: Request,
) -> str:
    """The service's name in routes: asked for, recorded, the selecting Service's, or
    the workload's own."""
    candidates = [
        request.service,
        annotations.get(SERVICE_ANNOTATION),
        *(_mapping(s, "metadata").get("name") for s in selecting[:1]),
        _mapping(workload, "metadata").get("name"),
    ]
    name = next((c for c in candidates if c is not None), None)
    if not isinstance(name, str) or not is_service_name(name):
        raise InjectionError(f"{where}: {name!r} is not a valid service name; pass --service")
    return name


def _repoint(service: dict[str, Any], port: int, port_name: str | None) -> list[str]:
    """Send each port of `service` that reached the application to the sidecar."""
    where = _name(service)
    notes = []
    for entry in _list(_mapping(service, "spec"), "ports", where):
        target = entry.get("targetPort", entry.get("port"))
        if target == PROXY_PORT_NAME:
            continue
        if target == port or (port_name is not None and target == port_name) or (
            isinstance(target, str) and target.isdigit() and int(target) == port
        ):
            entry["targetPort"] = PROXY_PORT_NAME
            label = entry.get("name", entry.get("port"))
            notes.append(f"{where}: port {label} now targets {PROXY_PORT_NAME} (was {target})")
    return notes

