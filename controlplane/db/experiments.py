"""Data access for experiments (with their variants and steps) and the events trail.

Plain synchronous functions with keyword-only arguments, each given the session of
the caller's transaction; they never commit. Callers decide what is legal (see
controlplane.experiments); these functions only read and write rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.db.models import ACTIVE_STATES, Event, Experiment, Step, Variant
from controlplane.kernel.errors import NotFound
from controlplane.kernel.routes import BASELINE, CANARY
from controlplane.kernel.values import in_sql_range


@dataclass(frozen=True)
class StepSpec:
    weight_bp: int
    hold_sec: int


@dataclass(frozen=True)
class ExperimentSpec:
    """Everything a user defines about an experiment (the rest is runtime state)."""

    name: str
    service: str
    baseline_upstream: str
    canary_upstream: str
    steps: tuple[StepSpec, ...]
    sticky_header: str | None
    sticky_cookie: str | None
    rule: dict[str, Any] | None


def _apply_spec(experiment: Experiment, spec: ExperimentSpec) -> None:
    experiment.name = spec.name
    experiment.service = spec.service
    experiment.sticky_header = spec.sticky_header
    experiment.sticky_cookie = spec.sticky_cookie
    experiment.rule = spec.rule
    experiment.variants = [
        Variant(name=BASELINE, upstream=spec.baseline_upstream),
        Variant(name=CANARY, upstream=spec.canary_upstream),
    ]
    experiment.steps = [
        Step(position=i, weight_bp=s.weight_bp, hold_sec=s.hold_sec)
        for i, s in enumerate(spec.steps)
    ]


def spec_of(experiment: Experiment) -> ExperimentSpec:
    return ExperimentSpec(
        name=experiment.name,
        service=experiment.service,
        baseline_upstream=experiment.upstream_of(BASELINE),
        canary_upstream=experiment.upstream_of(CANARY),
        steps=tuple(StepSpec(s.weight_bp, s.hold_sec) for s in experiment.steps),
        sticky_header=experiment.sticky_header,
        sticky_cookie=experiment.sticky_cookie,
        rule=experiment.rule,
    )


def create_experiment(
    *, session: Session, spec: ExperimentSpec, salt: str, now: datetime
) -> Experiment:
    experiment = Experiment(
        state="draft",
        salt=salt,
        current_step=-1,
        canary_weight_bp=0,
        breaker_state="closed",
        trips=0,
        route_revision=0,
        created_at=now,
        updated_at=now,
    )
    _apply_spec(experiment, spec)
    session.add(experiment)
    session.flush()
    return experiment


def replace_spec(
    *, session: Session, experiment: Experiment, spec: ExperimentSpec, now: datetime
) -> Experiment:
    """Replace the user-defined part of an experiment (variants and steps included)."""
    # Old child rows go first, so the (experiment, position) keys are free again.
    experiment.variants = []
    experiment.steps = []
    session.flush()
    _apply_spec(experiment, spec)
    experiment.updated_at = now
    session.flush()
    return experiment


def get_experiment(*, session: Session, experiment_id: int) -> Experiment:
    # out of the SQL range no row can match, and the driver would overflow on it
    experiment = session.get(Experiment, experiment_id) if in_sql_range(experiment_id) else None
    if experiment is None:
        raise NotFound(f"no experiment {experiment_id}")
    return experiment


def list_experiments(
    *,
    session: Session,
    service: str | None = None,
    state: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Experiment], int]:
    """A page of experiments, newest first, and the total matching the filters."""
    query = select(Experiment)
    if service is not None:
        query = query.where(Experiment.service == service)
    if state is not None:
        query = query.where(Experiment.state == state)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Experiment.id.desc()).limit(limit).offset(offset)).all()
    return list(rows), total


def active_experiment(
    *, session: Session, service: str, excluding: int | None = None
) -> Experiment | None:
    """The service's running or paused experiment, if any (at most one exists)."""
    query = select(Experiment).where(
        Experiment.service == service, Experiment.state.in_(ACTIVE_STATES)
    )
    if excluding is not None:
        query = query.where(Experiment.id != excluding)
    return session.scalars(query.limit(1)).first()


def active_experiments(*, session: Session) -> list[Experiment]:
    """Every running or paused experiment with its steps and variants, detached from
    the session (the controller reads them across awaits)."""
    rows = session.scalars(select(Experiment).where(Experiment.state.in_(ACTIVE_STATES))).all()
    for row in rows:  # load the relationships inside the session
        _ = (row.steps, row.variants)
    session.expunge_all()
    return list(rows)


def delete_experiment(*, session: Session, experiment: Experiment) -> None:
    session.delete(experiment)
    session.flush()


def record_event(
    *,
    session: Session,
    service: str,
    at: datetime,
    actor: str,
    kind: str,
    experiment_id: int | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    reason: str = "",
    payload: dict[str, Any] | None = None,
) -> Event:
    event = Event(
        experiment_id=experiment_id,
        service=service,
        at=at,
        actor=actor,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        payload=dict(payload or {}),
    )
    session.add(event)
    session.flush()
    return event


def latest_event(*, session: Session, service: str, kind: str) -> Event | None:
    """The service's most recent event of `kind`, if any."""
    query = (
        select(Event)
        .where(Event.service == service, Event.kind == kind)
        .order_by(Event.id.desc())
        .limit(1)
    )
    return session.scalars(query).first()


def list_events(
    *,
    session: Session,
    experiment_id: int | None = None,
    service: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[Sequence[Event], int]:
    """A page of events in the order they happened, and the total."""
    query = select(Event)
    if experiment_id is not None:
        query = query.where(Event.experiment_id == experiment_id)
    if service is not None:
        query = query.where(Event.service == service)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Event.id).limit(limit).offset(offset)).all()
    return rows, total
