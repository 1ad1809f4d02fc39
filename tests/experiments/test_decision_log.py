"""The decision log's fields and text line (pure), its trace id, and that a payload
of any shape is logged or reported, never raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from controlplane.experiments.decision_log import (
    current_trace_id,
    decision_fields,
    log_event,
    text_line,
)
from tests.decision.test_rollout import tripped


def fields_of(kind: str, payload: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    given: dict[str, Any] = {
        "kind": kind, "experiment_id": 7, "service": "shop", "actor": "controller",
        "from_state": "closed", "to_state": "open", "reason": "why", "payload": payload,
    }  # fmt: skip
    return decision_fields(**{**given, **overrides})


def test_a_trip_names_its_guardrail_values_and_weights() -> None:
    event = tripped().events[-1]
    fields = fields_of(event.kind, event.payload, reason=event.reason, trace_id="ab" * 16)
    assert (fields["event"], fields["canary_bp_from"], fields["canary_bp_to"]) == (
        "tripped", 100, 0)
    assert (fields["breaker"], fields["trips"], fields["guardrail"]) == ("open", 1, "latency")
    assert fields["values"]["latency"] == {
        "observed": 0.2, "bound": 0.05, "breached": True,
        "p_adjusted": fields["values"]["latency"]["p_adjusted"],
    }  # fmt: skip
    assert fields["values"]["canary"] == {"count": 1000, "percentile_ms": 900.0,
                                          "failure_ratio": 0.0}
    assert "failures" not in fields["values"]  # within its bound: not what decided
    assert text_line(fields) == (
        "event=tripped experiment=7 service=shop actor=controller from=closed to=open "
        "canary_bp=100->0 guardrail=latency latency.observed=0.2 latency.bound=0.05 "
        f"trace_id={'ab' * 16} | {fields['summary']}"
    )


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"action": "pause", "canary_weight_bp": 500}, "canary_bp=500 trace_id=- | "),
        ({}, "trace_id=- | "),
        ({"evidence": "not a mapping"}, "trace_id=- | "),
    ],
)
def test_a_users_action_and_odd_payloads_still_make_one_line(
    payload: dict[str, Any], expected: str
) -> None:
    line = text_line(fields_of("pause", payload, actor="token:alice", reason="a b\nc"))
    assert expected in line and "\n" not in line
    assert line.startswith("event=pause experiment=7 service=shop actor=token:alice ")


def test_the_trace_id_is_the_current_spans_when_tracing_is_on() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("controller.evaluate") as span:
        expected = f"{span.get_span_context().trace_id:032x}"
        assert current_trace_id() == expected
    assert current_trace_id() is None  # no span in force


def test_log_event_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="canary.decisions")

    class Odd(dict[str, Any]):
        def get(self, *_: Any) -> Any:
            raise RuntimeError("a payload of a shape never foreseen")

    log_event(kind="tripped", experiment_id=1, service="shop", actor="controller",
              from_state=None, to_state=None, reason="", payload=Odd())  # fmt: skip
    [record] = caplog.records
    assert record.levelno == logging.ERROR and "not logged" in record.getMessage()
