"""`canary service releases` and an experiment file without a baseline
(deploy/examples/next-release.yaml), against a real API (see conftest.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_commands import as_json, canary, created, ok, one_error_line

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


def next_release_file(tmp_path: Path, service: str) -> Path:
    text = (EXAMPLES / "next-release.yaml").read_text()
    path = tmp_path / "next-release.yaml"
    path.write_text(text.replace("service: payment-api", f"service: {service}"))
    return path


def test_the_next_release_starts_from_the_promoted_version(
    api_url: str, experiment_file: Path, service: str, tmp_path: Path
) -> None:
    first = created(api_url, experiment_file)
    ok(canary(api_url, "exp", "start", first))
    ok(canary(api_url, "exp", "promote", first))

    result = canary(api_url, "exp", "create", "-f", str(next_release_file(tmp_path, service)))
    lines = ok(result).splitlines()
    assert lines[0].startswith("created experiment") and "draft" in lines[0]
    assert lines[1] == (
        "baseline: the service's stable version when it starts, now "
        "v2.4.0 (http://payment-api-v2-4-0.payments.svc:8080)"
    )
    second = lines[0].split()[2]
    view = ok(canary(api_url, "exp", "show", second))
    assert "v2.4.0 (the stable version when it starts)" in view and "v2.5.0" in view
    ok(canary(api_url, "exp", "start", second))
    ok(canary(api_url, "exp", "rollback", second))

    text = ok(canary(api_url, "service", "releases", service))
    assert text.splitlines()[0].startswith(
        "stable: v2.4.0 (http://payment-api-v2-4-0.payments.svc:8080) since "
    )
    assert f"made stable by experiment {first}" in text.splitlines()[0]
    for kind in ("rolled_back", "promoted", "seeded"):
        assert kind in text
    history = as_json(canary(api_url, "service", "releases", service, "--json"))
    assert [r["kind"] for r in history["items"]] == ["rolled_back", "promoted", "seeded"]
    page = as_json(canary(api_url, "service", "releases", service, "--limit", "1", "--json"))
    assert len(page["items"]) == 1 and page["total"] == 3


def test_a_service_without_releases_says_so(api_url: str, service: str) -> None:
    text = ok(canary(api_url, "service", "releases", service))
    assert text.strip() == (
        f"{service} has no stable version yet: its first experiment names the baseline, "
        "which becomes stable when it starts"
    )


def test_a_first_release_without_a_baseline_is_one_line_naming_the_field(
    api_url: str, service: str, tmp_path: Path
) -> None:
    path = next_release_file(tmp_path, service)
    result = canary(api_url, "exp", "create", "-f", str(path))
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith(f"canary exp create: {path}:7: variants.baseline: required: "
                           f"service '{service}' has no stable version yet"), line


def test_a_bad_service_name_is_one_line(api_url: str) -> None:
    result = canary(api_url, "service", "releases", "Not_A_Service")
    assert result.exit_code == 2
    assert one_error_line(result).startswith("canary service releases: Invalid request: "
                                             "path.service: ")
