"""The experiments' metrics board: what a look sets, how an end is counted, and the
bounds (at most N experiments and services, finished ones expire, drops counted)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from controlplane.controller.experiment_metrics import (
    ExperimentBoard,
    ExperimentSeries,
    ServiceTally,
    board_exposition,
    board_families,
    look_of,
)
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.store import ExperimentRecord, StepRecord
from tests.decision.test_rollout import tripped

AT = datetime(2027, 1, 15, 8, tzinfo=UTC)


def record(experiment_id: int = 1, service: str = "shop", **changes: Any) -> ExperimentRecord:
    base = ExperimentRecord(
        id=experiment_id, name="n", service=service, state=ExperimentState.RUNNING, salt="s",
        baseline_upstream="http://b:1", canary_upstream="http://c:1",
        steps=(StepRecord(0, 500, 60), StepRecord(1, 10000, 60)), sticky_header=None,
        sticky_cookie=None, rule=None, current_step=0, canary_weight_bp=500,
        breaker_state=BreakerState.CLOSED, trips=0, step_started_at=AT,
        breaker_changed_at=None, route_revision=1, rollout_state=None, created_at=AT,
        updated_at=AT, version=1,
    )  # fmt: skip
    return replace(base, **changes)


class Families(Collector):
    def __init__(self, board: ExperimentBoard) -> None:
        self.board = board

    def collect(self) -> Any:
        return board_families(self.board)


def exposition(board: ExperimentBoard) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(board))
    return generate_latest(registry).decode()


def test_a_look_sets_the_verdicts_and_the_variants_numbers() -> None:
    evidence = tripped().evidence
    verdict, guardrails, variants = look_of(evidence)
    assert verdict == "breach" and guardrails == {"latency": 2, "failures": 0}
    assert variants["canary"] == (0.9, 0.0, 1000) and variants["baseline"][0] == 0.2
    assert look_of({"window": {"verdict": "not_evaluated"}}) == (None, {}, {})
    assert look_of({"window": "garbage"}) == (None, {}, {})


def test_the_board_exports_one_series_per_experiment_and_counts_its_end() -> None:
    board = ExperimentBoard()
    board.observe(record(), tripped().evidence, 0.0)
    board.observe(record(trips=1, breaker_state=BreakerState.OPEN, canary_weight_bp=0), None, 1.0)
    text = exposition(board)
    labels = 'experiment="1",service="shop"'
    assert f'canary_experiment_status{{{labels},state="running"}} 1.0' in text
    assert f'canary_experiment_breaker{{{labels},state="open"}} 1.0' in text
    # a look without a fresh window keeps the last verdict
    assert f'canary_experiment_verdict{{{labels},verdict="breach"}} 1.0' in text
    assert (
        'canary_experiment_guardrail_verdict{experiment="1",guardrail="latency",service="shop"}'
        " 2.0" in text
    )
    assert f'canary_experiment_p95_seconds{{{labels},variant="canary"}} 0.9' in text
    assert f"canary_experiment_trips_total{{{labels}}} 1.0" in text
    assert 'canary_service_trips_total{service="shop"} 1.0' in text

    board.finish(record(state=ExperimentState.PROMOTED, canary_weight_bp=10000), 2.0)
    board.finish(record(state=ExperimentState.PROMOTED, canary_weight_bp=10000), 3.0)  # once
    text = exposition(board)
    assert f'canary_experiment_status{{{labels},state="promoted"}} 1.0' in text
    assert 'canary_service_promotions_total{service="shop"} 1.0' in text
    assert board.active_keys() == set()


def test_finished_experiments_expire_and_a_full_board_drops_and_counts() -> None:
    board = ExperimentBoard(max_experiments=2, max_services=1, finished_ttl_sec=60)
    board.observe(record(1), None, 0.0)
    board.observe(record(2, state=ExperimentState.ROLLED_BACK), None, 0.0)  # ended at once
    # full: the finished one makes room for a new running one
    board.observe(record(3), None, 10.0)
    assert set(board.experiments) == {"1", "3"} and board.dropped == 1
    # full of running ones: a fourth has no series, and that is counted
    board.observe(record(4), None, 10.0)
    board.observe(record(4), None, 10.25)  # its next look: counted once
    assert "4" not in board.experiments and board.dropped == 2
    # another service finds no room for its counters
    board.finish(record(3, service="cart", state=ExperimentState.PROMOTED), 20.0)
    assert set(board.services) == {"shop"} and board.dropped == 3
    board.expire(79.0)
    assert "3" in board.experiments
    board.expire(80.0)
    assert set(board.experiments) == {"1"}
    assert "canary_experiment_series_dropped_total 3.0" in exposition(board)


# ------------------------------------------------ the text written directly


_NUMBER = st.one_of(
    st.none(),
    st.floats(min_value=0, max_value=1e22, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1e-9, 0.1, 1 / 3, 123456789.0, 1e16, 2.5e21]),
)
_NAME = st.text(alphabet='ab-_1\\"\n', min_size=1, max_size=6)


@st.composite
def boards(draw: st.DrawFn) -> ExperimentBoard:
    board = ExperimentBoard()
    for index in range(draw(st.integers(0, 6))):
        key = str(draw(st.integers(1, 10**6)))
        board.experiments[key] = ExperimentSeries(
            key, draw(st.sampled_from(["shop", "cart", "a-b"])),
            draw(st.sampled_from(["running", "paused", "promoted"])),
            draw(st.sampled_from(["closed", "open", "half_open"])),
            draw(st.integers(0, 10_000)), draw(st.integers(0, 9)), draw(st.integers(0, 99)),
            verdict=draw(st.one_of(st.none(), st.sampled_from(["pass", "breach"]))),
            guardrails=draw(st.dictionaries(_NAME, st.integers(0, 2), max_size=3)),
            variants=draw(st.dictionaries(
                st.sampled_from(["baseline", "canary"]),
                st.tuples(_NUMBER, _NUMBER, st.one_of(st.none(), st.integers(0, 10**9))),
            )),
            finished_at=None if index % 2 else 1.0,
        )  # fmt: skip
    odd = 'odd"\\'
    for service in draw(st.lists(st.sampled_from(["shop", "cart", odd]), max_size=3)):
        board.services[service] = ServiceTally(*draw(st.tuples(*[st.integers(0, 50)] * 3)))
    board.dropped = draw(st.integers(0, 5))
    return board


@settings(max_examples=200, deadline=None)
@given(boards())
def test_the_text_written_directly_is_what_prometheus_client_renders(
    board: ExperimentBoard,
) -> None:
    assert board_exposition(board) == exposition(board)


def test_the_controller_writes_its_board_on_the_api_page_once() -> None:
    from controlplane.api.metrics import ApiMetrics
    from controlplane.controller.runner import Controller

    controller = Controller(identity="page")
    controller.experiment_board.observe(record(), tripped().evidence, 0.0)
    metrics = ApiMetrics()
    metrics.export(controller)
    page = metrics.render().decode()
    families = [f.name for f in text_string_to_metric_families(page)]
    assert len(families) == len(set(families))  # no family twice, none split
    assert "canary_experiment_status" in families and "canary_controller_leader" in families
    assert page.endswith(board_exposition(controller.experiment_board))
    # written once, by that scrape (no round ran), and counted
    assert 'canary_controller_board_pages_total{by="scrape"} 1.0' in metrics.render().decode()
    assert 'canary_controller_board_pages_total{by="round"} 0.0' in page
