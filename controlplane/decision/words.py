"""Verdicts in words: one sentence a person reads beside the numbers.

Pure functions of what the decisions store (an event's kind and payload, a rollout's
state): the API, the CLI, the dashboard, the notifications and the decision log all
say the same sentence, for old events as for new ones, since it is derived when read.

    canary P95 407 ms > bound 200 ms over the last 10 s, n=68; baseline P95 88 ms
    canary failures 12.0% (9/75) > bound 5.0% over the last 10 s; baseline 1.1% (1/90)
    holding step 2 of 4 (25%) until 14:03:10Z (in 40 s)

Times are ISO 8601 in UTC (the time of day alone when `now` is the same day) with a
relative part when `now` is known; never epoch seconds. Every number read from a
payload is checked for its type: a payload of an older or foreign shape gives a
shorter sentence, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final

TOTAL_BP: Final = 10_000
# user actions as a sentence's verb (experiments/lifecycle.py LifecycleAction values)
_ACTION_VERBS: Final = {
    "start": "started",
    "pause": "paused",
    "resume": "resumed",
    "promote": "promoted",
    "rollback": "rolled back",
    "abort": "aborted",
}
# the bases of the latency guardrail that compare the canary with a bound in ms
_ABSOLUTE_LATENCY: Final = frozenset({"exact_above_threshold_count", "reported_percentile"})


# ---------------------------------------------------------------- numbers and times


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def ms_text(value: float) -> str:
    """A latency as people say it: 407 ms, 12.5 ms, 0.42 ms, 2.4 s."""
    if value >= 100_000:
        return f"{value / 1000:.0f} s"  # :.3g would write 1.23e+03 s
    if value >= 10_000:
        return f"{value / 1000:.3g} s"
    if value >= 100:
        return f"{value:.0f} ms"
    return f"{value:.3g} ms"


def ratio_text(value: float) -> str:
    """A share as a percentage: 12.0%, 0.05%."""
    pct = value * 100
    return f"{pct:.1f}%" if pct >= 0.1 or pct == 0 else f"{pct:.2g}%"


def weight_text(bp: int) -> str:
    """A weight in basis points as a share of traffic: 25%, 0.5%, 0.01%."""
    return f"{bp / 100:g}%"


def duration_text(seconds: float) -> str:
    """40 s, 3 min, 2 h 5 min, 3 d 4 h: rounded to what a person reads."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


# a held step names the same due time at every look: formatted once
@lru_cache(maxsize=1024)
def iso_time(epoch: float) -> str:
    """ISO 8601 in UTC to the second: 2026-12-06T14:03:10Z."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def relative_text(epoch: float, now: float) -> str:
    delta = epoch - now
    if abs(delta) < 0.5:
        return "now"
    return f"in {duration_text(delta)}" if delta > 0 else f"{duration_text(-delta)} ago"


def when_text(epoch: float, now: float | None = None) -> str:
    """A moment: "14:03:10Z (in 40 s)" on the day of `now`, the full ISO 8601 form on
    another day or without `now`."""
    if now is None:
        return iso_time(epoch)
    same_day = iso_time(epoch)[:10] == iso_time(now)[:10]
    stamp = iso_time(epoch)[11:] if same_day else iso_time(epoch)
    return f"{stamp} ({relative_text(epoch, now)})"


# ---------------------------------------------------------------- guardrails


def _percentile_label(rule: Mapping[str, Any], variant: Mapping[str, Any]) -> str:
    q = _number(rule.get("percentile"))
    label = f"P{q:g}" if q is not None else "percentile"
    if variant.get("latency") == "first_byte" or rule.get("latency") == "first_byte":
        return f"first-byte {label}"
    return label


def _span_text(variant: Mapping[str, Any], span: str | None) -> str:
    """"over the last 10 s" from the window's bounds, or the span given (a step)."""
    if span is not None:
        return f" {span}"
    start, end = _number(variant.get("window_start")), _number(variant.get("window_end"))
    if start is None or end is None or end < start:
        return ""
    return f" over the last {duration_text(end - start)}"


def _sign(guardrail: Mapping[str, Any]) -> str:
    return ">" if guardrail.get("exceeded") is True else "≤"


def _significance_note(guardrail: Mapping[str, Any]) -> str:
    if guardrail.get("exceeded") is True and guardrail.get("breached") is False:
        return " (over, but not significant yet)"
    return ""


def _latency_sentence(
    guardrail: Mapping[str, Any],
    canary: Mapping[str, Any],
    baseline: Mapping[str, Any],
    rule: Mapping[str, Any],
    span: str | None,
) -> str:
    label = _percentile_label(rule, canary)
    value = _number(canary.get("percentile_ms"))
    mine = f"canary {label} {ms_text(value)}" if value is not None else f"canary {label} n/a"
    n = _count(canary.get("count"))
    n_text = f", n={n}" if n is not None else ""
    base = _number(baseline.get("percentile_ms"))
    basis = str(guardrail.get("basis", ""))
    if basis in _ABSOLUTE_LATENCY:
        bound = _number(rule.get("threshold_ms"))
        if bound is None:
            bound = _number(guardrail.get("bound")) if basis == "reported_percentile" else None
        bound_text = f" {_sign(guardrail)} bound {ms_text(bound)}" if bound is not None else ""
        text = f"{mine}{bound_text}{_span_text(canary, span)}{n_text}"
        share = _number(canary.get("above_threshold_fraction"))
        allowed = _number(guardrail.get("bound"))
        if basis == "exact_above_threshold_count" and share is not None and allowed is not None:
            text += f" ({ratio_text(share)} above it, {ratio_text(allowed)} allowed)"
        if base is not None:
            text += f"; baseline {label} {ms_text(base)}"
        return text + _significance_note(guardrail)
    margin = _number(guardrail.get("bound"))
    if basis.startswith("percentile_ratio") and base is not None and margin is not None:
        text = (
            f"{mine} {_sign(guardrail)} {margin:g} × baseline {label} {ms_text(base)}"  # noqa: RUF001
            f"{_span_text(canary, span)}{n_text}"
        )
        return text + _significance_note(guardrail)
    # the judgment knobs (direction, effect: decision/directional.py): their own measure
    observed, bound = _number(guardrail.get("observed")), _number(guardrail.get("bound"))
    measure = basis.replace("_", " ") or "latency"
    text = f"canary latency {measure} {_fmt(observed)} {_sign(guardrail)} bound {_fmt(bound)}"
    text += f"{_span_text(canary, span)}{n_text}"
    if value is not None and base is not None:
        text += f"; canary {label} {ms_text(value)}, baseline {ms_text(base)}"
    return text + _significance_note(guardrail)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _failures_of(variant: Mapping[str, Any]) -> str | None:
    ratio = _number(variant.get("failure_ratio"))
    if ratio is None:
        return None
    failures, count = _count(variant.get("failures")), _count(variant.get("count"))
    counts = f" ({failures}/{count})" if failures is not None and count is not None else ""
    return f"{ratio_text(ratio)}{counts}"


def _failures_sentence(
    guardrail: Mapping[str, Any],
    canary: Mapping[str, Any],
    baseline: Mapping[str, Any],
    span: str | None,
) -> str:
    mine = _failures_of(canary) or ratio_text(_number(guardrail.get("observed")) or 0.0)
    bound = _number(guardrail.get("bound"))
    basis = str(guardrail.get("basis", ""))
    theirs = _failures_of(baseline)
    if basis.startswith("ratio_") and "vs_baseline" in basis and basis != (
        "ratio_and_fisher_vs_baseline"
    ):
        # a directional failures gate: the bound is the baseline's, with its margin
        text = f"canary failures {mine} vs baseline {theirs or 'n/a'}"
        return text + _span_text(canary, span) + _significance_note(guardrail)
    bound_text = f" {_sign(guardrail)} bound {ratio_text(bound)}" if bound is not None else ""
    text = f"canary failures {mine}{bound_text}{_span_text(canary, span)}"
    if theirs is not None:
        text += f"; baseline {theirs}"
    return text + _significance_note(guardrail)


def _metric_sentence(name: str, guardrail: Mapping[str, Any]) -> str:
    metric = _mapping(guardrail.get("metric"))
    status = guardrail.get("status")
    if status not in (None, "judged"):
        note = guardrail.get("note")
        return f"{name}: {note}" if isinstance(note, str) and note else f"{name}: {status}"
    ratio = metric.get("kind") == "ratio"
    observed, bound = _number(guardrail.get("observed")), _number(guardrail.get("bound"))

    def value(v: float | None) -> str:
        if v is None:
            return "n/a"
        return ratio_text(v) if ratio else f"{v:.4g}"

    below = observed is not None and bound is not None and observed < bound
    sign = ("<" if below else ">") if guardrail.get("exceeded") is True else "within"
    if metric.get("compare") == "baseline":
        base = _number(_mapping(metric.get("baseline")).get("value"))
        text = f"{name} {value(observed)} {sign} {value(bound)} (baseline {value(base)})"
    else:
        text = f"{name} {value(observed)} {sign} bound {value(bound)}"
    return text + _significance_note(guardrail)


def guardrail_sentence(
    name: str,
    guardrail: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    rule: Mapping[str, Any],
    *,
    span: str | None = None,
) -> str:
    """One guardrail of an evaluation (breaker.Evaluation.to_dict()) in words.

    `span` replaces "over the last N s" (a step gate judges the step's windows)."""
    variants = _mapping(evaluation.get("variants"))
    canary, baseline = _mapping(variants.get("canary")), _mapping(variants.get("baseline"))
    if guardrail.get("metric") is not None:
        return _metric_sentence(name, guardrail)
    if name == "latency":
        return _latency_sentence(guardrail, canary, baseline, rule, span)
    if name == "failures":
        return _failures_sentence(guardrail, canary, baseline, span)
    return _metric_sentence(name, guardrail)


def evaluation_sentence(
    evaluation: Mapping[str, Any],
    rule: Mapping[str, Any],
    *,
    which: str = "breached",
    span: str | None = None,
) -> str | None:
    """The guardrails of an evaluation in words: those `breached`, those `exceeded`
    (over their bound), or `all`. None when none is."""
    guardrails = _mapping(evaluation.get("guardrails"))
    chosen = [
        (name, _mapping(g))
        for name, g in guardrails.items()
        if which == "all" or _mapping(g).get(which) is True
    ]
    if not chosen:
        return None
    return "; ".join(guardrail_sentence(n, g, evaluation, rule, span=span) for n, g in chosen)


def breach_sentence(evidence: Mapping[str, Any]) -> str | None:
    """What tripped, in words: the breached guardrails of the window, else of the
    fast window, else of the step gate; None when the evidence names no breach."""
    rule = _mapping(evidence.get("rule"))
    for key, span in (("window", None), ("fast_window", None), ("step_gate", "over the step")):
        text = evaluation_sentence(_mapping(evidence.get(key)), rule, span=span)
        if text is not None:
            return text
    return None


def gate_sentence(evidence: Mapping[str, Any]) -> str | None:
    """The step's evidence as a gate judged it (every guardrail), in words."""
    gate = _mapping(evidence.get("step_gate"))
    return evaluation_sentence(gate, _mapping(evidence.get("rule")), which="all",
                               span="over the step")


# ---------------------------------------------------------------- events


def _weights(evidence: Mapping[str, Any]) -> tuple[int | None, int | None]:
    weights = _mapping(evidence.get("weights"))
    return _count(weights.get("canary_bp_before")), _count(weights.get("canary_bp_after"))


def _cooldown_end(evidence: Mapping[str, Any]) -> float | None:
    at, cooldown = _number(evidence.get("at")), _number(
        _mapping(evidence.get("rule")).get("cooldown_sec")
    )
    return at + cooldown if at is not None and cooldown is not None else None


def _trip_sentence(kind: str, evidence: Mapping[str, Any], now: float | None) -> str | None:
    rule = _mapping(evidence.get("rule"))
    trips, max_trips = _count(evidence.get("trips")), _count(rule.get("max_trips"))
    count = "trip" if trips is None else f"trip {trips}"
    if trips is not None and max_trips:
        count += f" of {max_trips}"
    why = breach_sentence(evidence)
    action = _mapping(evidence.get("action"))
    if action.get("by") == "no_data":
        why = "no canary samples (no_data: fail)"
    _, after = _weights(evidence)
    head = {"tripped": "tripped", "probe_failed": "probe failed", "rolled_back": "rolled back"}
    text = f"{head.get(kind, kind)} ({count})"
    if why is not None:
        text += f": {why}"
    if kind == "rolled_back":
        return text + "; all traffic to the baseline"
    if after is not None:
        text += f"; canary cut to {weight_text(after)}"
    if kind == "tripped" and trips is not None and max_trips and trips >= max_trips:
        # the rollout ends on this trip (its rolled_back event follows): no probe comes
        return text + "; that was the last trip allowed: rolled back"
    end = _cooldown_end(evidence)
    if end is not None:
        probe = _count(rule.get("half_open_weight"))
        probe_text = f" at {weight_text(probe)}" if probe is not None else ""
        text += f", probed again{probe_text} from {when_text(end, now)}"
    return text


def event_sentence(
    kind: str,
    reason: str,
    payload: Mapping[str, Any] | None,
    *,
    actor: str = "controller",
    now: float | None = None,
) -> str:
    """An event of the audit trail (experiments/events.py EventKind) in one sentence.

    The controller's decisions are told from their evidence; a user's action is who
    did what and why; the other kinds keep their reason, which is already a sentence.
    """
    payload = _mapping(payload)
    evidence = _mapping(payload.get("evidence"))
    before, after = _weights(evidence)
    if kind in ("tripped", "probe_failed", "rolled_back") and evidence:
        sentence = _trip_sentence(kind, evidence, now)
        if sentence is not None:
            return sentence
    if kind == "started" and after is not None:
        return f"started: {weight_text(after)} of traffic to the canary"
    if kind == "half_open" and after is not None:
        window = _number(_mapping(evidence.get("rule")).get("window_sec"))
        for_text = f" for at least {duration_text(window)}" if window is not None else ""
        return f"cooldown over: probing the canary at {weight_text(after)}{for_text}"
    if kind == "probe_passed" and after is not None:
        step = _count(_mapping(evidence.get("step_index")).get("after"))
        step_text = f" (step {step + 1})" if step is not None else ""
        gate = gate_sentence(evidence)
        tail = f": {gate}" if gate else ""
        return f"probe passed: canary back at {weight_text(after)}{step_text}{tail}"
    if kind == "step_advanced" and after is not None:
        steps = _mapping(evidence.get("step_index"))
        done, now_at = _count(steps.get("before")), _count(steps.get("after"))
        passed = f"step {done + 1} passed" if done is not None else "step passed"
        at = f" (step {now_at + 1})" if now_at is not None else ""
        gate = gate_sentence(evidence)
        tail = f": {gate}" if gate else ""
        from_text = f"{weight_text(before)} → " if before is not None else ""
        return f"{passed}, canary {from_text}{weight_text(after)}{at}{tail}"
    if kind == "promoted" and evidence:
        gate = gate_sentence(evidence)
        tail = f": {gate}" if gate else ""
        return f"promoted: every step passed, all traffic to the canary{tail}"
    if kind in _ACTION_VERBS:
        verb = _ACTION_VERBS[kind]
        # the API's reason when the user gave none says no more than the verb
        given = reason and reason != f"{kind} by {actor}"
        because = f": {reason}" if given else ""
        return f"{verb} by {actor}{because}"
    return reason or kind.replace("_", " ")


# ---------------------------------------------------------------- a rollout now


def status_sentence(
    *,
    state: str,
    breaker: str,
    step_index: int,
    steps: int,
    step_weight_bp: int | None,
    canary_bp: int,
    trips: int,
    max_trips: int | None = None,
    next_at: float | None = None,
    held_reason: str | None = None,
    overload_held: bool = False,
    now: float | None = None,
) -> str:
    """Where a rollout stands, in one sentence: "holding step 2 of 4 (25%) until
    14:03:10Z (in 40 s)", "tripped (trip 1 of 3): canary at 0% until …"."""
    weight = weight_text(canary_bp)
    step = f"step {step_index + 1} of {steps}" if 0 <= step_index < steps else "no step"
    if state == "draft":
        return "draft: not started"
    if state == "promoted":
        return f"promoted: {weight} of traffic to the canary"
    if state == "rolled_back":
        return "rolled back: all traffic to the baseline"
    if state == "aborted":
        return "aborted: all traffic to the baseline"
    if state == "paused":
        return f"paused at {step}, canary at {weight}, until someone resumes it"
    until = f" until {when_text(next_at, now)}" if next_at is not None else ""
    trips_text = f"trip {trips} of {max_trips}" if max_trips else f"trip {trips}"
    if breaker == "open":
        return f"tripped ({trips_text}): canary at {weight}, cooling down{until}"
    if breaker == "half_open":
        return f"probing the canary at {weight} ({trips_text}){until}"
    planned = f" ({weight_text(step_weight_bp)})" if step_weight_bp is not None else ""
    if held_reason:
        return f"holding {step}{planned}: {held_reason}"
    if overload_held:
        return f"holding {step}{planned}: the baseline's sidecars shed requests (overload: hold)"
    if next_at is not None and now is not None and next_at <= now:
        return f"{step}{planned} due since {when_text(next_at, now)}: waiting for its evidence"
    return f"holding {step}{planned}{until}"
