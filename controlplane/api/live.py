"""The live view of one experiment: read the rule and the snapshots, then derive.

    read_live:  rule (inline, else etcd) → snapshots (board) → live_view (pure)

The view is best effort by design: an experiment's row is the answer, and what
lives elsewhere (the service rule in etcd, the snapshots in Redis) is added when it
can be read and replaced by a note when it cannot, so a backend outage never turns
GET /v1/experiments/{id} into an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

from controlplane.api.schemas import (
    ExperimentLive,
    LatencyLive,
    NextCheckFor,
    ProbeLive,
    RouteConfirmationPublic,
    SnapshotLive,
    StepLive,
)
from controlplane.collector.sharding import read_merged_snapshots
from controlplane.db import routes as desired_routes
from controlplane.decision.model import RolloutState
from controlplane.decision.probe_eta import estimate_probe
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.rollout_state import inline_rule, rollout_state_of, steps_of
from controlplane.experiments.service_configs import read_config
from controlplane.experiments.store import ExperimentRecord
from controlplane.experiments.summary import experiment_summary
from controlplane.kernel.errors import CanaryError, NotFound, ValidationFailed
from controlplane.kernel.route_reports import RouteReports, confirm
from controlplane.kernel.routes import TOTAL_WEIGHT, parse_route
from controlplane.kernel.rules import BreakerRule
from controlplane.kernel.service_configs import ConfigKind
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.runtime import Backends

# A GET should answer promptly even when Redis or etcd hangs rather than refuses.
READ_TIMEOUT_SEC = 1.0

RuleSource = Literal["experiment", "service"]


def _at(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def _state_of(experiment: ExperimentRecord, now: float) -> RolloutState | None:
    """The controller's state reconciled with the row; None before the start."""
    if experiment.state is ExperimentState.DRAFT or experiment.current_step < 0:
        return None
    try:
        return rollout_state_of(experiment, now)
    except (KeyError, TypeError, ValueError):
        return None  # a stored state this version cannot read: show the row alone


def next_check(
    state: RolloutState | None, rule: BreakerRule | None, hold_sec: float | None
) -> tuple[float | None, NextCheckFor | None]:
    """When the rollout moves on its own, and why: architecture §7 read off the state.

    open → the cooldown ends (opened_at + cooldown_sec); half-open → the probe window
    is over (probe_started_at + window_sec); closed → the step's hold is over.
    Nothing moves on its own while paused or after the end.
    """
    if state is None or state.status is not ExperimentState.RUNNING:
        return None, None
    if state.breaker is BreakerState.CLOSED:
        if hold_sec is None:
            return None, None
        return state.step_started_at + hold_sec, "step_due"
    if rule is None:
        return None, None
    if state.breaker is BreakerState.OPEN and state.opened_at is not None:
        return state.opened_at + rule.cooldown_sec, "cooldown_end"
    if state.breaker is BreakerState.HALF_OPEN and state.probe_started_at is not None:
        return state.probe_started_at + rule.window_sec, "probe_due"
    return None, None


def _probe(
    state: RolloutState | None, rule: BreakerRule | None, now: float
) -> ProbeLive | None:
    if (state is None or rule is None or state.breaker is not BreakerState.HALF_OPEN
            or state.status is not ExperimentState.RUNNING or state.probe_started_at is None):
        return None
    found = estimate_probe(
        weight_bp=state.canary_bp, started_at=state.probe_started_at,
        window_sec=rule.window_sec, seen=state.tally.canary.count, needed=rule.min_samples,
        now=now,
    )  # fmt: skip
    return ProbeLive(
        weight_bp=found.weight_bp, samples=found.seen, samples_needed=found.needed,
        samples_per_sec=found.rate_per_sec,
        window_ends_at=datetime.fromtimestamp(found.window_ends_at, UTC),
        verdict_expected_at=_at(found.verdict_at), sentence=found.sentence,
    )  # fmt: skip


def snapshot_live(snapshot: WindowSnapshot) -> SnapshotLive:
    return SnapshotLive(
        count=snapshot.count,
        failures=snapshot.failures,
        failure_ratio=snapshot.failure_ratio,
        mean_ms=snapshot.mean_ms,
        p50_ms=snapshot.p50_ms,
        p90_ms=snapshot.p90_ms,
        p95_ms=snapshot.p95_ms,
        p99_ms=snapshot.p99_ms,
        p999_ms=snapshot.p999_ms,
        window_sec=snapshot.window_sec,
        window_start=snapshot.window_start,
        window_end=snapshot.window_end,
        ts=snapshot.ts,
        first_byte=(
            None
            if (head := snapshot.first_byte) is None
            else LatencyLive(
                count=head.count,
                mean_ms=head.mean_ms,
                p50_ms=head.p50_ms,
                p90_ms=head.p90_ms,
                p95_ms=head.p95_ms,
                p99_ms=head.p99_ms,
                p999_ms=head.p999_ms,
            )
        ),
        samples_without_first_byte=snapshot.missing_first_byte,
        shed=snapshot.shed,
        shed_share=snapshot.shed_share,
    )


def live_view(
    experiment: ExperimentRecord,
    *,
    now: float,
    rule: BreakerRule | None,
    rule_source: RuleSource | None,
    rule_note: str | None,
    snapshots: Mapping[str, WindowSnapshot] | None,
    snapshots_note: str | None,
    snapshots_error: str | None,
) -> ExperimentLive:
    """The live view from what was read. Pure."""
    state = _state_of(experiment, now)
    step: StepLive | None = None
    hold: float | None = None
    if state is not None:
        steps = steps_of(experiment)
        index = min(state.step_index, len(steps) - 1)
        hold = steps[index].hold_sec
        # only a closed breaker counts the hold down (rule-free: the hold is the step's)
        due, _ = next_check(state, None, hold)
        step = StepLive(
            index=index,
            weight_bp=steps[index].weight_bp,
            hold_sec=int(hold),
            started_at=_at(state.step_started_at),
            due_at=_at(due),
        )
    at, why = next_check(state, rule, hold)
    stored = experiment.rollout_state or {}
    controller_at = stored.get("next_check_at")
    controller_at = float(controller_at) if isinstance(controller_at, int | float) else None
    if at is None and why is None and state is not None and rule is None:
        running_tripped = (
            state.status is ExperimentState.RUNNING and state.breaker is not BreakerState.CLOSED
        )
        if running_tripped and controller_at is not None:
            # without the rule the cooldown is unknown: show when the controller looks
            at, why = controller_at, "controller_recheck"
    reason = stored.get("last_reason")
    probe = _probe(state, rule, now)
    return ExperimentLive(
        breaker_state=experiment.breaker_state,
        trips=experiment.trips,
        max_trips=rule.max_trips if rule else None,
        step=step,
        canary_weight_bp=experiment.canary_weight_bp,
        baseline_weight_bp=TOTAL_WEIGHT - experiment.canary_weight_bp,
        route_revision=experiment.route_revision,
        next_check_at=_at(at),
        next_check_for=why,
        controller_next_check_at=_at(controller_at),
        last_reason=reason if isinstance(reason, str) else None,
        summary=experiment_summary(experiment, rule=rule, now=now),
        overload_held=state is not None and state.overload_held,
        held_by=list(state.held_by) if state is not None else [],
        held_since=_at(state.held_since) if state is not None else None,
        held_reason=state.held_reason if state is not None else None,
        probe=probe,
        rule_source=rule_source,
        rule_note=rule_note,
        snapshots=(
            {name: snapshot_live(s) for name, s in sorted(snapshots.items())}
            if snapshots is not None
            else None
        ),
        snapshots_note=snapshots_note,
        snapshots_error=snapshots_error,
    )


async def _rule_in_force(
    backends: Backends, experiment: ExperimentRecord
) -> tuple[BreakerRule | None, RuleSource | None, str | None]:
    own = inline_rule(experiment)
    if own is not None:
        return own, "experiment", None
    try:
        async with asyncio.timeout(READ_TIMEOUT_SEC):
            rule = await read_config(
                store=backends.store, kind=ConfigKind.RULE, service=experiment.service
            )
    except NotFound:
        return None, None, f"no breaker rule for service {experiment.service!r}"
    except (CanaryError, TimeoutError) as exc:
        return None, None, f"the service rule could not be read: {exc or 'timed out'}"
    assert isinstance(rule, BreakerRule)
    return rule, "service", None


async def _snapshots(
    backends: Backends, experiment: ExperimentRecord, now: float
) -> tuple[dict[str, WindowSnapshot] | None, str | None, str | None]:
    """(snapshots, note, error): the latest window per variant, merged over collectors."""
    if backends.board is None:
        return None, "this API process reads no snapshot board (started without streams)", None
    try:
        async with asyncio.timeout(READ_TIMEOUT_SEC):
            snapshots = await read_merged_snapshots(backends.board, str(experiment.id), now)
    except TimeoutError:
        return None, None, f"the snapshot board did not answer within {READ_TIMEOUT_SEC:g}s"
    except CanaryError as exc:
        return None, None, f"the snapshots could not be read: {exc}"
    note = None if snapshots else "no snapshot published for this experiment yet"
    return snapshots, note, None


async def read_live(backends: Backends, experiment: ExperimentRecord) -> ExperimentLive:
    now = backends.clock.now()
    rule, source, rule_note = await _rule_in_force(backends, experiment)
    snapshots, note, error = await _snapshots(backends, experiment, now)
    return live_view(
        experiment,
        now=now,
        rule=rule,
        rule_source=source,
        rule_note=rule_note,
        snapshots=snapshots,
        snapshots_note=note,
        snapshots_error=error,
    )


async def route_applied(
    backends: Backends, experiment: ExperimentRecord
) -> tuple[bool | None, str | None]:
    """Whether etcd holds the experiment's desired route yet (or the service's later
    desired one: revisions of a service only grow by commits), and a note when it
    does not or that cannot be told. What etcd holds counts only when it is the
    desired route itself: a revision field anyone can write proves nothing."""
    if experiment.route_revision <= 0:
        return None, None
    try:
        async with asyncio.timeout(READ_TIMEOUT_SEC):
            desired = await backends.database.read(
                desired_routes.desired_route, service=experiment.service
            )
            stored = await backends.kv.get(backends.keys.route(experiment.service))
    except (CanaryError, TimeoutError) as exc:
        return None, f"the route could not be read: {exc or 'timed out'}"
    if desired is None or desired.revision < experiment.route_revision:
        return None, "the service has no desired route at this revision"
    if stored is None:
        return False, None
    try:
        route = parse_route(stored.value)
    except ValidationFailed:
        return False, "etcd holds an unreadable route for the service"
    if route != desired:
        return False, "etcd holds another route than the desired one (published within one pass)"
    return True, None


async def route_confirmation(
    backends: Backends, experiment: ExperimentRecord
) -> RouteConfirmationPublic | None:
    """What the data planes of the experiment's service report holding (decision 0053):
    None before the experiment's first route, or when this process reads no reports."""
    board = backends.board
    if experiment.route_revision <= 0 or not isinstance(board, RouteReports):
        return None
    try:
        async with asyncio.timeout(READ_TIMEOUT_SEC):
            reports = await board.route_reports(experiment.service)
    except (CanaryError, TimeoutError) as exc:
        return RouteConfirmationPublic(
            confirmed=None, data_planes=None, confirmed_by=None,
            sentence=f"published; the data planes' reports could not be read: "
                     f"{exc or 'timed out'}",
        )  # fmt: skip
    found = confirm(reports, revision=experiment.route_revision, now=backends.clock.now())
    return RouteConfirmationPublic(
        confirmed=found.confirmed > 0, data_planes=found.data_planes,
        confirmed_by=found.confirmed, sentence=found.sentence,
    )  # fmt: skip
