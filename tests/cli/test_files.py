"""Experiment and rule files: good ones load, a bad one is one line with file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.client.files import (
    BadFile,
    api_errors_to_file,
    load_experiment,
    load_rule,
    parse_text,
)
from controlplane.kernel.rules import BreakerRule, OverloadPolicy

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"

GOOD_EXPERIMENT = """\
name: checkout v2
service: checkout
variants:
  baseline:
    upstream: http://checkout-v1:8080
  canary:
    upstream: http://checkout-v2:8080
sticky:
  header: x-user-id
steps:
  - weight_pct: 5
    hold_sec: 60
  - weight_pct: 50
    hold_sec: 60
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line(exc: BadFile) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_example_experiment_loads_and_passes_the_api_schema() -> None:
    _, body = load_experiment(EXAMPLES / "experiment.yaml")
    assert body["service"] == "payment-api"
    weights = [step["weight_pct"] for step in body["steps"]]
    assert weights == sorted(weights) and weights[-1] == 100


def test_example_rule_loads_and_names_its_service() -> None:
    _, body = load_rule(EXAMPLES / "rule.yaml")
    assert body["service"] == "payment-api"
    assert body["threshold_ms"] == 800
    assert BreakerRule.model_validate(body).overload is OverloadPolicy.HOLD


def test_json_files_load_like_yaml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"service": "checkout",\n "threshold_ms": 250,\n "percentile": 99}\n',
        "rule.json",
    )
    _, body = load_rule(path)
    assert body == {"service": "checkout", "threshold_ms": 250, "percentile": 99}


@pytest.mark.parametrize(
    ("replace", "by", "expected"),
    [
        (
            "    hold_sec: 60\n  - weight_pct: 50",
            "    hold_sec: 60\n  - weight_pct: 101",
            ":13: steps[1].weight_pct:",
        ),
        (
            "    upstream: http://checkout-v2:8080",
            "    upstream: ftp://checkout-v2",
            ":7: variants.canary.upstream:",
        ),
        (
            "sticky:\n  header: x-user-id",
            "sticky:\n  header: x-user-id\n  colour: red",
            ":10: sticky.colour: unknown field",
        ),
        ("name: checkout v2\n", "", ":1: name: Field required"),
        ("service: checkout", "service: Check Out", ":2: service:"),
        (
            "  - weight_pct: 50",
            "  - weight_pct: 2",
            ":10: steps: weights must increase",
        ),
    ],
    ids=["range", "upstream", "unknown-field", "missing", "pattern", "cross-field"],
)
def test_bad_experiment_is_one_line_with_file_line_and_field(
    tmp_path: Path, replace: str, by: str, expected: str
) -> None:
    assert replace in GOOD_EXPERIMENT
    path = write(tmp_path, GOOD_EXPERIMENT.replace(replace, by))
    with pytest.raises(BadFile) as caught:
        load_experiment(path)
    text = one_line(caught.value)
    assert text.startswith(f"{path}:")
    assert expected in text


def test_inline_rule_errors_point_into_the_rule(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_EXPERIMENT + "rule:\n  threshold_ms: 300\n  percentile: 97\n")
    with pytest.raises(BadFile) as caught:
        load_experiment(path)
    assert ":17: rule.percentile: percentile must be one of" in one_line(caught.value)


def test_several_problems_stay_on_one_line_in_file_order(tmp_path: Path) -> None:
    text = GOOD_EXPERIMENT.replace("weight_pct: 50", "weight_pct: 500").replace(
        "service: checkout", "service: checkout\nowner: me"
    )
    with pytest.raises(BadFile) as caught:
        load_experiment(write(tmp_path, text))
    message = one_line(caught.value)
    assert message.index("owner: unknown field") < message.index("line 14: steps[1].weight_pct")


def test_unknown_rule_field_is_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path, "service: checkout\nthreshold_ms: 250\nthreshhold_ms: 300\n", "rule.yaml"
    )
    with pytest.raises(BadFile) as caught:
        load_rule(path)
    assert one_line(caught.value) == f"{path}:3: threshhold_ms: unknown field"


def test_rule_without_service_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "threshold_ms: 250\n", "rule.yaml")
    with pytest.raises(BadFile, match="service: Field required"):
        load_rule(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: a\nsteps: [1, 2\nservice: b\n", ":3: invalid YAML/JSON:"),
        ('{"name": "a",\n "service": [1,,2]}\n', ":2: invalid YAML/JSON:"),
        ("- a\n- b\n", ":1: expected a mapping, got list"),
        ("", ": file is empty"),
        ("name: a\nservice: b\nname: c\n", ":3: name: duplicate key"),
    ],
    ids=["yaml-syntax", "json-syntax", "not-a-mapping", "empty", "duplicate-key"],
)
def test_unparsable_files_name_the_line(text: str, expected: str) -> None:
    with pytest.raises(BadFile) as caught:
        parse_text(text, "exp.yaml")
    message = one_line(caught.value)
    assert message.startswith("exp.yaml")
    assert expected in message


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadFile) as caught:
        load_experiment(tmp_path / "nope.yaml")
    assert one_line(caught.value) == f"{tmp_path / 'nope.yaml'}: no such file"


def test_api_error_locations_map_back_to_file_lines() -> None:
    source = parse_text(GOOD_EXPERIMENT, "exp.yaml")
    bad = api_errors_to_file(
        source,
        [
            {"loc": ["body", "steps", 1, "hold_sec"], "msg": "too long"},
            {
                "loc": ["body", "sticky", "header"],
                "msg": "Extra inputs are not permitted",
            },
        ],
    )
    assert str(bad) == (
        "exp.yaml:9: sticky.header: unknown field; line 14: steps[1].hold_sec: too long"
    )


def test_union_members_in_a_location_are_skipped() -> None:
    source = parse_text("service: a\nfailure_statuses:\n  - 500\n  - 42\n", "rule.yaml")
    line, path = source.line_of(("failure_statuses", "list[int]", 1))
    assert (line, path) == (4, "failure_statuses[1]")


RULE_WITH_METRICS = """\
service: shop
threshold_ms: 250
action: step_back
metrics:
  - name: error_ratio
    kind: ratio
    query: sum(increase(http_requests_total{app="shop",variant="$variant",code=~"5.."}[$window]))
    total_query: sum(increase(http_requests_total{app="shop",variant="$variant"}[$window]))
    compare: baseline
    margin: 0.01
    action: rollback
  - name: memory
    kind: gauge
    query: max(process_resident_memory_bytes{app="shop",variant="$variant"})
    bound: 512000000
    action: pause
"""


def test_a_rule_file_with_provider_metrics_loads(tmp_path: Path) -> None:
    _, body = load_rule(write(tmp_path, RULE_WITH_METRICS, "rule.yaml"))
    assert [m["name"] for m in body["metrics"]] == ["error_ratio", "memory"]
    assert body["action"] == "step_back"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('variant="$variant"})', "variant=$variant})", "write $variant as a whole label value"),
        ("[$window]))\n    compare", "[$w]))\n    compare", "unknown placeholder $w"),
        ("name: memory", "name: failures", "not latency or failures"),
        ("action: pause", "action: halt", ":16: metrics[1].action: Input should be 'pause'"),
        ("name: memory", "name: error_ratio", "metric names repeat: error_ratio"),
    ],
)
def test_a_bad_metric_is_one_line_naming_the_metric(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    text = RULE_WITH_METRICS.replace(old, new, 1)
    assert text != RULE_WITH_METRICS
    with pytest.raises(BadFile) as caught:
        load_rule(write(tmp_path, text, "rule.yaml"))
    message = one_line(caught.value)
    assert expected in message, message
    assert "metrics" in message
