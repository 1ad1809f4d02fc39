"""One log line per decision and action, where log pipelines look.

Every event the controller or a user commits (a step, a trip, a probe, a promotion,
a rollback, a pause…) is also one record of the `canary.decisions` logger, written
after its commit: which experiment and service, who, from → to (state and canary
weight), the guardrail that decided, its values, the trace id, and the event's
sentence (decision/words.py). In JSON format (kernel/logs.py) the fields are keys
of the line's object; in text they are `key=value` pairs before the sentence:

    … INFO canary.decisions: event=tripped experiment=7 service=checkout
      actor=controller from=closed to=open canary_bp=2500->0 guardrail=latency
      latency.observed=0.4 latency.bound=0.05 trace_id=- | tripped (trip 1 of 3): …

`decision_fields` and `text_line` are pure; `log_event` emits.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from typing import Any, Final

from controlplane.decision.words import event_sentence

log = logging.getLogger("canary.decisions")

# the record attribute kernel/logs.py's JSON formatter spreads into the line
STRUCTURED: Final = "structured"
# evaluations in an event's evidence whose breached guardrails are the values shown
_EVALUATIONS: Final = ("window", "fast_window", "step_gate")


def _plain(value: Any) -> Any:
    """A JSON-safe number or text (NaN and infinities are no JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def decided_guardrails(evidence: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The guardrail that chose the action, and the values of every guardrail over
    its bound in the evaluation that decided (the window, else the fast window, else
    the step gate; the gate's every guardrail when none is over)."""
    for key in _EVALUATIONS:
        evaluation = _mapping(evidence.get(key))
        guardrails = _mapping(evaluation.get("guardrails"))
        over = {n: _mapping(g) for n, g in guardrails.items() if _mapping(g).get("exceeded")}
        if not over and key == "step_gate":
            over = {n: _mapping(g) for n, g in guardrails.items()}
        if not over:
            continue
        values = {
            name: {
                "observed": _plain(g.get("observed")),
                "bound": _plain(g.get("bound")),
                "breached": g.get("breached") is True,
                "p_adjusted": _plain(g.get("p_adjusted")),
            }
            for name, g in over.items()
        }
        variants = _mapping(evaluation.get("variants"))
        for arm in ("canary", "baseline"):
            snap = _mapping(variants.get(arm))
            if snap:
                values[arm] = {
                    "count": snap.get("count"),
                    "percentile_ms": _plain(snap.get("percentile_ms")),
                    "failure_ratio": _plain(snap.get("failure_ratio")),
                }
        chosen = evaluation.get("action_by")
        breached = [n for n, g in over.items() if g.get("breached") is True]
        name = chosen if isinstance(chosen, str) else (breached[0] if breached else None)
        return name, values
    return None, {}


def decision_fields(
    *,
    kind: str,
    experiment_id: int | None,
    service: str,
    actor: str,
    from_state: str | None,
    to_state: str | None,
    reason: str,
    payload: Mapping[str, Any],
    trace_id: str | None = None,
) -> dict[str, Any]:
    """The line's fields (pure): what a log query filters and plots on."""
    evidence = _mapping(payload.get("evidence"))
    weights = _mapping(evidence.get("weights"))
    before, after = weights.get("canary_bp_before"), weights.get("canary_bp_after")
    if after is None and isinstance(payload.get("canary_weight_bp"), int):
        after = payload["canary_weight_bp"]  # a user's action: the weight it left
    guardrail, values = decided_guardrails(evidence)
    breaker = _mapping(evidence.get("breaker"))
    return {
        "event": kind,
        "experiment": experiment_id,
        "service": service,
        "actor": actor,
        "from": from_state,
        "to": to_state,
        "canary_bp_from": before,
        "canary_bp_to": after,
        "breaker": breaker.get("after"),
        "trips": evidence.get("trips"),
        "guardrail": guardrail,
        "values": values,
        "trace_id": trace_id,
        "summary": event_sentence(kind, reason, payload, actor=actor),
        "reason": reason,
    }


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    # one line, and a space never splits a value
    return text.replace("\n", " ").replace(" ", "_") if text else "-"


def text_line(fields: Mapping[str, Any]) -> str:
    """The text form: `key=value` pairs, then the sentence (pure)."""
    parts = [
        f"{key}={_text(fields.get(key))}"
        for key in ("event", "experiment", "service", "actor", "from", "to")
    ]
    before, after = fields.get("canary_bp_from"), fields.get("canary_bp_to")
    if before is not None:
        parts.append(f"canary_bp={_text(before)}->{_text(after)}")
    elif after is not None:
        parts.append(f"canary_bp={_text(after)}")
    if fields.get("guardrail") is not None:
        parts.append(f"guardrail={_text(fields['guardrail'])}")
    for name, value in _mapping(fields.get("values")).items():
        if name in ("canary", "baseline"):
            continue
        value = _mapping(value)
        parts.append(f"{name}.observed={_text(value.get('observed'))}")
        parts.append(f"{name}.bound={_text(value.get('bound'))}")
    parts.append(f"trace_id={_text(fields.get('trace_id'))}")
    summary = " ".join(str(fields.get("summary", "")).splitlines())  # a user's reason
    return " ".join(parts) + f" | {summary}"


def current_trace_id() -> str | None:
    """The trace id of the span in force, when tracing is on. OpenTelemetry is
    imported only when tracing is configured, and never for this (decision 0023)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


def log_event(
    *,
    kind: str,
    experiment_id: int | None,
    service: str,
    actor: str,
    from_state: str | None,
    to_state: str | None,
    reason: str,
    payload: Mapping[str, Any],
) -> None:
    """One line for an event just committed; never raises (a log is no reason for a
    decision to fail)."""
    if not log.isEnabledFor(logging.INFO):
        return
    try:
        fields = decision_fields(
            kind=kind, experiment_id=experiment_id, service=service, actor=actor,
            from_state=from_state, to_state=to_state, reason=reason, payload=payload,
            trace_id=current_trace_id(),
        )  # fmt: skip
        log.info("%s", text_line(fields), extra={STRUCTURED: fields})
    except Exception:  # a payload of a shape this code did not foresee
        log.exception("decision %s of experiment %s not logged", kind, experiment_id)
