"""The experiment store on SQL (experiments.store.ExperimentStore), over `Database`.

Each operation runs the data-access functions of db.experiments, db.routes and
db.service_configs in the transaction's worker thread and hands back frozen records,
never an ORM row: rows are read into records inside the session, where their steps
and variants load. The
database keeps lifecycle and breaker states as strings; they become the typed enums
here, at the edge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.db import experiments as rows
from controlplane.db import releases as release_rows
from controlplane.db import routes as desired_routes
from controlplane.db import service_configs as desired_configs
from controlplane.db import shards as controller_shards
from controlplane.db.models import Event, Experiment
from controlplane.db.session import Database, Transaction
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.experiments.memory_parts import merged_memory, split_memory
from controlplane.experiments.releases import ReleaseChange, ReleaseRecord, StableRecord
from controlplane.experiments.store import (
    EventRecord,
    ExperimentRecord,
    ExperimentSpec,
    ExperimentVersion,
    ShardSelection,
    StepRecord,
)
from controlplane.kernel.errors import RevisionConflict
from controlplane.kernel.routes import BASELINE, CANARY, Route, RouteState
from controlplane.kernel.service_configs import ConfigKind, ServiceConfig


def experiment_record(row: Experiment) -> ExperimentRecord:
    """The row as a frozen record (call inside its session)."""
    return ExperimentRecord(
        id=row.id,
        name=row.name,
        service=row.service,
        state=ExperimentState(row.state),
        salt=row.salt,
        baseline_upstream=row.upstream_of(BASELINE),
        canary_upstream=row.upstream_of(CANARY),
        steps=tuple(
            StepRecord(position=s.position, weight_bp=s.weight_bp, hold_sec=s.hold_sec)
            for s in sorted(row.steps, key=lambda s: s.position)
        ),
        sticky_header=row.sticky_header,
        sticky_cookie=row.sticky_cookie,
        rule=dict(row.rule) if row.rule is not None else None,
        current_step=row.current_step,
        canary_weight_bp=row.canary_weight_bp,
        breaker_state=BreakerState(row.breaker_state),
        trips=row.trips,
        step_started_at=row.step_started_at,
        breaker_changed_at=row.breaker_changed_at,
        route_revision=row.route_revision,
        rollout_state=merged_memory(
            row.rollout_state, row.evidence.body if row.evidence is not None else None
        ),
        created_at=row.created_at,
        updated_at=row.updated_at,
        version=row.version,
        baseline_version=row.version_of(BASELINE),
        canary_version=row.version_of(CANARY),
        baseline_follows_stable=row.baseline_follows_stable,
    )


def event_record(row: Event) -> EventRecord:
    return EventRecord(
        id=row.id,
        experiment_id=row.experiment_id,
        service=row.service,
        at=row.at,
        actor=row.actor,
        kind=row.kind,
        from_state=row.from_state,
        to_state=row.to_state,
        reason=row.reason,
        payload=dict(row.payload),
    )


def _load(*, session: Session, experiment_id: int) -> ExperimentRecord:
    return experiment_record(rows.get_experiment(session=session, experiment_id=experiment_id))


def _list(
    *, session: Session, service: str | None, states: Collection[ExperimentState] | None,
    excluding: int | None, limit: int | None, offset: int, shards: ShardSelection | None,
) -> tuple[list[ExperimentRecord], int]:
    found, total = rows.list_experiments(
        session=session, service=service,
        states=None if states is None else [s.value for s in states],
        excluding=excluding, limit=limit, offset=offset,
        shards=None if shards is None else (shards.count, shards.shards),
    )
    return [experiment_record(row) for row in found], total


def _create(
    *, session: Session, spec: ExperimentSpec, salt: str, now: datetime
) -> ExperimentRecord:
    return experiment_record(rows.create_experiment(session=session, spec=spec, salt=salt,
                                                    now=now))


def _current(session: Session, experiment: ExperimentRecord) -> Experiment:
    """The experiment's row, still at the version the caller read."""
    row = rows.get_experiment(session=session, experiment_id=experiment.id)
    if row.version != experiment.version:
        raise RevisionConflict(
            f"experiment {experiment.id} changed (version {experiment.version} → {row.version})"
        )
    return row


def _save_spec(
    *, session: Session, experiment: ExperimentRecord, spec: ExperimentSpec, now: datetime
) -> ExperimentRecord:
    row = rows.replace_spec(session=session, experiment=_current(session, experiment),
                            spec=spec, now=now)
    return experiment_record(row)


def _save_state(*, session: Session, experiment: ExperimentRecord) -> ExperimentRecord:
    row = _current(session, experiment)
    row.state = experiment.state.value
    row.breaker_state = experiment.breaker_state.value
    row.trips = experiment.trips
    row.current_step = experiment.current_step
    row.canary_weight_bp = experiment.canary_weight_bp
    row.step_started_at = experiment.step_started_at
    row.breaker_changed_at = experiment.breaker_changed_at
    look, evidence = split_memory(experiment.rollout_state)
    row.rollout_state = look
    rows.keep_evidence(row, evidence)
    row.updated_at = experiment.updated_at
    # the flush checks the row version and the one-active-per-service index now
    session.flush()
    return experiment_record(row)


def _versions(
    *, session: Session, states: Collection[ExperimentState] | None,
    shards: ShardSelection | None,
) -> list[ExperimentVersion]:
    found = rows.list_versions(
        session=session, states=None if states is None else [s.value for s in states],
        shards=None if shards is None else (shards.count, shards.shards),
    )
    return [ExperimentVersion(id=i, version=v) for i, v in found]


def _load_many(*, session: Session, ids: Collection[int]) -> list[ExperimentRecord]:
    return [experiment_record(row) for row in rows.get_experiments(session=session, ids=ids)]


def _save_states(
    *, session: Session, experiments: Sequence[ExperimentRecord],
    evidence_stored: Sequence[bool] | None,
) -> list[ExperimentRecord | None]:
    written = rows.save_states(
        session=session, experiments=experiments, evidence_stored=evidence_stored
    )
    return [
        replace(experiment, version=experiment.version + 1) if done else None
        for experiment, done in zip(experiments, written, strict=True)
    ]


def _delete(*, session: Session, experiment: ExperimentRecord) -> None:
    rows.delete_experiment(session=session, experiment=_current(session, experiment))


def _save_route(
    *, session: Session, experiment: ExperimentRecord, canary_bp: int, state: RouteState,
    now: datetime,
) -> tuple[Route, ExperimentRecord]:
    row = rows.get_experiment(session=session, experiment_id=experiment.id)
    route = desired_routes.commit_route_of(session=session, experiment=row,
                                           canary_bp=canary_bp, state=state, now=now)
    session.flush()
    return route, experiment_record(row)


def _append(*, session: Session, **event: Any) -> EventRecord:
    return event_record(rows.record_event(session=session, **event))


def _events(*, session: Session, **query: Any) -> tuple[list[EventRecord], int]:
    found, total = rows.list_events(session=session, **query)
    return [event_record(row) for row in found], total


class SqlStoreTransaction:
    """One unit of work of SqlExperimentStore (structurally a StoreTransaction)."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx

    async def load_experiment(self, *, experiment_id: int) -> ExperimentRecord:
        return await self._tx.run(_load, experiment_id=experiment_id)

    async def list_experiments(
        self,
        *,
        service: str | None = None,
        states: Collection[ExperimentState] | None = None,
        excluding: int | None = None,
        limit: int | None = None,
        offset: int = 0,
        shards: ShardSelection | None = None,
    ) -> tuple[list[ExperimentRecord], int]:
        return await self._tx.run(_list, service=service, states=states, excluding=excluding,
                                  limit=limit, offset=offset, shards=shards)

    async def create_experiment(
        self, *, spec: ExperimentSpec, salt: str, now: datetime
    ) -> ExperimentRecord:
        return await self._tx.run(_create, spec=spec, salt=salt, now=now)

    async def save_spec(
        self, *, experiment: ExperimentRecord, spec: ExperimentSpec, now: datetime
    ) -> ExperimentRecord:
        return await self._tx.run(_save_spec, experiment=experiment, spec=spec, now=now)

    async def save_state(self, *, experiment: ExperimentRecord) -> ExperimentRecord:
        return await self._tx.run(_save_state, experiment=experiment)

    async def list_versions(
        self,
        *,
        states: Collection[ExperimentState] | None = None,
        shards: ShardSelection | None = None,
    ) -> list[ExperimentVersion]:
        return await self._tx.run(_versions, states=states, shards=shards)

    async def load_experiments(self, *, ids: Collection[int]) -> list[ExperimentRecord]:
        return await self._tx.run(_load_many, ids=ids)

    async def save_states(
        self, *, experiments: Sequence[ExperimentRecord],
        evidence_stored: Sequence[bool] | None = None,
    ) -> list[ExperimentRecord | None]:
        return await self._tx.run(
            _save_states, experiments=experiments, evidence_stored=evidence_stored
        )

    async def delete_experiment(self, *, experiment: ExperimentRecord) -> None:
        await self._tx.run(_delete, experiment=experiment)

    async def save_desired_route(
        self, *, experiment: ExperimentRecord, canary_bp: int, state: RouteState,
        now: datetime,
    ) -> tuple[Route, ExperimentRecord]:
        return await self._tx.run(_save_route, experiment=experiment, canary_bp=canary_bp,
                                  state=state, now=now)

    async def load_service_config(
        self, *, kind: ConfigKind, service: str
    ) -> ServiceConfig | None:
        return await self._tx.run(desired_configs.desired_config, kind=kind, service=service)

    async def save_service_config(
        self, *, kind: ConfigKind, service: str, config: ServiceConfig, now: datetime,
        expected: ServiceConfig | None,
    ) -> None:
        await self._tx.run(desired_configs.save_config, kind=kind, service=service,
                           config=config, now=now, expected=expected)

    async def remove_service_config(
        self, *, kind: ConfigKind, service: str, expected: ServiceConfig | None
    ) -> None:
        await self._tx.run(desired_configs.remove_config, kind=kind, service=service,
                           expected=expected)

    async def hold_shard(self, *, shard: int, fence: int, owner: str, now: datetime) -> None:
        await self._tx.run(controller_shards.hold_shard, shard=shard, fence=fence,
                           owner=owner, now=now)

    async def load_stable_version(self, *, service: str) -> StableRecord | None:
        return await self._tx.run(release_rows.stable_version, service=service)

    async def record_release(
        self, *, service: str, experiment_id: int, change: ReleaseChange, actor: str,
        at: datetime,
    ) -> ReleaseRecord:
        return await self._tx.run(release_rows.record_release, service=service,
                                  experiment_id=experiment_id, change=change, actor=actor,
                                  at=at)

    async def list_releases(
        self, *, service: str, limit: int = 50, offset: int = 0
    ) -> tuple[list[ReleaseRecord], int]:
        return await self._tx.run(release_rows.list_releases, service=service, limit=limit,
                                  offset=offset)

    async def append_event(
        self,
        *,
        service: str,
        at: datetime,
        actor: str,
        kind: EventKind,
        experiment_id: int | None = None,
        from_state: str | None = None,
        to_state: str | None = None,
        reason: str = "",
        payload: dict[str, Any] | None = None,
    ) -> EventRecord:
        return await self._tx.run(
            _append, service=service, at=at, actor=actor, kind=kind,
            experiment_id=experiment_id, from_state=from_state, to_state=to_state,
            reason=reason, payload=payload,
        )

    async def list_events(
        self,
        *,
        experiment_id: int | None = None,
        service: str | None = None,
        kind: str | None = None,
        newest_first: bool = False,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[Sequence[EventRecord], int]:
        return await self._tx.run(
            _events, experiment_id=experiment_id, service=service, kind=kind,
            newest_first=newest_first, limit=limit, offset=offset,
        )


class SqlExperimentStore:
    """ExperimentStore on the SQL database: each transaction one session."""

    def __init__(self, database: Database) -> None:
        self.database = database

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqlStoreTransaction]:
        async with self.database.transaction() as tx:
            yield SqlStoreTransaction(tx)
