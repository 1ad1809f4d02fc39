"""`inject()`: the sidecar added to each workload's Pod, the Services that reached the
application pointed at the sidecar, everything else left alone; twice is once."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controlplane.injection.inject import InjectionError, Request, inject
from controlplane.injection.sidecar_container import (
    CONTAINER,
    RESOURCES,
    SERVICE_ANNOTATION,
    SIDECAR_LABEL,
    UPSTREAM_PORT_ANNOTATION,
    SidecarSettings,
)


def deployment(
    name: str = "shop",
    *,
    ports: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    kind: str = "Deployment",
    namespace: str | None = None,
) -> dict[str, Any]:
    labels = labels or {"app": name}
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": f"{name}:1.0",
                        "ports": [{"name": "http", "containerPort": 8080}]
                        if ports is None else ports,
                    }],
                },
            },
        },
    }  # fmt: skip


def service(
    name: str = "shop",
    *,
    selector: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "selector": selector if selector is not None else {"app": "shop"},
            "ports": ports if ports is not None else [{"name": "web", "port": 80,
                                                       "targetPort": "http"}],
        },
    }  # fmt: skip


def pod(document: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = document["spec"]["template"]["spec"]
    return spec


def sidecar_of(document: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in pod(document)["containers"] if c["name"] == CONTAINER]
    return found


def flag(container: dict[str, Any], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in container["command"] if arg.startswith(f"{name}=")]
    return value


def test_adds_the_sidecar_beside_the_application_and_keeps_its_containers() -> None:
    (out,) = inject([deployment()], Request()).documents
    names = [c["name"] for c in pod(out)["containers"]]
    assert names == ["app", CONTAINER]
    sidecar = sidecar_of(out)
    assert sidecar["command"][:2] == ["canary", "sidecar"]
    assert flag(sidecar, "--default-upstream") == "http://127.0.0.1:8080"
    assert flag(sidecar, "--service") == "shop"
    assert sidecar["resources"] == RESOURCES
    assert sidecar["envFrom"] == [{"configMapRef": {"name": "canary-config"}}]
    labels = out["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "shop", SIDECAR_LABEL: "true"}
    assert out["spec"]["selector"] == {"matchLabels": {"app": "shop"}}  # never the selector
    assert pod(out)["terminationGracePeriodSeconds"] == 25


def test_every_mount_has_its_volume_and_the_secrets_are_optional() -> None:
    (out,) = inject([deployment()], Request()).documents
    volumes = {v["name"]: v for v in pod(out)["volumes"]}
    for mount in sidecar_of(out)["volumeMounts"]:
        assert mount["name"] in volumes
    secrets = [v["secret"] for v in volumes.values() if "secret" in v]
    assert secrets and all(s["optional"] is True and s["defaultMode"] == 0o444 for s in secrets)


def test_the_input_is_not_modified() -> None:
    documents = [deployment(), service()]
    before = copy.deepcopy(documents)
    inject(documents, Request())
    assert documents == before


def test_injecting_twice_is_injecting_once() -> None:
    once = inject([deployment(), service()], Request(service="payments")).documents
    twice = inject(once, Request()).documents
    assert twice == once
    assert [c["name"] for c in pod(twice[0])["containers"]].count(CONTAINER) == 1
    assert flag(sidecar_of(twice[0]), "--service") == "payments"  # kept from the annotation


def test_a_second_injection_with_new_settings_replaces_the_sidecar_in_place() -> None:
    once = inject([deployment()], Request()).documents
    newer = SidecarSettings(image="r.io/canary-sidecar:0.2")
    again = inject(once, Request(settings=newer)).documents
    assert [c["name"] for c in pod(again[0])["containers"]] == ["app", CONTAINER]
    assert sidecar_of(again[0])["image"] == "r.io/canary-sidecar:0.2"
    assert len(pod(again[0])["volumes"]) == len(pod(once[0])["volumes"])


@pytest.mark.parametrize(
    ("ports", "expected"),
    [
        ([{"name": "web", "port": 80, "targetPort": "http"}], ["canary-http"]),
        ([{"name": "web", "port": 80, "targetPort": 8080}], ["canary-http"]),
        ([{"name": "web", "port": 8080}], ["canary-http"]),  # targetPort defaults to port
        (
            [{"name": "web", "port": 80, "targetPort": "http"},
             {"name": "metrics", "port": 9102, "targetPort": 9102}],
            ["canary-http", 9102],
        ),
    ],
    ids=["by-name", "by-number", "implicit", "other-port-kept"],
)  # fmt: skip
def test_the_service_port_that_reached_the_application_now_reaches_the_sidecar(
    ports: list[dict[str, Any]], expected: list[Any]
) -> None:
    app = deployment(ports=[{"name": "http", "containerPort": 8080},
                            {"name": "metrics", "containerPort": 9102}])  # fmt: skip
    result = inject([app, service(ports=ports)], Request())
    svc = result.documents[1]
    assert [p.get("targetPort") for p in svc["spec"]["ports"]] == expected
    assert svc in result.changed
    assert flag(sidecar_of(result.documents[0]), "--default-upstream").endswith(":8080")


@pytest.mark.parametrize(
    "other",
    [
        service("other", selector={"app": "billing"}),
        service(namespace="elsewhere"),
        service(selector={}),
    ],
    ids=["other-selector", "other-namespace", "no-selector"],
)
def test_a_service_that_does_not_select_the_pods_is_left_alone(other: dict[str, Any]) -> None:
    result = inject([deployment(), other], Request())
    assert result.documents[1] == other
    assert other not in result.changed
    assert any("no Service in the input selects" in note for note in result.notes)


def test_the_service_name_comes_from_the_selecting_service_else_the_workload() -> None:
    out = inject([deployment(), service("shop-frontend")], Request()).documents
    assert flag(sidecar_of(out[0]), "--service") == "shop-frontend"
    assert out[0]["spec"]["template"]["metadata"]["annotations"][SERVICE_ANNOTATION] == (
        "shop-frontend"
    )
    (alone,) = inject([deployment("billing")], Request()).documents
    assert flag(sidecar_of(alone), "--service") == "billing"


@pytest.mark.parametrize(
    ("asked", "expected"), [(None, 8080), ("metrics", 9102), ("9000", 9000)]
)
def test_the_upstream_port_is_asked_for_or_the_first_declared(
    asked: str | None, expected: int
) -> None:
    app = deployment(ports=[{"name": "http", "containerPort": 8080},
                            {"name": "metrics", "containerPort": 9102}])  # fmt: skip
    (out,) = inject([app], Request(upstream_port=asked)).documents
    assert flag(sidecar_of(out), "--default-upstream") == f"http://127.0.0.1:{expected}"
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations[UPSTREAM_PORT_ANNOTATION] == str(expected)


def test_multi_document_input_injects_every_workload_and_passes_the_rest_through() -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
              "data": {"a": "b"}}  # fmt: skip
    crd = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
           "spec": {"anything": [1, 2]}}  # fmt: skip
    documents = [
        deployment("shop"), None, config, deployment("db", kind="StatefulSet"),
        deployment("agent", kind="DaemonSet"), crd, service(),
    ]  # fmt: skip
    result = inject(documents, Request())
    out = result.documents
    assert out[1] is None and out[2] == config and out[5] == crd
    for index in (0, 3, 4):
        assert sidecar_of(out[index])
    assert [doc["kind"] for doc in result.changed] == [
        "Deployment", "StatefulSet", "DaemonSet", "Service"
    ]


def test_the_items_of_a_list_are_injected() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [deployment(), service()]}
    (out,) = inject([listed], Request()).documents
    assert sidecar_of(out["items"][0])
    assert out["items"][1]["spec"]["ports"][0]["targetPort"] == "canary-http"


def test_an_input_without_a_workload_is_refused() -> None:
    with pytest.raises(InjectionError, match="no Deployment, StatefulSet or DaemonSet"):
        inject([service(), None], Request())


@pytest.mark.parametrize(
    ("documents", "request_", "message"),
    [
        (["just a string"], Request(), "document 1 is not a Kubernetes object"),
        ([{"kind": "Deployment"}], Request(), "document 1 is not a Kubernetes object"),
        ([{"apiVersion": "v1", "kind": "List"}], Request(), "a List without items"),
        ([deployment(ports=[])], Request(), "no container port to forward to"),
        ([deployment()], Request(upstream_port="grpc"), "no container port named 'grpc'"),
        ([deployment()], Request(upstream_port="70000"), "not in 1-65535"),
        ([deployment()], Request(service="Not A Name"), "not a valid service name"),
        (
            [deployment(ports=[{"name": "http", "containerPort": 15080}])],
            Request(),
            "port 15080 is the application's",
        ),
        (
            [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
              "spec": {"template": {"spec": {"containers": []}}}}],
            Request(),
            "deployment/x: no container of its own",
        ),
        (
            [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
              "spec": {"template": {"spec": {"containers": "app"}}}}],
            Request(),
            "containers is not a list of mappings",
        ),
    ],
    ids=["not-a-mapping", "no-apiversion", "list-without-items", "no-port", "unknown-port-name",
         "port-out-of-range", "bad-service-name", "port-clash", "no-container", "bad-containers"],
)  # fmt: skip
def test_bad_input_is_refused_with_a_message_naming_it(
    documents: list[Any], request_: Request, message: str
) -> None:
    with pytest.raises(InjectionError, match=message):
        inject(documents, request_)
