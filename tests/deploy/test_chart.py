"""The Helm chart in deploy/helm/canary, rendered with every values file it ships, and
the sidecar patch applied to its example: each object valid against the Kubernetes
API schema (strict: an unknown field fails), the Prometheus Operator objects against
their CRD models, and every workload hardened, bounded, probed and covered by a
disruption budget."""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes_validate
import pytest
from cloudcoil.models.prometheus_operator import v1 as monitoring

from tests.deploy.render import (
    CHART,
    EXAMPLE_APP,
    NAMESPACE,
    VALUES,
    chart,
    containers,
    injected_example,
    patched_example,
    pod_spec,
    run,
    tool,
)

# the chart's kubeVersion floor, the kubectl the tests use, the newest schemas shipped
K8S_VERSIONS = ("1.27.0", "1.35.0", kubernetes_validate.latest_version())
CRD_MODELS = {"ServiceMonitor": monitoring.ServiceMonitor, "PodMonitor": monitoring.PodMonitor}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}


EXAMPLES = {"sidecar-patch": patched_example, "sidecar-inject": injected_example}


def every_rendering() -> list[Any]:
    return [pytest.param(name, id=name) for name in (*VALUES, *EXAMPLES)]


def objects(rendering: str) -> list[dict[str, Any]]:
    example = EXAMPLES.get(rendering)
    return example() if example is not None else chart(rendering)


@pytest.mark.parametrize("values", list(VALUES))
def test_the_chart_lints_clean(values: str) -> None:
    files = [f"--values={path}" for path in VALUES[values]]
    run(tool("helm"), "lint", "--strict", str(CHART), *files)


@pytest.mark.parametrize("rendering", every_rendering())
def test_every_object_is_valid_against_the_kubernetes_schemas(rendering: str) -> None:
    found = objects(rendering)
    assert found
    for document in found:
        if document["kind"] in CRD_MODELS:
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


def test_the_monitoring_objects_are_rendered_only_when_asked() -> None:
    kinds = [doc["kind"] for doc in chart("default")]
    assert "ServiceMonitor" not in kinds and "PodMonitor" not in kinds
    kinds = [doc["kind"] for doc in chart("production-values")]
    assert kinds.count("ServiceMonitor") == 2 and kinds.count("PodMonitor") == 1


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("scrape", ["admin", "api"])
@pytest.mark.parametrize("values", list(VALUES))
def test_the_monitoring_objects_match_the_operator_crds(values: str, scrape: str) -> None:
    """Parsed by models generated from the CRDs; a field they drop (unknown) or
    reshape (wrong type) makes the round trip differ."""
    found = chart(
        values,
        "--set=monitoring.serviceMonitor.enabled=true",
        "--set=monitoring.sidecarPodMonitor.enabled=true",
        f"--set=monitoring.serviceMonitor.controlPlanePort={scrape}",
    )
    for document in found:
        model = CRD_MODELS.get(document["kind"])
        if model is None:
            continue
        parsed = model.model_validate(document)
        again = without_nulls(parsed.model_dump(by_alias=True, mode="json"))
        assert again == document, document["metadata"]["name"]


def test_a_wrong_monitoring_field_would_be_caught() -> None:
    document = next(doc for doc in chart("production-values") if doc["kind"] == "ServiceMonitor")
    document["spec"]["endpoints"][0]["bearerToken"] = "x"  # no such field
    parsed = monitoring.ServiceMonitor.model_validate(document)
    assert without_nulls(parsed.model_dump(by_alias=True, mode="json")) != document


def workloads(rendering: str) -> list[dict[str, Any]]:
    return [doc for doc in objects(rendering) if doc["kind"] in WORKLOADS]


@pytest.mark.parametrize("rendering", every_rendering())
def test_every_container_runs_as_non_root_on_a_read_only_root(rendering: str) -> None:
    for workload in workloads(rendering):
        pod = pod_spec(workload) or {}
        for container in containers(workload):
            if container["name"] == EXAMPLE_APP:
                continue  # the example's own container, not ours
            where = f"{workload['metadata']['name']}/{container['name']}"
            merged = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            assert merged.get("runAsNonRoot") is True, where
            assert merged.get("runAsUser", 0) != 0, where
            assert merged.get("readOnlyRootFilesystem") is True, where
            assert merged.get("allowPrivilegeEscalation") is False, where
            assert merged.get("capabilities", {}).get("drop") == ["ALL"], where
            assert merged.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            mounts = {mount["mountPath"] for mount in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{where}: no writable /tmp"


@pytest.mark.parametrize("rendering", every_rendering())
def test_every_container_has_requests_and_limits(rendering: str) -> None:
    for workload in workloads(rendering):
        for container in containers(workload):
            resources = container.get("resources", {})
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert {"cpu", "memory"} <= set(resources.get("limits", {})), where


@pytest.mark.parametrize("rendering", every_rendering())
def test_every_long_running_container_is_probed_on_a_port_it_declares(rendering: str) -> None:
    for workload in workloads(rendering):
        for container in (pod_spec(workload) or {})["containers"]:
            if container["name"] == EXAMPLE_APP:
                continue
            ports = {port["name"] for port in container.get("ports", [])}
            for kind in ("livenessProbe", "readinessProbe"):
                probe = container.get(kind)
                assert probe, f"{container['name']}: no {kind}"
                if "exec" in probe:  # the trial's Redis and PostgreSQL ask their CLI
                    assert probe["exec"]["command"], f"{container['name']}: {kind}"
                    continue
                (action,) = [probe[a] for a in ("httpGet", "tcpSocket") if a in probe]
                assert action["port"] in ports, f"{container['name']}: {kind}"


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("values", list(VALUES))
def test_every_replicated_workload_has_a_disruption_budget(values: str) -> None:
    found = chart(values)
    budgets = [doc for doc in found if doc["kind"] == "PodDisruptionBudget"]
    for workload in workloads_of(found):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if selects(b["spec"]["selector"]["matchLabels"], labels)]
        if workload["spec"]["replicas"] > 1:
            assert len(covering) == 1, workload["metadata"]["name"]
        for budget in covering:  # never one that forbids every eviction
            assert "maxUnavailable" in budget["spec"] and budget["spec"]["maxUnavailable"] != 0


def workloads_of(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in found if doc["kind"] in WORKLOADS]


@pytest.mark.parametrize("scrape", ["admin", "api"])
@pytest.mark.parametrize("values", list(VALUES))
def test_services_and_monitors_reach_declared_ports(values: str, scrape: str) -> None:
    found = chart(
        values,
        "--set=monitoring.serviceMonitor.enabled=true",
        f"--set=monitoring.serviceMonitor.controlPlanePort={scrape}",
    )
    services = [doc for doc in found if doc["kind"] == "Service"]
    for service in services:
        pods = [
            w for w in workloads_of(found)
            if selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
        ]  # fmt: skip
        assert len(pods) == 1, service["metadata"]["name"]
        declared = {p["name"] for c in containers(pods[0]) for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in declared, service["metadata"]["name"]
    for monitor in (doc for doc in found if doc["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services if selects(selector, s["metadata"]["labels"])]
        # the Operator scrapes an endpoint on the selected Services naming its port:
        # exactly one here, so no pod is scraped twice
        for endpoint in monitor["spec"]["endpoints"]:
            naming = [s for s in selected
                      if endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}]  # fmt: skip
            assert len(naming) == 1, (monitor["metadata"]["name"], endpoint["port"])
            assert endpoint["path"] == "/metrics"
            assert endpoint["authorization"]["type"] == "Bearer"


@pytest.mark.parametrize("rendering", list(EXAMPLES))
def test_the_sidecar_joins_the_applications_pod_and_its_service(rendering: str) -> None:
    (deployment,) = workloads(rendering)
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert sorted(names) == ["canary-sidecar", EXAMPLE_APP]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "payment-api", "canary.dev/sidecar": "true"}
    service = next(doc for doc in objects(rendering) if doc["kind"] == "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "canary-http"


def test_the_patch_and_canary_inject_add_the_same_sidecar() -> None:
    """The patch is kubectl's way to what `canary inject` does: one container, one set
    of volumes, the same pod metadata."""
    (patched,) = workloads("sidecar-patch")
    (injected,) = workloads("sidecar-inject")
    for template in (patched["spec"]["template"], injected["spec"]["template"]):
        template["spec"]["containers"].sort(key=lambda c: c["name"])  # kubectl prepends
    assert patched["spec"]["template"] == injected["spec"]["template"]


def test_values_outside_the_schema_are_refused() -> None:
    for wrong in ("config.extraEnv.PATH=/x", "controlPlane.replicas=0", "images.registry=r.io",
                  "secrets.apiTls=Not_A_Name", "unknownKey=1",
                  "config.redisUrl=redis://canary:hunter2@redis:6379/0"):  # fmt: skip
        done = subprocess.run(
            [tool("helm"), "template", "t", str(CHART), f"--set={wrong}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0, wrong


def test_the_chart_holds_no_secret_value() -> None:
    """Outside the trial profile, which generates its Secrets (below)."""
    for values in VALUES:
        found = chart(values)
        if values != "trial":
            assert "Secret" not in {doc["kind"] for doc in found}
        for config in (doc for doc in found if doc["kind"] == "ConfigMap"):
            for name in config["data"]:
                assert not name.endswith(("_PASSWORD", "_TOKEN", "_URL")) or name in {
                    "CANARY_REDIS_URL", "CANARY_PUBLIC_URL"}, name  # fmt: skip


def test_the_namespace_and_release_reach_the_api_names() -> None:
    (deployment,) = [d for d in chart("default") if d["metadata"]["name"].endswith("control-plane")
                     and d["kind"] == "Deployment"]  # fmt: skip
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]
           ["containers"][0]["env"]}  # fmt: skip
    assert f"canary-api.{NAMESPACE}.svc" in env["CANARY_TRUSTED_HOSTS"].split(",")


def file_variables(container: dict[str, Any], maps: dict[str, dict[str, str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for source in container.get("envFrom", []):
        found |= maps[source["configMapRef"]["name"]]
    found |= {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    return {name: value for name, value in found.items() if name.endswith("_FILE")}


@pytest.mark.parametrize("values", list(VALUES))
def test_every_file_a_variable_names_is_mounted_in_the_container(values: str) -> None:
    """Also for the sidecar patch, which reads the ConfigMap of a release named canary."""
    found = chart(values)
    maps = {doc["metadata"]["name"]: doc["data"] for doc in found if doc["kind"] == "ConfigMap"}
    if values in {"default", "trial"}:
        found = [*found, *patched_example(), *injected_example()]
    checked = 0
    for workload in workloads_of(found):
        for container in containers(workload):
            mounts = {mount["mountPath"] for mount in container.get("volumeMounts", [])}
            for name, path in file_variables(container, maps).items():
                assert path.rsplit("/", 1)[0] in mounts, f"{container['name']}: {name}={path}"
                checked += 1
    assert checked


def test_the_install_notes_name_what_was_installed() -> None:
    out = run(tool("helm"), "install", "canary", str(CHART), "--namespace", "shop",
              "--dry-run=client")  # fmt: skip
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl -n shop exec deploy/canary-control-plane" in notes
    assert "canary-sidecar:0.1.0" in notes


def secrets_of(found: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["stringData"] for d in found if d["kind"] == "Secret"}


def test_the_trial_generates_every_secret_it_mounts_and_none_twice_alike() -> None:
    """No Secret to create before `helm install` with values-trial.yaml: each one a
    workload names is rendered, with fresh random values at each rendering (an upgrade
    keeps the cluster's through `lookup`, which `helm template` cannot show)."""
    first, second = chart("trial"), chart("trial", "--set=config.logFormat=json")
    generated = secrets_of(first)
    named = {
        name
        for workload in workloads_of(first)
        for name in secret_names(pod_spec(workload) or {})
    }
    assert named and named <= set(generated), named - set(generated)
    again = secrets_of(second)
    for name, data in generated.items():
        assert data.keys() == again[name].keys()
        for key, value in data.items():
            assert len(value) >= 32 and value != again[name][key], f"{name}/{key}"


def secret_names(pod: dict[str, Any]) -> set[str]:
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
    return names


def test_the_trial_secrets_are_what_the_product_loads() -> None:
    from controlplane.auth.tokens import looks_like_token
    from controlplane.kernel import sample_keys

    found = chart("trial")
    generated = secrets_of(found)
    # `canary serve` installs only a token of the API's shape (cnry_…)
    assert looks_like_token(generated["canary-bootstrap-admin-token"]["token"])
    assert generated["canary-admin-token"]["token"]
    keys = sample_keys.parse_sample_keys(generated["canary-sample-keys"]["keys"], origin="trial")
    assert len(keys.current.secret) >= 32
    password = generated["canary-trial-postgres"]["password"]
    url = generated["canary-db"]["url"]
    assert url == f"postgresql+psycopg://canary:{password}@canary-postgres.{NAMESPACE}.svc:5432/canary"
    (config,) = [d["data"] for d in found if d["kind"] == "ConfigMap"]
    assert config["CANARY_ETCD"] == f"http://canary-etcd.{NAMESPACE}.svc:2379"
    assert config["CANARY_REDIS_URL"] == f"redis://canary-redis.{NAMESPACE}.svc:6379/0"
    services = {d["metadata"]["name"] for d in found if d["kind"] == "Service"}
    assert {"canary-etcd", "canary-redis", "canary-postgres"} <= services


@pytest.mark.parametrize("values", list(VALUES))
def test_the_bootstrap_admin_token_is_mounted_only_when_named(values: str) -> None:
    (serve,) = [c for d in chart(values) if d["kind"] == "Deployment"
                for c in (pod_spec(d) or {})["containers"] if c["name"] == "serve"]  # fmt: skip
    env = {e["name"]: e.get("value") for e in serve["env"]}
    mounts = {m["mountPath"] for m in serve["volumeMounts"]}
    if values == "trial":
        path = env["CANARY_BOOTSTRAP_ADMIN_TOKEN_FILE"]
        assert path.rsplit("/", 1)[0] in mounts
    else:
        assert "CANARY_BOOTSTRAP_ADMIN_TOKEN_FILE" not in env


def test_the_trial_refuses_backend_credentials_its_backends_do_not_have() -> None:
    done = subprocess.run(
        [tool("helm"), "template", "t", str(CHART), "--set=trial.enabled=true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "the trial's etcd and Redis have no TLS" in done.stderr


def test_the_trial_profile_says_it_is_not_for_production() -> None:
    text = (CHART / "values-trial.yaml").read_text()
    assert "NOT FOR PRODUCTION" in text.splitlines()[0]
    out = run(tool("helm"), "install", "canary", str(CHART), "--namespace", "shop",
              "--dry-run=client", f"--values={CHART / 'values-trial.yaml'}")  # fmt: skip
    notes = out.split("NOTES:", 1)[1]
    assert "NOT FOR PRODUCTION" in notes
    assert "get secret canary-bootstrap-admin-token" in notes
    for deployment in (d for d in chart("trial") if d["kind"] == "Deployment"):
        if deployment["metadata"]["name"].endswith(("-etcd", "-redis", "-postgres")):
            assert "not for production" in deployment["metadata"]["annotations"]["canary.dev/trial"]


def serve_and_collector(found: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    named = {c["name"]: c for d in found if d["kind"] == "Deployment"
             for c in (pod_spec(d) or {})["containers"]}  # fmt: skip
    return named["serve"], named["collector"]


def admin_wiring(container: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    """The admin port's number, the --admin argument, the liveness probe's action."""
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "admin"]
    (argument,) = [a for a in container["command"] if a.startswith("--admin=")]
    return port, argument, container["livenessProbe"]["httpGet"]


@pytest.mark.parametrize(
    ("extra", "serve_port", "collector_port"),
    [((), 9101, 9100),
     (("--set=controlPlane.adminPort=9201", "--set=collector.adminPort=9202"), 9201, 9202)],
)  # fmt: skip
def test_both_processes_serve_their_admin_listener_and_are_probed_there(
    extra: tuple[str, ...], serve_port: int, collector_port: int
) -> None:
    found = chart("production-values", "--set=monitoring.serviceMonitor.enabled=true", *extra)
    serve, collector = serve_and_collector(found)
    for container, number in ((serve, serve_port), (collector, collector_port)):
        port, argument, liveness = admin_wiring(container)
        assert port == number and argument == f"--admin=0.0.0.0:{number}"
        assert liveness == {"path": "/healthz", "port": "admin"}  # plain HTTP, no token
    # ready means the API serves: its own port, over its TLS
    assert serve["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "api",
                                                  "scheme": "HTTPS"}  # fmt: skip
    assert collector["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert "--liveness-bound=30" in collector["command"]
    assert "--liveness-bound=30" in serve["command"]
    admin = {
        d["metadata"]["name"]: d["spec"]
        for d in found
        if d["kind"] == "Service" and d["metadata"]["name"].endswith(("-admin", "-collector"))
    }
    assert admin["canary-api-admin"]["ports"][0]["port"] == serve_port
    assert admin["canary-api-admin"]["clusterIP"] == "None"  # never behind a LoadBalancer
    assert admin["canary-collector"]["ports"][0]["port"] == collector_port
    # /metrics of both with the admin token, from the Secret the pods mount
    for monitor in (d for d in found if d["kind"] == "ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "admin" and endpoint["scheme"] == "http"
        assert endpoint["authorization"]["credentials"] == {"name": "canary-admin-token",
                                                            "key": "token"}  # fmt: skip


def test_the_admin_token_reaches_the_control_planes_listener() -> None:
    """`canary serve --admin` reads CANARY_ADMIN_TOKEN_FILE: the ConfigMap names the
    file, the Secret is mounted there."""
    found = chart("default")
    serve, _ = serve_and_collector(found)
    (config,) = [d["data"] for d in found if d["kind"] == "ConfigMap"]
    path = config["CANARY_ADMIN_TOKEN_FILE"]
    mounts = {m["mountPath"] for m in serve["volumeMounts"]}
    assert path.rsplit("/", 1)[0] in mounts
    assert {"name": "canary-config"} in [e["configMapRef"] for e in serve["envFrom"]]


def test_the_control_plane_can_still_be_scraped_on_the_api_port() -> None:
    found = chart("production-values", "--set=monitoring.serviceMonitor.controlPlanePort=api")
    monitor = next(d for d in found if d["metadata"]["name"] == "canary-control-plane"
                   and d["kind"] == "ServiceMonitor")  # fmt: skip
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "api" and endpoint["scheme"] == "https"
    assert endpoint["authorization"]["credentials"] == {"name": "canary-metrics-token",
                                                        "key": "token"}  # fmt: skip


def test_admin_values_outside_their_bounds_are_refused() -> None:
    for wrong, says in (
        ("controlPlane.adminPort=8443", "must differ from controlPlane.port"),
        ("controlPlane.adminPort=0", "adminPort"),
        ("collector.livenessBound=1", "livenessBound"),
        ("monitoring.serviceMonitor.controlPlanePort=pod", "controlPlanePort"),
    ):
        done = subprocess.run(
            [tool("helm"), "template", "t", str(CHART), f"--set={wrong}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0 and says in done.stderr, (wrong, done.stderr)
