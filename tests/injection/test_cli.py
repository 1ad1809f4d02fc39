"""`canary inject` as an operator runs it: a file or stdin in, valid YAML out, what it
did on stderr, and one line with exit code 1 on input it cannot rewrite."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controlplane.cli.main import main
from controlplane.injection import manifests
from controlplane.injection.inject import InjectionError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "sidecar-example.yaml"
# the chart's kubeVersion floor and the newest schemas shipped
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def run(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str | None = None,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> tuple[int, str, str]:  # fmt: skip
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def documents(text: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_example_comes_out_injected_and_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["inject", "-f", str(EXAMPLE)], capsys)
    assert code == 0, err
    found = documents(out)
    assert [doc["kind"] for doc in found] == ["Deployment", "Service"]
    for document in found:
        for version in VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)
    assert "deployment/payment-api: injected canary-sidecar" in err
    assert "service/payment-api: port http now targets canary-http (was http)" in err


def test_stdin_and_a_second_pass_change_nothing_more(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, once, _ = run(["inject", "-f", str(EXAMPLE)], capsys)
    code, twice, err = run(["inject", "-f", "-"], capsys, stdin=once, monkeypatch=monkeypatch)
    assert code == 0, err
    assert twice == once
    assert "re-injected" in err


def test_the_options_reach_the_container(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["inject", "-f", str(EXAMPLE), "--service", "payments", "--image",
            "r.io/canary-sidecar:0.2", "--config-map", "shop-canary-config",
            "--proxy-port", "18080", "--admin-port", "18081"]  # fmt: skip
    code, out, err = run(argv, capsys)
    assert code == 0, err
    (deployment,) = [doc for doc in documents(out) if doc["kind"] == "Deployment"]
    (sidecar,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "canary-sidecar"]  # fmt: skip
    assert sidecar["image"] == "r.io/canary-sidecar:0.2"
    assert "--service=payments" in sidecar["command"]
    assert "--listen=0.0.0.0:18080" in sidecar["command"]
    assert sidecar["envFrom"] == [{"configMapRef": {"name": "shop-canary-config"}}]
    assert [p["containerPort"] for p in sidecar["ports"]] == [18080, 18081]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    return str(path)


APP = EXAMPLE.read_text()


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("a: [1, 2", [], "line 1: not valid YAML"),
        ("- just\n- a list\n", [], "document 1 is not a Kubernetes object"),
        ("base: &a {x: 1}\nother: *a\n", [], "aliases are not accepted"),
        (APP.replace("containerPort: 8080", "containerPort: 8080, hostPortt: 1"), [],
         "deployment/payment-api would be invalid at spec.template.spec.containers"),
        (APP, ["--kubernetes-version", "0.9.0"], "Kubernetes 0.9.0 is not one the schemas cover"),
        (APP, ["--upstream-port", "grpc"], "no container port named 'grpc'"),
        (APP, ["--proxy-port", "8080"], "port 8080 is the application's"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", [],
         "no Deployment, StatefulSet or DaemonSet in the input"),
    ],
    ids=["bad-yaml", "not-an-object", "alias", "unknown-field", "unknown-version",
         "unknown-port", "port-clash", "no-workload"],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_code_2(
    text: str, extra: list[str], message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    code, out, err = run(["inject", "-f", write(tmp_path, text), *extra], capsys)
    assert code == 2  # a bad file is a usage error, as for `canary exp create -f`
    assert out == ""  # nothing half-done reaches kubectl apply
    assert err.startswith("canary inject: ") and message in err, err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--proxy-port", "0"], "--proxy-port must be a port number"),
        (["--proxy-port", "9000", "--admin-port", "9000"], "must differ"),
        (["--config-map", "Canary_Config"], "is not a Kubernetes object name"),
        (["--config-map", "a" * 254], "is not a Kubernetes object name"),
        (["--image", "canary sidecar"], "is not an image reference"),
        (["--image", ""], "is not an image reference"),
    ],
)
def test_bad_options_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["inject", "-f", str(EXAMPLE), *argv], capsys)
    assert code == 2 and message in err


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["inject", "-f", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "cannot read" in err and "nope.yaml" in err


def test_oversized_and_overlong_input_is_refused() -> None:
    with pytest.raises(InjectionError, match="larger than"):
        manifests.parse("#" * (manifests.MAX_BYTES + 1), source="big")
    many = "---\na: 1\n" * (manifests.MAX_DOCUMENTS + 1)
    with pytest.raises(InjectionError, match="more than"):
        manifests.parse(many, source="many")


def test_the_output_keeps_the_order_of_keys_and_documents() -> None:
    text = "kind: ConfigMap\napiVersion: v1\nmetadata: {name: z}\n---\n---\nkind: Secret\n"
    parsed = manifests.parse(text, source="t")
    out = manifests.dump(parsed)
    assert out.index("kind: ConfigMap") < out.index("apiVersion: v1") < out.index("kind: Secret")
    assert out.count("---") == 2  # the empty document is dropped


def test_what_kubectl_get_prints_goes_through(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server fields (timestamps, status, a List around the items) are kept as sent."""
    (deployment, service) = documents(APP)
    deployment["metadata"].update(
        {"creationTimestamp": "2026-01-02T03:04:05Z", "resourceVersion": "4711", "generation": 2}
    )
    deployment["status"] = {"replicas": 3, "readyReplicas": 3, "observedGeneration": 2}
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
              "items": [deployment, service]}  # fmt: skip
    text = yaml.safe_dump(listed).replace("'2026-01-02T03:04:05Z'", "2026-01-02T03:04:05Z")
    assert "creationTimestamp: 2026-01-02T03:04:05Z" in text  # unquoted: a YAML timestamp
    code, out, err = run(["inject", "-f", "-"], capsys, stdin=text, monkeypatch=monkeypatch)
    assert code == 0, err
    (result,) = yaml.safe_load_all(out)
    injected = result["items"][0]
    assert injected["metadata"]["creationTimestamp"] == "2026-01-02T03:04:05Z"
    assert injected["status"] == deployment["status"]
    assert "deployment/payment-api: injected" in err
