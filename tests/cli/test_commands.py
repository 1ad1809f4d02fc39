"""`canary exp …` and `canary rules …` against a real API (see conftest.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from controlplane.cli.main import app
from controlplane.client import files
from tests.support.auth import ADMIN_ACTOR, bearer

runner = CliRunner()


def canary(api_url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    # wide enough that rich does not wrap a table cell across lines
    return runner.invoke(app, [*args, "--api", api_url], env={"COLUMNS": "200", **(env or {})})


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def created(api_url: str, experiment_file: Path) -> str:
    return ok(canary(api_url, "exp", "create", "-f", str(experiment_file), "-q")).strip()


def as_json(result: Result) -> Any:
    return json.loads(ok(result))


def one_error_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_create_from_the_example_then_list_show_and_events(
    api_url: str, experiment_file: Path, service: str
) -> None:
    result = canary(api_url, "exp", "create", "-f", str(experiment_file))
    assert "created experiment" in ok(result) and "draft" in result.stdout
    experiment_id = result.stdout.split()[2]

    page = as_json(canary(api_url, "exp", "list", "--service", service, "--json"))
    assert page["total"] == 1 and page["items"][0]["id"] == int(experiment_id)
    table = ok(canary(api_url, "exp", "list", "--service", service, "--state", "draft"))
    assert service in table and "payment-api v2.4.0" in table

    shown = as_json(canary(api_url, "exp", "show", experiment_id, "--json"))
    assert shown["state"] == "draft" and [s["weight_pct"] for s in shown["steps"]][-1] == 100
    view = ok(canary(api_url, "exp", "show", experiment_id))
    assert "payment-api-v2-4-0.payments.svc" in view and "x-user-id" in view

    events = as_json(canary(api_url, "exp", "events", experiment_id, "--json"))
    assert len(events) >= 1 and events[0]["experiment_id"] == int(experiment_id)
    assert "at" in ok(canary(api_url, "exp", "events", experiment_id))

    status = ok(canary(api_url, "exp", "status", experiment_id))
    assert status.splitlines()[1].strip() == "draft: not started"
    assert "latest: " in status and "created" in status


def test_start_pause_resume_promote_move_the_experiment_and_log_who(
    api_url: str, experiment_file: Path
) -> None:
    experiment_id = created(api_url, experiment_file)
    env = {"CANARY_USER": "release-bot"}  # a name the caller picks: not what the trail says
    steps = [("start", "running (canary 1%)"), ("pause", "paused"), ("resume", "running")]
    for action, expected in [*steps, ("promote", "promoted (canary 100%)")]:
        result = canary(api_url, "exp", action, experiment_id, "--reason", "by hand", env=env)
        assert expected in ok(result)

    events = as_json(canary(api_url, "exp", "events", experiment_id, "--json"))
    moves = [(e["from_state"], e["to_state"]) for e in events if e["to_state"]]
    assert moves[-4:] == [
        ("draft", "running"),
        ("running", "paused"),
        ("paused", "running"),
        ("running", "promoted"),
    ]
    assert events[-1]["actor"] == ADMIN_ACTOR and events[-1]["reason"] == "by hand"


def test_start_says_the_route_is_published_not_confirmed_without_a_data_plane(
    api_url: str, experiment_file: Path
) -> None:
    experiment_id = created(api_url, experiment_file)
    started = time.monotonic()
    out = ok(canary(api_url, "exp", "start", experiment_id))
    # no sidecar of the service ever reported: nothing to wait for
    assert time.monotonic() - started < 2.0
    assert out.splitlines()[-1] == (
        "route: published, not yet confirmed: no data plane reported within 30 s (is a "
        "sidecar or router running for this service?)"
    )
    view = " ".join(ok(canary(api_url, "exp", "show", experiment_id)).split())
    assert "route published, not yet confirmed: no data plane reported" in view
    quiet = ok(canary(api_url, "exp", "pause", experiment_id, "--confirm-wait", "0"))
    assert "route:" not in quiet


def test_illegal_transition_is_one_line_and_exit_1(api_url: str, experiment_file: Path) -> None:
    experiment_id = created(api_url, experiment_file)
    result = canary(api_url, "exp", "pause", experiment_id)
    assert result.exit_code == 1
    assert "draft" in one_error_line(result)


def test_wait_exits_0_on_a_promoted_experiment(api_url: str, experiment_file: Path) -> None:
    experiment_id = created(api_url, experiment_file)
    ok(canary(api_url, "exp", "start", experiment_id))
    ok(canary(api_url, "exp", "promote", experiment_id))
    result = canary(api_url, "exp", "wait", experiment_id, "--interval", "0.05")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"experiment {experiment_id} promoted"


def test_wait_follows_a_running_experiment_and_exits_1_when_rolled_back(
    api_url: str, experiment_file: Path
) -> None:
    experiment_id = created(api_url, experiment_file)
    ok(canary(api_url, "exp", "start", experiment_id))

    def roll_back_soon() -> None:
        time.sleep(0.3)
        url = f"{api_url}/v1/experiments/{experiment_id}/rollback"
        httpx.post(url, headers=bearer()).raise_for_status()

    thread = threading.Thread(target=roll_back_soon)
    thread.start()
    try:
        result = canary(api_url, "exp", "wait", experiment_id, "--interval", "0.05")
    finally:
        thread.join()
    assert result.exit_code == 1, result.output
    assert result.stdout.strip() == f"experiment {experiment_id} rolled_back"
    # not a terminal: one progress line per change, the last one the verdict
    progress = result.stderr.strip().splitlines()
    assert progress[0].startswith("state running  step 1/5  canary 1%  breaker closed")
    assert progress[-1].startswith("state rolled_back")
    assert "running → rolled_back" in progress[-1]


def test_wait_exits_1_on_an_aborted_experiment(api_url: str, experiment_file: Path) -> None:
    experiment_id = created(api_url, experiment_file)
    ok(canary(api_url, "exp", "abort", experiment_id))
    assert canary(api_url, "exp", "wait", experiment_id).exit_code == 1


def test_wait_exits_2_on_timeout(api_url: str, experiment_file: Path) -> None:
    experiment_id = created(api_url, experiment_file)
    result = canary(api_url, "exp", "wait", experiment_id, "--timeout", "0.2", "--interval", "0.05")
    assert result.exit_code == 2
    progress, error = result.stderr.strip().splitlines()
    assert progress.startswith("state draft  step -/5  canary 0%")
    assert error == f"canary exp wait: experiment {experiment_id}: still draft after 0.2 s"


def test_unknown_id_is_one_line_and_exit_2(api_url: str) -> None:
    for command in (["show", "999999"], ["wait", "999999"], ["events", "999999"]):
        result = canary(api_url, "exp", *command)
        assert result.exit_code == 2, command
        assert "404" in one_error_line(result)


def test_bad_file_is_exit_2_with_file_line_and_field(api_url: str, tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: bad\nservice: checkout\nvariants:\n  baseline: {upstream: http://a:8080}\n"
        "  canary: {upstream: http://b:8080}\nsteps:\n  - weight_pct: 150\n    hold_sec: 1\n"
    )
    result = canary(api_url, "exp", "create", "-f", str(path))
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith(f"canary exp create: {path}:7: steps[0].weight_pct: ")
    assert "less than or equal to 100" in line


def test_without_local_schemas_the_apis_errors_map_to_the_line(
    api_url: str, experiment_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "experiment_schema", lambda: None)
    text = experiment_file.read_text().replace("hold_sec: 600}", "hold_sec: 600, colour: red}", 1)
    experiment_file.write_text(text)
    result = canary(api_url, "exp", "create", "-f", str(experiment_file))
    assert result.exit_code == 2
    assert f"{experiment_file}:16: steps[2].colour: unknown field" in one_error_line(result)


def test_unreachable_api_is_one_line_and_exit_2(
    experiment_file: Path, unreachable_url: str
) -> None:
    url = unreachable_url
    for command in (
        ["exp", "list"],
        ["exp", "wait", "1"],
        ["exp", "create", "-f", str(experiment_file)],
        ["rules", "show", "checkout"],
    ):
        result = canary(url, *command)
        assert result.exit_code == 2, command
        assert f"cannot reach the canary API at {url}" in one_error_line(result)


def test_api_url_comes_from_canary_api(api_url: str, service: str) -> None:
    result = runner.invoke(
        app, ["exp", "list", "--service", service, "--json"], env={"CANARY_API": api_url}
    )
    assert json.loads(ok(result))["total"] == 0


def shown_in_force(api_url: str, kind: str, service: str, timeout: float = 10.0) -> Any:
    """`canary <kind> show --json` once the controller's leader has published it."""
    deadline = time.monotonic() + timeout
    while True:
        shown = as_json(canary(api_url, kind, "show", service, "--json"))
        if shown["applied"] is True or time.monotonic() > deadline:
            return shown
        time.sleep(0.05)  # the leader's pass follows the commit; no event to wait on here


def test_rules_apply_then_show(api_url: str, rule_file: Path, service: str) -> None:
    assert f"applied the breaker rule of {service}" in ok(
        canary(api_url, "rules", "apply", "-f", str(rule_file))
    )
    rule = shown_in_force(api_url, "rules", service)
    assert (rule["service"], rule["threshold_ms"], rule["max_trips"]) == (service, 800, 3)
    assert (rule["applied"], rule["applied_note"]) == (True, None)
    table = ok(canary(api_url, "rules", "show", service))
    assert "threshold_ms" in table and "800" in table


def test_rules_apply_fills_the_service_from_the_option(
    api_url: str, tmp_path: Path, service: str
) -> None:
    path = tmp_path / "rule.json"
    path.write_text('{"threshold_ms": 250, "percentile": 99}')
    ok(canary(api_url, "rules", "apply", "-f", str(path), "--service", service))
    assert as_json(canary(api_url, "rules", "show", service, "--json"))["percentile"] == 99


def test_bad_rule_file_is_exit_2_with_line(api_url: str, rule_file: Path) -> None:
    rule_file.write_text(rule_file.read_text().replace("percentile: 95", "percentile: 97"))
    result = canary(api_url, "rules", "apply", "-f", str(rule_file))
    assert result.exit_code == 2
    assert f"{rule_file}:7: percentile: " in one_error_line(result)


def test_rules_show_of_a_service_without_rule_is_exit_2(api_url: str, service: str) -> None:
    result = canary(api_url, "rules", "show", service)
    assert result.exit_code == 2
    assert "404" in one_error_line(result)
