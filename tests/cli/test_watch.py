"""`canary exp watch`: what a look shows, and the command against a real API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from controlplane.cli.main import app
from controlplane.cli.watch import watch, watch_rows

runner = CliRunner()

HALF_OPEN: dict[str, Any] = {
    "id": 7, "name": "shop v2", "service": "shop", "state": "running", "current_step": 0,
    "steps": [{"weight_pct": 5}, {"weight_pct": 100}], "canary_weight_bp": 100,
    "breaker_state": "half_open", "trips": 1,
    "route_confirmation": {"confirmed": True, "data_planes": 2, "confirmed_by": 2,
                           "sentence": "confirmed by 2 of 2 data plane(s)"},
    "live": {
        "trips": 1, "max_trips": 3,
        "snapshots": {"canary": {"p95_ms": 407.2, "failure_ratio": 0.0, "count": 68},
                      "baseline": {"p95_ms": 88.0, "failure_ratio": 0.01, "count": 900}},
        "probe": {"sentence": "probing at 1% of traffic: 12 of 30 canary samples; ..."},
        "last_reason": "probing at 100 bp until ...",
    },
}


def test_a_look_shows_windows_probe_and_route_in_words() -> None:
    rows = dict(watch_rows(HALF_OPEN, {"kind": "half_open", "from_state": "open",
                                       "to_state": "half_open", "reason": "cooldown over"}))
    assert rows["experiment"] == "7 shop v2 (shop)"
    assert rows["step"] == "1/2" and rows["canary weight"] == "1%"
    assert rows["breaker"] == "half_open, trips 1 of 3"
    assert rows["canary"] == "P95 407 ms · failed 0.0% · n=68"
    assert rows["baseline"] == "P95 88 ms · failed 1.0% · n=900"
    assert rows["probe"].startswith("probing at 1% of traffic: 12 of 30")
    assert rows["route"] == "confirmed by 2 of 2 data plane(s)"
    assert rows["latest event"] == "half_open open → half_open: cooldown over"


def test_a_look_says_where_the_rollout_stands_before_the_controllers_reason() -> None:
    ended = {**HALF_OPEN, "state": "rolled_back", "summary": "rolled back: all traffic to the "
             "baseline", "live": {**HALF_OPEN["live"], "last_reason": "trip 1 of max_trips 1: "
                                  "rolled back; window: breach: latency 1 vs bound 0.05"}}
    labels = [label for label, _ in watch_rows(ended, None)]
    rows = dict(watch_rows(ended, None))
    assert rows["standing"] == "rolled back: all traffic to the baseline"
    assert labels.index("standing") < labels.index("last decision")
    live_summary = {**HALF_OPEN, "live": {**HALF_OPEN["live"], "summary": "probing at 1%"}}
    assert dict(watch_rows(live_summary, None))["standing"] == "probing at 1%"


def test_a_canary_failing_every_request_reads_100_percent() -> None:
    broken = {**HALF_OPEN, "live": {**HALF_OPEN["live"], "snapshots": {
        "canary": {"p95_ms": 3.0, "failure_ratio": 1.0, "count": 40}}}}
    assert dict(watch_rows(broken, None))["canary"] == "P95 3 ms · failed 100.0% · n=40"


class Scripted:
    """A client whose experiment moves on at each look."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.looks = 0

    def get_experiment(self, experiment_id: str) -> dict[str, Any]:
        state = self.states[min(self.looks, len(self.states) - 1)]
        self.looks += 1
        return {**HALF_OPEN, "state": state}

    def latest_event(self, experiment_id: str) -> dict[str, Any] | None:
        return None


def test_watch_ends_with_the_experiment_and_prints_each_change_once() -> None:
    console = Console(record=True, force_terminal=False, width=400)
    client = Scripted(["running", "running", "promoted"])
    slept: list[float] = []
    assert watch(client, "7", interval=0.5, console=console, sleep=slept.append) == "promoted"
    lines = console.export_text().splitlines()
    assert len(lines) == 2 and "state: running" in lines[0] and "state: promoted" in lines[1]
    assert slept == [0.5, 0.5]


def test_the_command_watches_until_the_end(api_url: str, experiment_file: Path) -> None:
    created = runner.invoke(app, ["exp", "create", "-f", str(experiment_file), "--api", api_url,
                                  "--json"])
    assert created.exit_code == 0, created.output
    experiment_id = str(json.loads(created.stdout)["id"])
    for action in ("start", "promote"):
        assert runner.invoke(app, ["exp", action, experiment_id, "--api", api_url,
                                   "--confirm-wait", "0"]).exit_code == 0
    watched = runner.invoke(app, ["exp", "watch", experiment_id, "--api", api_url],
                            env={"COLUMNS": "300"})
    assert watched.exit_code == 0, watched.output
    assert watched.stdout.strip().splitlines()[-1] == f"experiment {experiment_id} promoted"
    assert "state: promoted" in watched.stdout and "canary weight: 100%" in watched.stdout
    missing = runner.invoke(app, ["exp", "watch", "987654", "--api", api_url])
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1
