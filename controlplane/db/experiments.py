"""Data access for experiments (with their variants and steps) and the events trail.

Plain synchronous functions with keyword-only arguments, each given the session of
the caller's transaction; they never commit. Callers decide what is legal (see
controlplane.experiments); these functions only read and write rows.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Integer, Select, Table, bindparam, delete, false, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from controlplane.db.models import Event, Experiment, RolloutEvidence, StepRow, UTCDateTime, Variant
from controlplane.db.notifications import enqueue_for_event
from controlplane.experiments.events import EventKind
from controlplane.experiments.memory_parts import split_memory
from controlplane.experiments.store import ExperimentRecord, ExperimentSpec, StepSpec
from controlplane.kernel import json_text
from controlplane.kernel.errors import NotFound
from controlplane.kernel.routes import BASELINE, CANARY
from controlplane.kernel.values import in_sql_range

_Query = TypeVar("_Query", bound=Select[*tuple[Any, ...]])
EXPERIMENTS: Table = Experiment.__table__  # type: ignore[assignment]
EVIDENCE: Table = RolloutEvidence.__table__  # type: ignore[assignment]
# well under SQLite's bound parameters a statement, and PostgreSQL's
IDS_PER_QUERY = 500


def _apply_spec(experiment: Experiment, spec: ExperimentSpec) -> None:
    experiment.name = spec.name
    experiment.service = spec.service
    experiment.sticky_header = spec.sticky_header
    experiment.sticky_cookie = spec.sticky_cookie
    experiment.rule = spec.rule
    experiment.baseline_follows_stable = spec.baseline_follows_stable
    experiment.variants = [
        Variant(name=BASELINE, upstream=spec.baseline_upstream, version=spec.baseline_version),
        Variant(name=CANARY, upstream=spec.canary_upstream, version=spec.canary_version),
    ]
    experiment.steps = [
        StepRow(position=i, weight_bp=s.weight_bp, hold_sec=s.hold_sec)
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
        baseline_version=experiment.version_of(BASELINE),
        canary_version=experiment.version_of(CANARY),
        baseline_follows_stable=experiment.baseline_follows_stable,
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


def _matching(
    query: _Query,
    *,
    service: str | None = None,
    states: Collection[str] | None = None,
    excluding: int | None = None,
    shards: tuple[int, Collection[int]] | None = None,
) -> _Query:
    if shards is not None:
        count, chosen = shards
        query = query.where(
            (Experiment.id % count).in_(sorted(chosen)) if chosen else false()
        )
    if service is not None:
        query = query.where(Experiment.service == service)
    if states is not None:
        query = query.where(Experiment.state.in_(sorted(states)))
    if excluding is not None:
        query = query.where(Experiment.id != excluding)
    return query


def list_experiments(
    *,
    session: Session,
    service: str | None = None,
    states: Collection[str] | None = None,
    excluding: int | None = None,
    limit: int | None = 50,
    offset: int = 0,
    shards: tuple[int, Collection[int]] | None = None,
) -> tuple[list[Experiment], int]:
    """Experiments newest first, and the total matching the filters; every one when
    `limit` is None (then the total is simply their number). `shards` (count, shards):
    only those whose id modulo count is one of the shards (decision 0057)."""
    query = _matching(select(Experiment), service=service, states=states,
                      excluding=excluding, shards=shards)
    ordered = query.order_by(Experiment.id.desc())
    if limit is None:
        rows = session.scalars(ordered.offset(offset)).all()
        return list(rows), len(rows)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(ordered.limit(limit).offset(offset)).all()
    return list(rows), total


def list_versions(
    *,
    session: Session,
    states: Collection[str] | None = None,
    shards: tuple[int, Collection[int]] | None = None,
) -> list[tuple[int, int]]:
    """(id, version) of the matching experiments, newest first: what a reader that
    keeps the rows it parsed needs to tell which changed, without their JSON columns."""
    query = _matching(select(Experiment.id, Experiment.version), states=states,
                      shards=shards)
    return [(int(i), int(v)) for i, v in session.execute(query.order_by(Experiment.id.desc()))]


def get_experiments(*, session: Session, ids: Collection[int]) -> list[Experiment]:
    """The experiments of `ids` that exist, in a few queries whatever their number."""
    wanted = sorted(i for i in set(ids) if in_sql_range(i))
    found: list[Experiment] = []
    for start in range(0, len(wanted), IDS_PER_QUERY):
        chunk = wanted[start : start + IDS_PER_QUERY]
        found.extend(session.scalars(select(Experiment).where(Experiment.id.in_(chunk))))
    return found


def keep_evidence(row: Experiment, evidence: dict[str, Any] | None) -> None:
    """Make `row`'s stored evidence `evidence` (None: none), writing it only if it
    differs from what the row holds."""
    if evidence is None:
        row.evidence = None
    elif row.evidence is None:
        row.evidence = RolloutEvidence(body=evidence)
    elif row.evidence.body != evidence:
        row.evidence.body = evidence


def _store_evidence(
    session: Session, experiments: Sequence[ExperimentRecord], written: Sequence[bool],
    evidence_stored: Sequence[bool] | None,
) -> None:
    """The step's evidence of each written row the caller does not know stored: one
    upsert for those with a memory, one delete for those without."""
    upserts: list[dict[str, Any]] = []
    cleared: list[int] = []
    for index, (experiment, done) in enumerate(zip(experiments, written, strict=True)):
        if not done or (evidence_stored is not None and evidence_stored[index]):
            continue
        _, evidence = split_memory(experiment.rollout_state)
        if evidence is None:
            cleared.append(experiment.id)
        else:
            upserts.append({"experiment_id": experiment.id, "body": evidence})
    connection = session.connection()
    if upserts:
        dialect_insert = (
            postgresql_insert if connection.dialect.name == "postgresql" else sqlite_insert
        )
        insert = dialect_insert(EVIDENCE)
        connection.execute(
            insert.on_conflict_do_update(
                index_elements=[EVIDENCE.c.experiment_id], set_={"body": insert.excluded.body}
            ),
            upserts,
        )
    for start in range(0, len(cleared), IDS_PER_QUERY):
        chunk = cleared[start : start + IDS_PER_QUERY]
        connection.execute(delete(EVIDENCE).where(EVIDENCE.c.experiment_id.in_(chunk)))


def save_states(
    *, session: Session, experiments: Sequence[ExperimentRecord],
    evidence_stored: Sequence[bool] | None = None,
) -> list[bool]:
    """Write each record's runtime state if its row is still at the record's version,
    bumping the version as the ORM's version counter does; per record, whether it was
    written. No read of the row first: a row that moved matches none and is left as it
    is. One UPDATE per row, or on PostgreSQL one for all (decision 0064).

    The memory's step evidence goes to its own table (decision 0068), and only for the
    rows whose `evidence_stored` is false (all of them by default): a look that added
    no window writes a few hundred bytes, not the ~240 KB of a full tally."""
    if evidence_stored is not None and len(evidence_stored) != len(experiments):
        raise ValueError("evidence_stored must say, for each experiment, whether it is stored")
    statement = (
        update(EXPERIMENTS)
        .where(EXPERIMENTS.c.id == bindparam("row_id"))
        .where(EXPERIMENTS.c.version == bindparam("row_version"))
        .values(
            state=bindparam("state"),
            breaker_state=bindparam("breaker_state"),
            trips=bindparam("trips"),
            current_step=bindparam("current_step"),
            canary_weight_bp=bindparam("canary_weight_bp"),
            step_started_at=bindparam("step_started_at"),
            breaker_changed_at=bindparam("breaker_changed_at"),
            rollout_state=bindparam("rollout_state", type_=EXPERIMENTS.c.rollout_state.type),
            updated_at=bindparam("updated_at"),
            version=EXPERIMENTS.c.version + 1,
        )
    )
    connection = session.connection()
    if connection.dialect.name == "postgresql" and len(experiments) > 1:
        written = _save_states_at_once(session, experiments)
        _store_evidence(session, experiments, written, evidence_stored)
        return written
    written = []
    for experiment in experiments:
        result = connection.execute(statement, {
            "row_id": experiment.id,
            "row_version": experiment.version,
            "state": experiment.state.value,
            "breaker_state": experiment.breaker_state.value,
            "trips": experiment.trips,
            "current_step": experiment.current_step,
            "canary_weight_bp": experiment.canary_weight_bp,
            "step_started_at": experiment.step_started_at,
            "breaker_changed_at": experiment.breaker_changed_at,
            "rollout_state": split_memory(experiment.rollout_state)[0],
            "updated_at": experiment.updated_at,
        })
        written.append(result.rowcount == 1)
    _store_evidence(session, experiments, written, evidence_stored)
    return written


# PostgreSQL: the round's memory as one array per column, so the statement's text is
# the same every round (compiled once by SQLAlchemy, prepared once by the server)
_SAVE_STATES_AT_ONCE = text(
    "UPDATE experiments AS e SET state = v.state, breaker_state = v.breaker_state,"
    " trips = v.trips, current_step = v.current_step, canary_weight_bp = v.canary_weight_bp,"
    " step_started_at = v.step_started_at, breaker_changed_at = v.breaker_changed_at,"
    " rollout_state = CAST(v.rollout_state AS json), updated_at = v.updated_at,"
    " version = e.version + 1"
    " FROM unnest(CAST(:ids AS integer[]), CAST(:versions AS integer[]),"
    " CAST(:states AS varchar[]), CAST(:breakers AS varchar[]), CAST(:trips AS integer[]),"
    " CAST(:steps AS integer[]), CAST(:weights AS integer[]),"
    " CAST(:step_started AS timestamptz[]), CAST(:breaker_changed AS timestamptz[]),"
    " CAST(:memories AS text[]), CAST(:updated AS timestamptz[]))"
    " AS v(id, version, state, breaker_state, trips, current_step, canary_weight_bp,"
    " step_started_at, breaker_changed_at, rollout_state, updated_at)"
    " WHERE e.id = v.id AND e.version = v.version"
    " RETURNING e.id"
).columns(id=Integer)
# bounds one statement's parameters and the server's work per statement
_ROWS_A_STATEMENT = 500


def _save_states_at_once(
    session: Session, experiments: Sequence[ExperimentRecord]
) -> list[bool]:
    """save_states on PostgreSQL: one UPDATE per 500 rows. RETURNING names exactly the
    rows written, so a row that moved is told apart as with one statement per row."""
    dialect = session.get_bind().dialect
    stamp = UTCDateTime().process_bind_param
    done: set[int] = set()
    for start in range(0, len(experiments), _ROWS_A_STATEMENT):
        chunk = experiments[start : start + _ROWS_A_STATEMENT]
        params = {
            "ids": [e.id for e in chunk],
            "versions": [e.version for e in chunk],
            "states": [e.state.value for e in chunk],
            "breakers": [e.breaker_state.value for e in chunk],
            "trips": [e.trips for e in chunk],
            "steps": [e.current_step for e in chunk],
            "weights": [e.canary_weight_bp for e in chunk],
            "step_started": [stamp(e.step_started_at, dialect) for e in chunk],
            "breaker_changed": [stamp(e.breaker_changed_at, dialect) for e in chunk],
            # the JSON column's own text: json_text.dumps is the engine's serializer
            "memories": [json_text.dumps(split_memory(e.rollout_state)[0]) for e in chunk],
            "updated": [stamp(e.updated_at, dialect) for e in chunk],
        }
        done.update(session.connection().execute(_SAVE_STATES_AT_ONCE, params).scalars())
    return [e.id in done for e in experiments]


def delete_experiment(*, session: Session, experiment: Experiment) -> None:
    session.delete(experiment)
    session.flush()


def record_event(
    *,
    session: Session,
    service: str,
    at: datetime,
    actor: str,
    kind: EventKind,
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
        # a kind outside the enum is refused (ValueError), so every stored kind reads
        # back as a member
        kind=EventKind(kind).value,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        payload=dict(payload or {}),
    )
    session.add(event)
    session.flush()
    # the announcement commits (or rolls back) with the event it announces
    enqueue_for_event(session=session, event=event)
    return event


def list_events(
    *,
    session: Session,
    experiment_id: int | None = None,
    service: str | None = None,
    kind: str | None = None,
    newest_first: bool = False,
    limit: int = 100,
    offset: int = 0,
) -> tuple[Sequence[Event], int]:
    """A page of events in the order they happened (or newest first), and the total."""
    query = select(Event)
    if experiment_id is not None:
        query = query.where(Event.experiment_id == experiment_id)
    if service is not None:
        query = query.where(Event.service == service)
    if kind is not None:
        query = query.where(Event.kind == kind)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    order = Event.id.desc() if newest_first else Event.id
    rows = session.scalars(query.order_by(order).limit(limit).offset(offset)).all()
    return rows, total
