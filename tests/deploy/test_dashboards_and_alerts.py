"""The Grafana dashboard and the Prometheus alert rules in deploy/: well formed, and
every metric they query is one the processes export (read from their registries)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.exported import exported_series, series_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "canary-dashboard.json"
ALERTS = DEPLOY / "prometheus" / "canary-alerts.yaml"
METRIC = re.compile(r"\bcanary_[a-z0-9_]+\b")
DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")
RULE_KEYS = {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return exported_series(tmp_path_factory.mktemp("metrics"))


def metrics_in(expr: str) -> set[str]:
    # label values such as variant="canary" are quoted: drop strings first
    return set(METRIC.findall(re.sub(r'"[^"]*"', '""', expr)))


def balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in re.sub(r'"[^"]*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def test_series_names_follow_the_exposition_types() -> None:
    text = "# TYPE a_total counter\n# TYPE b histogram\n# TYPE c gauge\n"
    assert series_names(text) == {
        "a_total",
        "a_created",
        "b_bucket",
        "b_sum",
        "b_count",
        "b_created",
        "c",
    }


def test_the_exported_names_are_read_from_every_process(exported: set[str]) -> None:
    for prefix in (
        "canary_sidecar_",
        "canary_collector_",
        "canary_controller_",
        "canary_api_",
        "canary_notify_",
    ):
        assert any(name.startswith(prefix) for name in exported), prefix


def dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", ()):
            found.append((panel["title"], target))
    return found


def test_the_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat"}, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_dashboard_query_names_exported_metrics(exported: set[str]) -> None:
    targets = dashboard_targets()
    assert len(targets) >= 20
    for title, target in targets:
        expr = target["expr"]
        named = metrics_in(expr)
        assert named, f"{title}: no canary metric in {expr}"
        assert named <= exported, f"{title}: unknown {sorted(named - exported)}"
        assert balanced(expr), f"{title}: unbalanced {expr}"


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    rules = []
    names = [group["name"] for group in document["groups"]]
    assert len(names) == len(set(names))
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"], group["name"]
        rules.extend(group["rules"])
    return rules


def test_the_alert_rules_are_well_formed() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        name = rule["alert"]
        assert set(rule) <= RULE_KEYS, name
        assert re.fullmatch(r"Canary[A-Za-z]+", name), name
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
        assert balanced(rule["expr"]), name
        if "for" in rule:
            assert DURATION.match(rule["for"]), name
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_the_alerts_the_operators_asked_for_are_there() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert {
        "CanaryTrafficCut",
        "CanarySidecarSamplesDropped",
        "CanaryCollectorRejectsRising",
        "CanaryNoControllerLeader",
        "CanaryReconcilerDrift",
    } <= names


def test_every_alert_names_exported_metrics(exported: set[str]) -> None:
    for rule in alert_rules():
        named = metrics_in(rule["expr"])
        assert named, rule["alert"]
        assert named <= exported, f"{rule['alert']}: unknown {sorted(named - exported)}"


def test_a_misspelt_metric_would_be_caught(exported: set[str]) -> None:
    assert not metrics_in("rate(canary_sidecar_request_total[5m])") <= exported
