"""`canary overload …` against a real API (see conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.auth.roles import Role
from controlplane.client import files
from controlplane.kernel.overload import ServiceOverload
from tests.cli.test_commands import as_json, canary, ok, one_error_line, shown_in_force
from tests.support.auth import TOKENS

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "overload.yaml"


@pytest.fixture
def overload_file(tmp_path: Path, service: str) -> Path:
    text = EXAMPLE.read_text().replace("service: payment-api", f"service: {service}")
    assert service in text
    path = tmp_path / "overload.yaml"
    path.write_text(text)
    return path


def test_the_shipped_example_is_a_valid_config() -> None:
    _, body = files.load_overload(EXAMPLE)
    config = ServiceOverload.model_validate(body)
    assert config.service == "payment-api" and config.low_priority_paths == (
        "/batch/",
        "/reports/export",
    )


def test_apply_show_delete(api_url: str, overload_file: Path, service: str) -> None:
    assert f"applied the overload protection of {service}" in ok(
        canary(api_url, "overload", "apply", "-f", str(overload_file))
    )
    shown = shown_in_force(api_url, "overload", service)
    assert (shown["service"], shown["max_limit"], shown["shed_status"]) == (service, 200, 429)
    assert shown["applied"] is True
    table = ok(canary(api_url, "overload", "show", service))
    assert "queue_timeout_ms" in table and "/reports/export" in table

    assert f"removed the overload protection of {service}" in ok(
        canary(api_url, "overload", "delete", service)
    )
    gone = canary(api_url, "overload", "show", service)
    assert gone.exit_code == 2 and "404" in one_error_line(gone)
    again = canary(api_url, "overload", "delete", service)
    assert again.exit_code == 2 and "404" in one_error_line(again)


def test_apply_fills_the_service_from_the_option(
    api_url: str, tmp_path: Path, service: str
) -> None:
    path = tmp_path / "overload.json"
    path.write_text('{"max_limit": 64, "shed_status": 503}')
    ok(canary(api_url, "overload", "apply", "-f", str(path), "--service", service))
    shown = as_json(canary(api_url, "overload", "show", service, "--json"))
    assert (shown["max_limit"], shown["shed_status"]) == (64, 503)


def test_a_bad_file_is_one_line_naming_the_line_and_exit_2(
    api_url: str, overload_file: Path, service: str
) -> None:
    overload_file.write_text(
        overload_file.read_text().replace("shed_status: 429", "shed_status: 500")
    )
    result = canary(api_url, "overload", "apply", "-f", str(overload_file))
    assert result.exit_code == 2
    assert f"{overload_file}:13: shed_status: " in one_error_line(result)
    # nothing reached the API
    assert canary(api_url, "overload", "show", service).exit_code == 2

    overload_file.write_text("service: x\nbogus: 1\n")
    result = canary(api_url, "overload", "apply", "-f", str(overload_file), "--service", "x")
    assert result.exit_code == 2 and "bogus: unknown field" in one_error_line(result)
    missing = canary(api_url, "overload", "apply", "-f", str(overload_file.parent / "none.yaml"))
    assert missing.exit_code == 2 and "no such file" in one_error_line(missing)


def test_a_role_too_low_is_refused_with_exit_1(
    api_url: str, overload_file: Path, service: str
) -> None:
    env = {"CANARY_TOKEN": TOKENS[Role.VIEWER]}
    result = canary(api_url, "overload", "apply", "-f", str(overload_file), env=env)
    assert result.exit_code == 1 and "403" in one_error_line(result)
    result = canary(api_url, "overload", "delete", service, env=env)
    assert result.exit_code == 1


def test_no_service_anywhere_is_a_usage_error(api_url: str, tmp_path: Path) -> None:
    path = tmp_path / "overload.yaml"
    path.write_text("max_limit: 10\n")
    result = canary(api_url, "overload", "apply", "-f", str(path))
    assert result.exit_code == 2 and "service: Field required" in one_error_line(result)
