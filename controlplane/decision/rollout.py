"""The rollout: breaker and step schedule as one pure function.

    decide(state, snapshots, rule, steps, now, fast=None) -> Decision

No I/O and no clock: `now` and the snapshots come in, the new state and the effects
to apply go out. The controller calls it on every fresh snapshot and no later than
`decision.next_check_at`.

Breaker (architecture §7)::

    closed ──trip──► open ──cooldown──► half_open ──probe passes──► closed
                      ▲                    │
                      └────probe fails─────┘        the max_trips-th trip: rolled back

A trip needs `rule.consecutive_breaches` breached evaluations in a row, each on a
snapshot not judged before (a newer `ts`). A look is breached when the rule's window
or the optional fast window (the last `fast_window_sec(window_sec)` seconds, merged
from the same per-second data) breaches. Each look holds its tests to a share of
`rule.alpha` (`look_alphas`, docs/decisions/0003-false-alarm-control.md): the rule's
alpha is the false-alarm budget of a whole step, split evenly over the step's looks
at both window lengths. A step advances only
while closed, after its `hold_sec`, once the disjoint windows of the step hold
`min_samples` canary samples and their merged evidence is within every bound.

Overload (docs/decisions/0025-overload-and-judgment.md): under `overload: hold` a
look whose baseline window holds shed requests is `overloaded`: no test runs (no
alpha spent), the breach streak restarts, the window adds nothing to the step's
evidence or to the sample-ratio counts (the shed requests are missing from the
baseline's count), the no-data timer does not run and neither a step nor a probe
completes while it lasts. `overload_hold` / `overload_cleared` mark its edges.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from controlplane.decision import gate_deadline
from controlplane.decision.breaker import (
    Evaluation,
    Guardrail,
    Verdict,
    evaluate,
    overloaded,
    unit_evidence,
)
from controlplane.decision.graded import (
    MetricLook,
    TripCall,
    cleared,
    held_text,
    observe_metrics,
    trip_candidate,
)
from controlplane.decision.metric_guardrails import no_data_names
from controlplane.decision.model import (
    Decision,
    MetricNoDataPeriod,
    Promote,
    RecordEvent,
    Rollback,
    RolloutEffect,
    RolloutState,
    SetCanaryWeight,
    Step,
    transition,
)
from controlplane.decision.ramp_split import RampSplit
from controlplane.decision.stats import SrmResult, UnitSrm, sample_ratio_mismatch, unit_split
from controlplane.decision.tally import SrmTally, Tally
from controlplane.decision.words import duration_text, iso_time
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.kernel.metric_specs import GuardrailAction, MetricNoData
from controlplane.kernel.routes import BASELINE, CANARY, TOTAL_WEIGHT, RouteState
from controlplane.kernel.rules import (
    BreakerRule,
    NoDataPolicy,
    OverloadPolicy,
    SrmPolicy,
)
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.units import DISTINCT_K
from controlplane.providers.evidence import MetricEvidence

# sidecars apply a new route as soon as their watch delivers it (architecture §4), well
# within a second; the split is judged after that
ROUTE_SETTLE_SEC = 1.0
# when only new samples can change the outcome, look again at least this often
RECHECK_SEC = 1.0
# the fast window: a fifth of the rule's window, at least this long
FAST_WINDOW_DIVISOR = 5
MIN_FAST_WINDOW_SEC = 2
# a step's false-alarm budget covers at most this much of its hold; a longer hold
# spends `rule.alpha` again per this many seconds rather than growing ever less sensitive
MAX_BUDGET_HORIZON_SEC = 600.0
# the budget is split over one look per this interval: the controller's tick
# (controlplane/controller/runner.py), at most one look per fresh snapshot
LOOK_INTERVAL_SEC = 0.25
# on clustered evidence a step gate is held by an exceedance only at this significance
GATE_CLUSTERED_P = 0.05


def fast_window_sec(window_sec: int) -> int | None:
    """The fast window's length for a rule's window, or None when it would not be shorter."""
    fast = max(MIN_FAST_WINDOW_SEC, window_sec // FAST_WINDOW_DIVISOR)
    return fast if fast < window_sec else None


def look_alphas(
    state: RolloutState, rule: BreakerRule, steps: Sequence[Step], *, fast: bool
) -> tuple[float, float | None]:
    """Per-look significance for the rule's window and the fast window.

    The step (or the probe) gets `rule.alpha` as its false-alarm budget, split in
    half between the two window lengths when a fast window is judged, and each half
    Bonferroni-split over the looks in the step's horizon (its hold, or the probe's
    window), one per `LOOK_INTERVAL_SEC`. Bonferroni over the looks holds whatever
    the correlation between them; splitting over the disjoint windows only
    (horizon / window) does not bound a sliding window's maximum, which crosses a
    level far more often than one window does (a scan statistic).
    """
    if state.breaker is BreakerState.HALF_OPEN:
        horizon = float(rule.window_sec)
    else:
        horizon = steps[min(state.step_index, len(steps) - 1)].hold_sec
    horizon = min(max(horizon, float(rule.window_sec)), MAX_BUDGET_HORIZON_SEC)
    fast_sec = fast_window_sec(rule.window_sec) if fast else None
    share = rule.alpha / 2 if fast_sec is not None else rule.alpha
    per_look = share / math.ceil(horizon / LOOK_INTERVAL_SEC - 1e-9)
    return per_look, per_look if fast_sec is not None else None


@dataclass(frozen=True)
class _Look:
    """What this call saw: the snapshots it may use and its own evaluation of them."""

    canary: WindowSnapshot | None
    baseline: WindowSnapshot | None
    fresh: bool
    stale_note: str | None
    evaluation: Evaluation | None
    srm: SrmResult | None
    srm_changed: bool
    fast_evaluation: Evaluation | None = None
    alphas: tuple[float, float | None] | None = None
    srm_units: UnitSrm | None = None  # set when the split was judged on units
    ramp: RampSplit | None = None  # the split across the whole ramp, on units
    overloaded: bool = False  # this look was held: the baseline shed (overload: hold)
    overload_changed: bool = False  # ... and the last fresh look was not, or the reverse
    metrics: MetricLook | None = None  # the provider metrics' bookkeeping (graded.py)

    @property
    def breached(self) -> bool:
        return any(e is not None and e.breached for e in (self.evaluation, self.fast_evaluation))

    def breach_reason(self) -> str:
        parts = []
        if self.evaluation is not None and self.evaluation.breached:
            parts.append(f"window: {self.evaluation.reason}")
        if self.fast_evaluation is not None and self.fast_evaluation.breached:
            parts.append(f"fast window: {self.fast_evaluation.reason}")
        if parts:
            return "; ".join(parts)
        if self.evaluation is not None:
            return self.evaluation.reason
        return "no new snapshot"


def start(steps: Sequence[Step], now: float) -> Decision:
    """A draft experiment starts: closed breaker, the first step's weight."""
    _check_steps(steps)
    bp = steps[0].weight_bp
    state = RolloutState(
        status=transition(ExperimentState.DRAFT, ExperimentState.RUNNING),
        breaker=BreakerState.CLOSED,
        step_index=0,
        step_started_at=now,
        canary_bp=bp,
        weight_since=now,
        tally=Tally.starting(now),
    )
    reason = f"started at step 1 of {len(steps)}: canary {bp} bp"
    evidence = {"at": now, "weights": {"canary_bp_before": 0, "canary_bp_after": bp}}
    effects: tuple[RolloutEffect, ...] = (
        SetCanaryWeight(bp, RouteState.RUNNING),
        RecordEvent(EventKind.STARTED, reason, _payload("draft", "running", evidence)),
    )
    return Decision(state, effects, reason, evidence, now + steps[0].hold_sec)


def decide(
    state: RolloutState,
    snapshots: Mapping[str, WindowSnapshot],
    rule: BreakerRule,
    steps: Sequence[Step],
    now: float,
    fast: Mapping[str, WindowSnapshot] | None = None,
    metrics: Mapping[str, MetricEvidence] | None = None,
) -> Decision:
    """The next step of one experiment's rollout, from its state and latest snapshots.

    `fast`, when given, is the same data over the last `fast_window_sec(window_sec)`
    seconds: judged alongside the rule's window so that a fresh breach is not diluted
    by the older samples of a long window.

    `metrics` is the latest evidence of the rule's provider metrics by name (empty:
    nothing read yet); None when no metrics provider is configured, so a rule with
    metrics is judged under each metric's no-data policy.
    """
    _check_steps(steps)
    if state.status is not ExperimentState.RUNNING:
        # paused or finished: whatever the API set stays in force
        reason = f"experiment is {state.status.value}: no action"
        return Decision(state, (), reason, {"at": now, "status": state.status.value}, None)
    if state.breaker is BreakerState.OPEN:
        return _while_open(state, rule, now)
    state, look = _observe(state, snapshots, fast, rule, steps, now, metrics)
    if state.breaker is BreakerState.HALF_OPEN:
        return _while_half_open(state, look, rule, steps, now)
    return _while_closed(state, look, rule, steps, now)


# ---------------------------------------------------------------- observation


def _observe(
    state: RolloutState,
    snapshots: Mapping[str, WindowSnapshot],
    fast: Mapping[str, WindowSnapshot] | None,
    rule: BreakerRule,
    steps: Sequence[Step],
    now: float,
    metrics: Mapping[str, MetricEvidence] | None = None,
) -> tuple[RolloutState, _Look]:
    canary, baseline = snapshots.get(CANARY), snapshots.get(BASELINE)
    metric_look = MetricLook(metrics or {}, frozenset(), metrics is not None)
    if rule.metrics:
        state, metric_look = _metric_clock(state, rule, metrics, now)
    expired = metric_look.expired
    stale_note = None
    if canary is not None and now - canary.ts > rule.window_sec:
        # a snapshot older than its window says nothing about the present
        stale_note = f"canary snapshot is {now - canary.ts:.1f}s old: treated as no data"
        canary = None
    fresh = canary is not None and (
        state.last_snapshot_ts is None or canary.ts > state.last_snapshot_ts
    )
    # what the rule judges: a first_byte rule has no data without first-byte samples
    # (`_value_` here and below: an enum's value read per look without the `value`
    # descriptor's call)
    latency: str = rule.latency._value_
    judged = canary.for_latency(latency) if canary is not None else None
    # the service answers, only not every request: no-data does not run while held
    held = (
        fresh
        and rule.overload is OverloadPolicy.HOLD
        and baseline is not None
        and baseline.shed > 0
    )
    still_held = canary is not None and not fresh and state.overload_held
    has_data = (judged is not None and judged.count > 0) or held or still_held
    no_data_since = (
        None if has_data else (state.no_data_since if state.no_data_since is not None else now)
    )
    changes: dict[str, Any] = {
        "no_data_since": no_data_since,
        # announced once per period: a period that ended (or never began) starts afresh
        "no_data_reported": state.no_data_reported
        and state.no_data_since is not None
        and not has_data,
    }
    evaluation: Evaluation | None = None
    fast_evaluation: Evaluation | None = None
    alphas: tuple[float, float | None] | None = None
    srm: SrmResult | None = None
    srm_units: UnitSrm | None = None
    ramp: RampSplit | None = state.ramp_split
    srm_changed = False
    if fresh and canary is not None:
        changes["overload_held"] = held
        changes["last_snapshot_ts"] = canary.ts
    if held and canary is not None and baseline is not None:
        evaluation = overloaded(canary, baseline, rule)
        changes["consecutive_breaches"] = 0
    elif fresh and canary is not None:
        fast_canary = fast.get(CANARY) if fast is not None else None
        if fast_canary is not None and now - fast_canary.ts > rule.window_sec:
            fast_canary = None
        alphas = look_alphas(state, rule, steps, fast=fast_canary is not None)
        evaluation = evaluate(
            canary,
            baseline,
            rule,
            alpha=alphas[0],
            metrics=metrics if metrics is not None else {},
            metrics_expired=expired,
            provider=metrics is not None,
        )
        counts = _samples_breached(evaluation) and _judges_current_weight(state, canary)
        judged_samples = _samples_judged(evaluation)
        if fast_canary is not None and alphas[1] is not None:
            assert fast is not None
            # the provider metrics are judged once per look, with the rule's window
            fast_evaluation = evaluate(
                fast_canary, fast.get(BASELINE), rule, alpha=alphas[1], with_metrics=False
            )
            counts = counts or (
                fast_evaluation.breached and _judges_current_weight(state, fast_canary)
            )
            judged_samples = judged_samples or _samples_judged(fast_evaluation)
        changes["consecutive_breaches"] = state.consecutive_breaches + 1 if counts else 0
        if rule.metrics or rule.action is GuardrailAction.PAUSE:
            changes["samples_clean"] = (
                0 if counts else state.samples_clean + 1 if judged_samples else state.samples_clean
            )
        if judged is not None and judged.count > 0:
            judged_baseline = baseline.for_latency(latency) if baseline is not None else None
            changes["tally"] = state.tally.add(judged, judged_baseline)
        srm_tally, srm, srm_units, ramp = _srm_check(state, canary, baseline)
        changes["srm_tally"] = srm_tally
    if ramp is not None and _step_due(state, steps, now):
        # a planned look of the loss test: the end of a step of the schedule
        ramp = ramp.judge_loss(state.step_index, len(steps))
    if (fresh and canary is not None) or ramp is not state.ramp_split:
        changes["ramp_split"] = ramp
        verdict_now = _srm_verdict(srm, srm_units, ramp)
        if verdict_now is not None:
            changes["srm_flagged"] = verdict_now
        srm_changed = verdict_now is not None and verdict_now != state.srm_flagged
    overload_changed = fresh and canary is not None and held != state.overload_held
    state = state.with_changes(**changes)
    if rule.metrics or rule.action is GuardrailAction.PAUSE:
        state, metric_look = observe_metrics(
            state, evaluation if not held else None, rule, now, metric_look
        )
    look = _Look(
        canary,
        baseline,
        fresh,
        stale_note,
        evaluation,
        srm,
        srm_changed,
        fast_evaluation,
        alphas,
        srm_units,
        ramp,
        held,
        overload_changed,
        metric_look,
    )
    return state, look


def _samples_breached(evaluation: Evaluation) -> bool:
    """Whether latency or failures breached: the breaker's streak (the provider
    metrics keep streaks of their own, one count per reading)."""
    if not any(g.metric is not None for g in evaluation.guardrails):
        return evaluation.breached
    return any(g.breached for g in evaluation.guardrails if g.metric is None)


def _samples_judged(evaluation: Evaluation) -> bool:
    return any(g.metric is None for g in evaluation.guardrails)


def _metric_clock(
    state: RolloutState,
    rule: BreakerRule,
    metrics: Mapping[str, MetricEvidence] | None,
    now: float,
) -> tuple[RolloutState, MetricLook]:
    """Each provider metric's no-data period: begun, going on or over; the metrics
    whose hold has outlasted its no_data_timeout_sec (judged without them); a
    `no_data` event when a period begins and when its hold times out."""
    provider = metrics is not None
    missing = no_data_names(rule.metrics, metrics or {}, provider=provider)
    periods = {}
    events: list[RecordEvent] = []
    for spec in rule.metrics:
        why = missing.get(spec.name)
        if why is None:
            continue
        before = state.metric_no_data.get(spec.name)
        period = (
            MetricNoDataPeriod(now, why)
            if before is None
            else MetricNoDataPeriod(before.since, why, before.expired_reported)
        )
        data = {
            "at": now,
            "metric": spec.name,
            "reason": why,
            "policy": spec.no_data.value,
            "no_data_since": period.since,
            "no_data_timeout_sec": spec.no_data_timeout_sec,
            "queries": list(metrics[spec.name].queries)
            if metrics is not None and spec.name in metrics
            else [],
            "canary_bp": state.canary_bp,
        }
        timed_out = now - period.since >= spec.no_data_timeout_sec
        if before is None:
            then = (
                "the step waits for it (no_data: hold) until "
                f"no_data_timeout_sec {spec.no_data_timeout_sec:g}"
                if spec.no_data is MetricNoData.HOLD and not timed_out
                else "judged without it (no_data: ignore)"
                if spec.no_data is MetricNoData.IGNORE
                else "judged without it"
            )
            reason = f"{spec.name}: no data ({why}); never a breach: {then}"
            events.append(RecordEvent(EventKind.NO_DATA, reason, data))
        if (
            timed_out
            and spec.no_data is MetricNoData.HOLD
            and not period.expired_reported
            and (before is not None)
        ):
            reason = (
                f"{spec.name}: no data for {now - period.since:.1f}s ({why}): "
                f"no_data_timeout_sec {spec.no_data_timeout_sec:g} over, judged without it"
            )
            events.append(RecordEvent(EventKind.NO_DATA, reason, data))
            period = MetricNoDataPeriod(period.since, why, True)
        periods[spec.name] = period
    timeouts = {m.name: m.no_data_timeout_sec for m in rule.metrics}
    expired = frozenset(n for n, p in periods.items() if now - p.since >= timeouts[n])
    if periods != dict(state.metric_no_data):
        state = state.with_changes(metric_no_data=periods)
    return state, MetricLook(metrics or {}, expired, provider, tuple(events))


def _step_due(state: RolloutState, steps: Sequence[Step], now: float) -> bool:
    """The current step's hold is over: its gate (and the loss test) look now."""
    if state.breaker is not BreakerState.CLOSED or not 0 <= state.step_index < len(steps):
        return False
    return now >= state.step_started_at + steps[state.step_index].hold_sec


def _judges_current_weight(state: RolloutState, canary: WindowSnapshot) -> bool:
    # a probe is judged on its own samples only: the window may still hold the
    # samples that tripped the breaker
    if state.breaker is BreakerState.HALF_OPEN:
        return canary.window_start >= state.weight_since - 1e-6
    return True


def _srm_check(
    state: RolloutState, canary: WindowSnapshot, baseline: WindowSnapshot | None
) -> tuple[SrmTally | None, SrmResult | None, UnitSrm | None, RampSplit | None]:
    """The assignment counts at this weight, and a verdict when a new window adds to them.

    Only disjoint windows that start after the route settled are added up (a window
    that straddles a weight change mixes two splits), and the sum is judged with an
    always-valid test, so judging it again at every new window does not inflate
    the false-warning rate.

    When both arms' windows carry their distinct units, the split is judged on units
    (the returned UnitSrm decides; the request counts are evidence only): the route
    assigns units, not requests, and one heavy unit moves the request split by its
    whole weight. Within a step every unit, new or seen at an earlier weight, is in
    the canary with probability canary_bp / 10,000 (its bucket is uniform and
    independent of when it is active), so the per-step count is binomial however the
    ramp went; only windows straddling the change mix two weights, and those are
    not counted (docs/decisions/0012-cluster-robust-judgment.md).
    """
    tally = state.srm_tally
    ramp = state.ramp_split
    if tally is None or tally.since != state.weight_since:
        tally = SrmTally.starting(state.weight_since, state.weight_since + ROUTE_SETTLE_SEC)
    if not tally.accepts(canary.window_start):
        return tally, None, None, ramp
    seconds = canary.window_end - canary.window_start
    if baseline is None or not 0 < state.canary_bp < TOTAL_WEIGHT:
        # every unit's arm is known: no split to judge, but where the followed units
        # are seen (and where not) is what the loss test needs, at 100% most of all
        if ramp is not None and canary.units is not None:
            tally = tally.add(0, canary.count, canary.window_end)
            none = np.zeros(0, dtype=np.uint32)
            base = none if baseline is None or baseline.units is None else baseline.units.distinct
            ramp = ramp.observe(base, canary.units.distinct, state.canary_bp, seconds=seconds)
        return tally, None, None, ramp
    tally = tally.add(
        baseline.count, canary.count, canary.window_end, (baseline.units, canary.units)
    )
    requests = sample_ratio_mismatch(tally.baseline, tally.canary, state.canary_bp)
    units = None
    if tally.has_units and tally.baseline_units is not None and tally.canary_units is not None:
        units = unit_split(
            tally.baseline_units, tally.canary_units, state.canary_bp, full=DISTINCT_K
        )
    if baseline.units is not None and canary.units is not None:
        ramp = (ramp if ramp is not None else RampSplit()).observe(
            baseline.units.distinct, canary.units.distinct, state.canary_bp, seconds=seconds
        )
    return tally, requests, units, ramp


def _srm_verdict(
    requests: SrmResult | None, units: UnitSrm | None, ramp: RampSplit | None
) -> bool | None:
    """Whether the split is out of balance now; None when nothing could be judged.

    On units, either the step's own split or the whole ramp's (decision/ramp_split.py:
    the always-valid test, or the loss test at a step's end) decides; a rejection
    across the ramp stands for the rest of the rollout. Without units, the request
    counts of 0003 decide.
    """
    judged = ramp is not None and (ramp.events > 0 or ramp.loss is not None)
    across = ramp.mismatch if ramp is not None and judged else None
    if units is None and not across:
        return requests.mismatch if requests is not None else None
    step = units.result.mismatch if units is not None and units.result is not None else None
    if step is None and across is None:
        return None
    return bool(step) or bool(across)


# ---------------------------------------------------------------- per breaker state


def _while_open(state: RolloutState, rule: BreakerRule, now: float) -> Decision:
    assert state.opened_at is not None
    probe_at = state.opened_at + rule.cooldown_sec
    evidence = _evidence(state, state, rule, now, None)
    if now < probe_at:
        left = duration_text(probe_at - now)
        reason = f"open: cooling down until {iso_time(probe_at)} ({left} left)"
        return Decision(state, (), reason, evidence, probe_at)
    new = state.with_changes(
        breaker=transition(state.breaker, BreakerState.HALF_OPEN),
        canary_bp=rule.half_open_weight,
        weight_since=now,
        probe_started_at=now,
        consecutive_breaches=0,
        no_data_since=None,
        tally=Tally.starting(now),
    )
    evidence = _evidence(state, new, rule, now, None)
    reason = f"cooldown of {rule.cooldown_sec:g}s over: probing at {rule.half_open_weight} bp"
    effects: tuple[RolloutEffect, ...] = (
        SetCanaryWeight(rule.half_open_weight, RouteState.HALF_OPEN),
        RecordEvent(EventKind.HALF_OPEN, reason, _payload("open", "half_open", evidence)),
    )
    return Decision(new, effects, reason, evidence, now + rule.window_sec)


def _while_closed(
    state: RolloutState, look: _Look, rule: BreakerRule, steps: Sequence[Step], now: float
) -> Decision:
    state, no_data = _no_data_events(state, rule, now)
    srm_events = (
        *_srm_events(state, look, rule, now),
        *no_data,
        *_overload_events(state, look, rule, now),
        *(look.metrics.events if look.metrics is not None else ()),
    )
    tripped = _trip_reason(state, look, rule, now)
    if tripped is not None:
        return _act(state, look, rule, steps, now, tripped, srm_events)

    step = steps[state.step_index]
    due = state.step_started_at + step.hold_sec
    gate: Evaluation | None = None
    if state.overload_held:
        reason = (
            f"holding step {state.step_index + 1} (due at {iso_time(due)}): the baseline is "
            "shedding requests (overload: hold)"
        )
    elif state.held_by:
        reason = f"holding step {state.step_index + 1} at {state.canary_bp} bp: " + held_text(state)
    elif now < due:
        reason = f"holding step {state.step_index + 1}: due at {iso_time(due)}"
    elif state.consecutive_breaches:
        reason = (
            f"step due, but the last evaluation breached ({state.consecutive_breaches} in a row)"
        )
    elif (
        short := gate_deadline.short_of_samples(rule, state.tally, now - due, step.hold_sec)
    ).wait:
        reason = (
            f"step due, but it has seen {state.tally.canary.count} canary samples "
            f"of min_samples {rule.min_samples}{short.note}"
        )
    elif rule.srm is SrmPolicy.HOLD and state.srm_flagged:
        reason = "step due, but held: sample ratio mismatch and the rule says hold"
    else:
        gate = _gate(state, short.rule, look)
        # a gate held on units is judged on what it has after a bounded wait (0050)
        holding = tuple(g for g in gate.guardrails if _holds_gate(g))
        late = gate_deadline.resolve(gate, holding, now - due, step.hold_sec, rule.alpha)
        # a rule whose action is pause keeps holding at the deadline: a breach there
        # is what its pause is for, and a person resumes or acts
        trip_late = late.trip and rule.action is not GuardrailAction.PAUSE
        if _gate_passes(gate) or late.advance or trip_late:
            note = short.note + (late.note or gate.reason)
            gate = replace(gate, reason=note) if short.note or late.note else gate
            if trip_late:
                call = TripCall(rule.action, "step gate", late.note)
                return _act(state, look, rule, steps, now, call, srm_events, gate)
            return _advance(state, look, rule, steps, now, gate, srm_events)
        # a pausing rule's breach is named after the gate's reason, as a hold's note is
        held = f"; {late.note}" if late.trip else late.note
        reason = f"step due, but the step's evidence does not pass: {gate.reason}{held}"

    return _hold(state, look, rule, now, gate, reason, srm_events, until=due)


def _while_half_open(
    state: RolloutState, look: _Look, rule: BreakerRule, steps: Sequence[Step], now: float
) -> Decision:
    state, no_data = _no_data_events(state, rule, now)
    srm_events = (
        *_srm_events(state, look, rule, now),
        *no_data,
        *_overload_events(state, look, rule, now),
        *(look.metrics.events if look.metrics is not None else ()),
    )
    tripped = _trip_reason(state, look, rule, now)
    if tripped is not None:
        call = TripCall(tripped.action, tripped.by, "probe failed: " + tripped.reason)
        return _act(state, look, rule, steps, now, call, srm_events)

    assert state.probe_started_at is not None
    probe_end = state.probe_started_at + rule.window_sec
    gate: Evaluation | None = None
    if state.overload_held:
        reason = (
            f"probing at {state.canary_bp} bp (until {iso_time(probe_end)}), held: the baseline "
            "is shedding requests (overload: hold)"
        )
    elif state.held_by:
        reason = f"probing at {state.canary_bp} bp, " + held_text(state)
    elif now < probe_end:
        reason = f"probing at {state.canary_bp} bp until {iso_time(probe_end)}"
    elif state.tally.canary.count < rule.min_samples:
        reason = (
            f"probe window over, but it has seen {state.tally.canary.count} canary samples "
            f"of min_samples {rule.min_samples}"
        )
    else:
        gate = _gate(state, rule, look)
        if gate.breached and gate.action is not GuardrailAction.PAUSE:
            call = TripCall(
                gate.action or rule.action, gate.action_by or "", "probe failed: " + gate.reason
            )
            return _act(state, look, rule, steps, now, call, srm_events, gate)
        if _gate_passes(gate):
            return _close(state, look, rule, steps, now, gate, srm_events)
        reason = f"probe inconclusive, gathering more samples: {gate.reason}"

    return _hold(state, look, rule, now, gate, reason, srm_events, until=probe_end)


# ---------------------------------------------------------------- transitions


def _hold(
    state: RolloutState,
    look: _Look,
    rule: BreakerRule,
    now: float,
    gate: Evaluation | None,
    reason: str,
    srm_events: tuple[RolloutEffect, ...],
    *,
    until: float,
) -> Decision:
    """No move now: look again when `until` comes, or new data may change the outcome
    (and by the no-data deadline when the rule fails on no data)."""
    evidence = _evidence(state, state, rule, now, look, gate=gate, units=bool(srm_events))
    candidates = [until] if now < until else [_next_data_at(state, rule, now)]
    if state.no_data_since is not None and (
        rule.no_data is NoDataPolicy.FAIL or not state.no_data_reported
    ):
        # a trip (no_data: fail), or the no_data event, falls due then
        candidates.append(state.no_data_since + rule.no_data_timeout_sec)
    timeouts = {m.name: m.no_data_timeout_sec for m in rule.metrics}
    for name, period in state.metric_no_data.items():
        if name in timeouts and not period.expired_reported and period.since + timeouts[name] > now:
            # a provider metric's hold ends then: the step is judged without it
            candidates.append(period.since + timeouts[name])
    return Decision(state, srm_events, reason, evidence, min(candidates))


def _trip_reason(
    state: RolloutState, look: _Look, rule: BreakerRule, now: float
) -> TripCall | None:
    """What calls for a trip (or a rollback) now, and which guardrail chose it."""
    if (
        rule.no_data is NoDataPolicy.FAIL
        and state.no_data_since is not None
        and now - state.no_data_since >= rule.no_data_timeout_sec
    ):
        reason = f"no canary samples for {now - state.no_data_since:.1f}s (no_data: fail)"
        action = GuardrailAction.STOP if rule.action is GuardrailAction.PAUSE else rule.action
        return TripCall(action, "no_data", reason)
    if not rule.metrics and rule.action is not GuardrailAction.PAUSE:
        if state.consecutive_breaches >= rule.consecutive_breaches:
            reason = (
                f"{state.consecutive_breaches} breached evaluations in a row; "
                f"{look.breach_reason()}"
            )
            return TripCall(rule.action, "", reason)
        return None
    return trip_candidate(state, look.evaluation, rule, look.breach_reason())


def _act(
    state: RolloutState,
    look: _Look,
    rule: BreakerRule,
    steps: Sequence[Step],
    now: float,
    call: TripCall,
    extra: tuple[RolloutEffect, ...],
    gate: Evaluation | None = None,
) -> Decision:
    """A breach's action: rolled back at once, or the breaker's trip (stop, step_back)."""
    if call.action is GuardrailAction.ROLLBACK:
        return _roll_back_now(state, look, rule, now, call, extra, gate)
    return _trip(state, look, rule, steps, now, call.reason, extra, gate, call)


def _roll_back_now(
    state: RolloutState,
    look: _Look,
    rule: BreakerRule,
    now: float,
    call: TripCall,
    extra: tuple[RolloutEffect, ...],
    gate: Evaluation | None,
) -> Decision:
    """A guardrail whose action is rollback: the canary is rolled back for good, no
    cooldown and no probe (the breaker opens, as after the last trip)."""
    new = state.with_changes(
        status=transition(state.status, ExperimentState.ROLLED_BACK),
        breaker=transition(state.breaker, BreakerState.OPEN),
        canary_bp=0,
        opened_at=now,
        probe_started_at=None,
        weight_since=now,
        consecutive_breaches=0,
        no_data_since=None,
        tally=Tally.starting(now),
        **cleared(),
    )
    evidence = _evidence(state, new, rule, now, look, gate=gate)
    evidence["action"] = {"action": call.action.value, "by": call.by}
    why = f"rolled back at once ({call.by}: action rollback); {call.reason}"
    effects: tuple[RolloutEffect, ...] = (
        *extra,
        SetCanaryWeight(0, RouteState.ROLLED_BACK),
        Rollback(),
        RecordEvent(EventKind.ROLLED_BACK, why, _payload("running", "rolled_back", evidence)),
    )
    return Decision(new, effects, why, evidence, None)


def _trip(
    state: RolloutState,
    look: _Look,
    rule: BreakerRule,
    steps: Sequence[Step],
    now: float,
    reason: str,
    extra: tuple[RolloutEffect, ...],
    gate: Evaluation | None = None,
    call: TripCall | None = None,
) -> Decision:
    action = call.action if call is not None else rule.action
    trips = state.trips + 1
    from_state = state.breaker.value
    breaker = transition(state.breaker, BreakerState.OPEN)
    common: dict[str, Any] = {
        "breaker": breaker,
        "trips": trips,
        "opened_at": now,
        "probe_started_at": None,
        "weight_since": now,
        "consecutive_breaches": 0,
        "no_data_since": None,
        "tally": Tally.starting(now),
    }
    if rule.metrics or rule.action is GuardrailAction.PAUSE:
        common |= cleared()
    kind = EventKind.PROBE_FAILED if from_state == "half_open" else EventKind.TRIPPED
    if trips >= rule.max_trips:
        new = state.with_changes(
            status=transition(state.status, ExperimentState.ROLLED_BACK), canary_bp=0, **common
        )
        evidence = _evidence(state, new, rule, now, look, gate=gate)
        if call is not None and call.by:
            evidence["action"] = {"action": action.value, "by": call.by}
        why = f"trip {trips} of max_trips {rule.max_trips}: rolled back; {reason}"
        effects: tuple[RolloutEffect, ...] = (
            *extra,
            SetCanaryWeight(0, RouteState.ROLLED_BACK),
            Rollback(),
            RecordEvent(kind, reason, _payload(from_state, "open", evidence)),
            RecordEvent(EventKind.ROLLED_BACK, why, _payload("running", "rolled_back", evidence)),
        )
        return Decision(new, effects, why, evidence, None)

    bp = _action_weight(state, action, steps)
    new = state.with_changes(canary_bp=bp, **common)
    evidence = _evidence(state, new, rule, now, look, gate=gate)
    if call is not None and call.by:
        evidence["action"] = {"action": action.value, "by": call.by}
    why = f"trip {trips} of {rule.max_trips} ({action.value}: canary {bp} bp); {reason}"
    effects = (
        *extra,
        SetCanaryWeight(bp, RouteState.TRIPPED),
        RecordEvent(kind, why, _payload(from_state, "open", evidence)),
    )
    return Decision(new, effects, why, evidence, now + rule.cooldown_sec)


def _action_weight(state: RolloutState, action: GuardrailAction, steps: Sequence[Step]) -> int:
    if action is not GuardrailAction.STEP_BACK or state.step_index == 0:
        return 0
    return steps[state.step_index - 1].weight_bp


def _close(
    state: RolloutState,
    look: _Look,
    rule: BreakerRule,
    steps: Sequence[Step],
    now: float,
    gate: Evaluation,
    extra: tuple[RolloutEffect, ...],
) -> Decision:
    # resume one step below the one that tripped: its weight was last seen healthy
    index = max(state.step_index - 1, 0)
    bp = steps[index].weight_bp
    new = state.with_changes(
        breaker=transition(state.breaker, BreakerState.CLOSED),
        step_index=index,
        step_started_at=now,
        canary_bp=bp,
        weight_since=now,
        opened_at=None,
        probe_started_at=None,
        consecutive_breaches=0,
        no_data_since=None,
        tally=Tally.starting(now),
    )
    evidence = _evidence(state, new, rule, now, look, gate=gate)
    reason = f"probe passed: closed, resuming at step {index + 1} ({bp} bp)"
    effects: tuple[RolloutEffect, ...] = (
        *extra,
        SetCanaryWeight(bp, RouteState.RUNNING),
        RecordEvent(EventKind.PROBE_PASSED, reason, _payload("half_open", "closed", evidence)),
    )
    return Decision(new, effects, reason, evidence, now + steps[index].hold_sec)


def _advance(
    state: RolloutState,
    look: _Look,
    rule: BreakerRule,
    steps: Sequence[Step],
    now: float,
    gate: Evaluation,
    extra: tuple[RolloutEffect, ...],
) -> Decision:
    index = state.step_index + 1
    if index >= len(steps):
        new = state.with_changes(
            status=transition(state.status, ExperimentState.PROMOTED),
            canary_bp=TOTAL_WEIGHT,
            weight_since=now,
            tally=Tally.starting(now),
        )
        evidence = _evidence(state, new, rule, now, look, gate=gate)
        reason = f"last step ({len(steps)}) passed: promoted"
        effects: tuple[RolloutEffect, ...] = (
            *extra,
            SetCanaryWeight(TOTAL_WEIGHT, RouteState.PROMOTED),
            Promote(),
            RecordEvent(EventKind.PROMOTED, reason, _payload("running", "promoted", evidence)),
        )
        return Decision(new, effects, reason, evidence, None)
    bp = steps[index].weight_bp
    new = state.with_changes(
        step_index=index,
        step_started_at=now,
        canary_bp=bp,
        weight_since=now,
        consecutive_breaches=0,
        tally=Tally.starting(now),
    )
    evidence = _evidence(state, new, rule, now, look, gate=gate)
    reason = f"step {state.step_index + 1} passed: step {index + 1} of {len(steps)} at {bp} bp"
    effects = (
        *extra,
        SetCanaryWeight(bp, RouteState.RUNNING),
        RecordEvent(
            EventKind.STEP_ADVANCED,
            reason,
            _payload(f"step {state.step_index + 1}", f"step {index + 1}", evidence),
        ),
    )
    return Decision(new, effects, reason, evidence, now + steps[index].hold_sec)


# ---------------------------------------------------------------- pieces


def _gate(state: RolloutState, rule: BreakerRule, look: _Look) -> Evaluation:
    merged = state.tally.snapshots(experiment="")
    if not rule.metrics or look.metrics is None:
        return evaluate(merged[CANARY], merged.get(BASELINE), rule, always_test=True)
    # the step's samples, and each provider metric's latest reading over its window
    return evaluate(
        merged[CANARY],
        merged.get(BASELINE),
        rule,
        always_test=True,
        metrics=look.metrics.evidence,
        metrics_expired=look.metrics.expired,
        provider=look.metrics.provider,
    )


def _gate_passes(gate: Evaluation) -> bool:
    # a gate moves traffic up, so it wants every guardrail within its bound, not
    # merely an exceedance that is not (yet) significant - except on clustered
    # evidence (below)
    return gate.verdict is Verdict.PASS and not any(_holds_gate(g) for g in gate.guardrails)


def _holds_gate(g: Guardrail) -> bool:
    """Whether a guardrail keeps the step from advancing.

    Judged per request, any exceedance holds: more requests shrink the noise, so a
    healthy canary's estimate comes back under the bound. Judged on units, the same
    sticky units make the step's estimate, and waiting adds few new ones: a slow heavy
    user keeps a healthy canary's estimate over the bound for the whole step. There an
    exceedance holds only while it is significant at GATE_CLUSTERED_P (cluster-robust,
    one-sided) - what the units cannot tell from their own spread is not evidence
    against the canary, and the next step's units judge it again
    (docs/decisions/0012-cluster-robust-judgment.md).
    """
    if not g.exceeded:
        return False
    if g.metric is not None and g.test is not None:
        # a provider ratio against the baseline: two healthy arms are over each other
        # half the time, and more events do not change that; only a significant
        # exceedance holds, as on units
        p = g.p_adjusted if g.p_adjusted is not None else g.test.p_value
        return p < GATE_CLUSTERED_P
    if g.test is None or not g.test.method.startswith("cluster_robust"):
        return True
    p = g.p_adjusted if g.p_adjusted is not None else g.test.p_value
    return p < GATE_CLUSTERED_P


def _next_data_at(state: RolloutState, rule: BreakerRule, now: float) -> float:
    # the next disjoint window to count ends one window after the last counted one
    return max(state.tally.counted_until + rule.window_sec, now + RECHECK_SEC)


def _no_data_events(
    state: RolloutState, rule: BreakerRule, now: float
) -> tuple[RolloutState, tuple[RolloutEffect, ...]]:
    """A `no_data` event once the canary has had no samples for the rule's
    `no_data_timeout_sec`: once per period, whatever the policy (under `fail` the
    trip comes with it; under `hold` it is the only sign that the rollout is stuck)."""
    since = state.no_data_since
    if since is None or state.no_data_reported or now - since < rule.no_data_timeout_sec:
        return state, ()
    reason = (
        f"no canary samples for {now - since:.1f}s (no_data_timeout_sec "
        f"{rule.no_data_timeout_sec:g}, no_data: {rule.no_data.value})"
    )
    data = {
        "at": now,
        "no_data_since": since,
        "no_data_timeout_sec": rule.no_data_timeout_sec,
        "policy": rule.no_data.value,
        "canary_bp": state.canary_bp,
    }
    return state.with_changes(no_data_reported=True), (
        RecordEvent(EventKind.NO_DATA, reason, data),
    )


def _srm_events(
    state: RolloutState, look: _Look, rule: BreakerRule, now: float
) -> tuple[RolloutEffect, ...]:
    # an event when the verdict changes, not on every look
    if not look.srm_changed:
        return ()
    data = {
        "at": now,
        "srm": _srm_evidence(look),
        "policy": rule.srm.value,
        "canary_bp": state.canary_bp,
    }
    if state.srm_flagged:  # this look's verdict, changed to a mismatch
        return (RecordEvent(EventKind.SRM_DETECTED, _srm_reason(look, rule), data),)
    return (RecordEvent(EventKind.SRM_CLEARED, "sample ratio back within expectation", data),)


def _overload_events(
    state: RolloutState, look: _Look, rule: BreakerRule, now: float
) -> tuple[RolloutEffect, ...]:
    """`overload_hold` when a hold begins, `overload_cleared` when it ends: edges only."""
    if not look.overload_changed:
        return ()
    data = {"at": now, "overload": _overload_evidence(look, rule, held=look.overloaded)}
    if look.overloaded:
        assert look.evaluation is not None
        return (RecordEvent(EventKind.OVERLOAD_HOLD, look.evaluation.reason, data),)
    reason = "the baseline no longer sheds requests: judged again (overload: hold)"
    return (RecordEvent(EventKind.OVERLOAD_CLEARED, reason, data),)


def _overload_evidence(look: _Look, rule: BreakerRule, *, held: bool) -> dict[str, Any]:
    """Whether the look was held for overload, and each arm's shed requests: a trip
    while the sidecars shed and a shed are told apart."""
    arms: dict[str, Any] = {}
    for arm, snap in (("canary", look.canary), ("baseline", look.baseline)):
        arms[arm] = None if snap is None else {"shed": snap.shed, "shed_share": snap.shed_share}
    return {"policy": rule.overload._value_, "held": held, "variants": arms}


def _srm_reason(look: _Look, rule: BreakerRule) -> str:
    ramp = look.ramp
    step = look.srm_units.result if look.srm_units is not None else look.srm
    if step is not None and step.mismatch:
        what = "units" if look.srm_units is not None else "requests"
        return (
            f"sample ratio mismatch: canary {step.canary_count} of "
            f"{step.canary_count + step.baseline_count} {what}, "
            f"expected {step.expected_canary_fraction:.4f}, "
            f"always-valid p={step.always_valid_p:.2g} ({rule.srm.value})"
        )
    assert ramp is not None
    loss = ramp.loss
    if ramp.decided_by == "loss" and loss is not None:
        return (
            f"sample ratio mismatch: the {loss.short_arm} is short of units "
            f"({loss.units} units judged at the end of step {loss.look}), z={loss.z:.2f}, "
            f"p={loss.p_value:.2g} < {loss.alpha / 2:.2g} ({rule.srm.value})"
        )
    return (
        f"sample ratio mismatch across the ramp: {ramp.canary_events} of {ramp.events} "
        f"units' sightings in the canary, expected {ramp.expected:.1f}, "
        f"always-valid p={ramp.always_valid_p():.2g} ({rule.srm.value})"
    )


def _srm_evidence(look: _Look) -> dict[str, Any] | None:
    """The split's evidence: on units when known (deciding), and on requests.

    Requests out of balance while units are in balance is a few heavy units landing
    in one arm, not a broken assignment: reported as `heavy_users`, never as SRM.
    """
    if look.srm is None and look.srm_units is None and look.ramp is None:
        return None
    requests = look.srm.to_dict() if look.srm is not None else None
    if look.srm_units is None and look.ramp is None:
        return {**(requests or {}), "judged_on": "requests"}
    unit_result = look.srm_units.result if look.srm_units is not None else None
    heavy = (
        look.srm is not None
        and look.srm.mismatch
        and unit_result is not None
        and not unit_result.mismatch
        and not (look.ramp is not None and look.ramp.mismatch)
    )
    return {
        **(unit_result.to_dict() if unit_result is not None else {}),
        "judged_on": "units",
        "units": look.srm_units.to_dict() if look.srm_units is not None else None,
        "ramp": look.ramp.to_evidence() if look.ramp is not None else None,
        "requests": requests,
        "heavy_users": heavy,
        "decided_by": _srm_decided_by(look),
    }


def _srm_decided_by(look: _Look) -> str | None:
    """Which test's mismatch the verdict stands on: the step's units (or requests),
    the ramp's always-valid test, or the loss test at a step's end."""
    step = look.srm_units.result if look.srm_units is not None else look.srm
    if step is not None and step.mismatch:
        return "step_units" if look.srm_units is not None else "step_requests"
    if look.ramp is not None and look.ramp.mismatch:
        return look.ramp.decided_by
    return None


def _payload(from_: str, to: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return {"from": from_, "to": to, "who": "controller", "evidence": evidence}


def _evidence(
    before: RolloutState,
    after: RolloutState,
    rule: BreakerRule,
    now: float,
    look: _Look | None,
    *,
    gate: Evaluation | None = None,
    units: bool = True,
) -> dict[str, Any]:
    """What a decision saw. `units`: add the units behind the look's windows (counts
    per arm, top units' shares, effective units) - on every event, not on holds."""
    evidence: dict[str, Any] = {
        "at": now,
        "breaker": {"before": before.breaker._value_, "after": after.breaker._value_},
        "status": {"before": before.status._value_, "after": after.status._value_},
        "step_index": {"before": before.step_index, "after": after.step_index},
        "weights": {"canary_bp_before": before.canary_bp, "canary_bp_after": after.canary_bp},
        "trips": after.trips,
        "consecutive_breaches": before.consecutive_breaches,
        "no_data_since": before.no_data_since,
        "step_samples": {
            "windows": before.tally.windows,
            "canary": before.tally.canary.count,
            "baseline": before.tally.baseline.count,
        },
        "rule": rule_json(rule),
    }
    if after.held_by or before.held_by:
        evidence["held_by"] = {
            "guardrails": list(after.held_by),
            "since": after.held_since,
            "reason": after.held_reason,
        }
    if after.metric_no_data:
        evidence["metrics_no_data"] = {
            name: {"since": p.since, "reason": p.reason} for name, p in after.metric_no_data.items()
        }
    if look is not None:
        if look.alphas is not None:
            evidence["look_alpha"] = {"window": look.alphas[0], "fast_window": look.alphas[1]}
        if look.fast_evaluation is not None:
            evidence["fast_window"] = look.fast_evaluation.to_dict()
        if look.evaluation is not None:
            evidence["window"] = look.evaluation.to_dict()
        else:
            evidence["window"] = {
                "verdict": "not_evaluated",
                "reason": look.stale_note or "no snapshot newer than the last one judged",
            }
        evidence["srm"] = _srm_evidence(look)
        evidence["overload"] = _overload_evidence(look, rule, held=after.overload_held)
        if units:
            evidence["units"] = {
                arm: unit_evidence(snap, concentrated=True) if snap is not None else None
                for arm, snap in (("canary", look.canary), ("baseline", look.baseline))
            }
    if gate is not None:
        evidence["step_gate"] = gate.to_dict()
    return evidence


def rule_json(rule: BreakerRule) -> dict[str, Any]:
    """`rule.model_dump(mode="json")`, dumped once per rule object: every look's
    evidence names its rule, and a rule is frozen. Each caller gets its own copy."""
    key = id(rule)
    held = _RULE_JSON.get(key)
    if held is None or held[0]() is not rule:
        # the entry leaves with its rule, before another object can take its id
        ref = weakref.ref(rule, partial(_forget_rule, key))
        dump = rule.model_dump(mode="json")
        nested = tuple(k for k, v in dump.items() if type(v) in (dict, list))
        held = _RULE_JSON[key] = (ref, dump, nested)
    _, dump, nested = held
    copy = dict(dump)
    for name in nested:  # most of a rule is numbers and texts: only these are copied
        copy[name] = _json_copy_value(dump[name])
    return copy


# per live rule object (by id): the rule, weakly, its JSON form, and the names of
# the form's dicts and lists
_RULE_JSON: dict[int, tuple[weakref.ref[BreakerRule], dict[str, Any], tuple[str, ...]]] = {}


def _forget_rule(key: int, _: object) -> None:
    _RULE_JSON.pop(key, None)


def _json_copy(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of JSON data that shares no dict or list with it."""
    return {k: _json_copy_value(v) if type(v) in (dict, list) else v for k, v in data.items()}


def _json_copy_value(value: Any) -> Any:
    if type(value) is dict:
        return _json_copy(value)
    if type(value) is list:
        return [_json_copy_value(v) for v in value]
    return value


def _check_steps(steps: Sequence[Step]) -> None:
    if not steps:
        raise ValueError("a rollout needs at least one step")
