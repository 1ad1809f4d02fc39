"""What the rest of the code asks of persistence: the experiment store (architecture §11).

The API's actions, the controller and the reconciler read and write experiments,
their desired routes, the services' desired configs and the events trail through
`ExperimentStore` only; they never see a database session or an ORM row. The store
owns the unit of work:

    async with store.transaction() as tx:
        experiment = await tx.load_experiment(experiment_id=7)
        ... await tx.save_state(experiment=replace(experiment, state=...), now=now)
        ... await tx.save_desired_route(experiment=..., canary_bp=..., state=..., now=now)
        ... await tx.append_event(...)

The block commits when it ends normally and rolls back on any exception, so a change
of state, its desired route and its event are written together or not at all. The
records here are frozen values detached from any session; the SQL implementation is
controlplane.db.store.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import BreakerState, ExperimentState
from controlplane.kernel.routes import Route, RouteState
from controlplane.kernel.service_configs import ConfigKind, ServiceConfig

if TYPE_CHECKING:  # experiments.releases reads the records defined here
    from controlplane.experiments.releases import ReleaseChange, ReleaseRecord, StableRecord


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
    # the versions' labels (None: unlabelled, the upstream names the version)
    baseline_version: str | None = None
    canary_version: str | None = None
    # the baseline was left out: the start takes the service's stable version then
    baseline_follows_stable: bool = False


@dataclass(frozen=True)
class StepRecord:
    position: int
    weight_bp: int
    hold_sec: int


@dataclass(frozen=True)
class ExperimentRecord:
    """One experiment as stored: its spec and its runtime state, at `version`.

    `version` grows with every write; `save_state` of a record read at an older
    version fails with RevisionConflict (someone else moved the experiment).
    """

    id: int
    name: str
    service: str
    state: ExperimentState
    salt: str
    baseline_upstream: str
    canary_upstream: str
    steps: tuple[StepRecord, ...]
    sticky_header: str | None
    sticky_cookie: str | None
    rule: dict[str, Any] | None
    current_step: int
    canary_weight_bp: int
    breaker_state: BreakerState
    trips: int
    step_started_at: datetime | None
    breaker_changed_at: datetime | None
    route_revision: int
    rollout_state: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    version: int
    baseline_version: str | None = None
    canary_version: str | None = None
    baseline_follows_stable: bool = False

    @property
    def spec(self) -> ExperimentSpec:
        return ExperimentSpec(
            name=self.name,
            service=self.service,
            baseline_upstream=self.baseline_upstream,
            canary_upstream=self.canary_upstream,
            steps=tuple(StepSpec(s.weight_bp, s.hold_sec) for s in self.steps),
            sticky_header=self.sticky_header,
            sticky_cookie=self.sticky_cookie,
            rule=self.rule,
            baseline_version=self.baseline_version,
            canary_version=self.canary_version,
            baseline_follows_stable=self.baseline_follows_stable,
        )


@dataclass(frozen=True)
class ExperimentVersion:
    """Which version of an experiment is stored: enough to tell whether a record read
    before is still the stored one."""

    id: int
    version: int


@dataclass(frozen=True)
class EventRecord:
    """One entry of the audit trail."""

    id: int
    experiment_id: int | None
    service: str
    at: datetime
    actor: str
    kind: str
    from_state: str | None
    to_state: str | None
    reason: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class ShardSelection:
    """The experiments of some shards among `count` (decision 0057): those whose id
    modulo `count` is one of `shards`."""

    count: int
    shards: frozenset[int]


class StoreTransaction(Protocol):
    """The operations of one unit of work; nothing is visible to others before commit."""

    async def load_experiment(self, *, experiment_id: int) -> ExperimentRecord:
        """The experiment; NotFound when there is none."""
        ...

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
        """Experiments newest first (a page of them with `limit`), and the total;
        with `shards`, only the experiments of those shards."""
        ...

    async def create_experiment(
        self, *, spec: ExperimentSpec, salt: str, now: datetime
    ) -> ExperimentRecord:
        """A new draft."""
        ...

    async def save_spec(
        self, *, experiment: ExperimentRecord, spec: ExperimentSpec, now: datetime
    ) -> ExperimentRecord:
        """Replace the user-defined part of the experiment (variants and steps too)."""
        ...

    async def save_state(self, *, experiment: ExperimentRecord) -> ExperimentRecord:
        """Write the runtime state of `experiment` (state, breaker, step, weight, the
        rollout memory, timestamps); RevisionConflict when the stored one moved on
        since `experiment.version`."""
        ...

    async def list_versions(
        self,
        *,
        states: Collection[ExperimentState] | None = None,
        shards: ShardSelection | None = None,
    ) -> list[ExperimentVersion]:
        """Each matching experiment's id and version, newest first, without the rest
        of its row."""
        ...

    async def load_experiments(self, *, ids: Collection[int]) -> list[ExperimentRecord]:
        """The experiments of `ids` that exist, in no particular order."""
        ...

    async def save_states(
        self, *, experiments: Sequence[ExperimentRecord],
        evidence_stored: Sequence[bool] | None = None,
    ) -> list[ExperimentRecord | None]:
        """`save_state` of each, without reading the rows first; per experiment its
        record at the new version, or None when the stored one moved on (or is gone)
        since `experiment.version`: that row is left as it is, the others written.

        `evidence_stored[i]`: the caller knows the store already holds the step's
        evidence of `experiments[i]`'s memory (experiments.memory_parts), so only the
        rest of the memory is written; by default every part is written."""
        ...

    async def delete_experiment(self, *, experiment: ExperimentRecord) -> None: ...

    async def save_desired_route(
        self, *, experiment: ExperimentRecord, canary_bp: int, state: RouteState,
        now: datetime,
    ) -> tuple[Route, ExperimentRecord]:
        """Make the experiment's route (`canary_bp`, `state`) its service's next desired
        route, one revision above the last; the experiment notes that revision."""
        ...

    async def load_service_config(
        self, *, kind: ConfigKind, service: str
    ) -> ServiceConfig | None:
        """The service's desired breaker rule or overload protection; None without one."""
        ...

    async def save_service_config(
        self, *, kind: ConfigKind, service: str, config: ServiceConfig, now: datetime,
        expected: ServiceConfig | None,
    ) -> None:
        """Make `config` the service's desired one in place of `expected` (what the
        caller read; None: none, or unreadable); RevisionConflict when it changed."""
        ...

    async def remove_service_config(
        self, *, kind: ConfigKind, service: str, expected: ServiceConfig | None
    ) -> None:
        """Remove the service's desired config, `expected`; Conflict when it changed or
        is gone meanwhile."""
        ...

    async def hold_shard(self, *, shard: int, fence: int, owner: str, now: datetime) -> None:
        """Fence this unit of work by the shard's owner fence (decision 0057): NotLeader
        when a greater fence holds the shard, so nothing of it commits."""
        ...

    async def load_stable_version(self, *, service: str) -> StableRecord | None:
        """The service's stable version; None before its first experiment starts."""
        ...

    async def record_release(
        self, *, service: str, experiment_id: int, change: ReleaseChange, actor: str,
        at: datetime,
    ) -> ReleaseRecord:
        """Append `change` to the service's release history, and make its `after` the
        stable version when it moves it."""
        ...

    async def list_releases(
        self, *, service: str, limit: int = 50, offset: int = 0
    ) -> tuple[list[ReleaseRecord], int]:
        """A page of the service's release history, newest first, and its length."""
        ...

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
    ) -> EventRecord: ...

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
        """A page of events (in the order they happened, or newest first) and the total."""
        ...


class ExperimentStore(Protocol):
    """Experiments, desired routes and events, behind one unit of work at a time."""

    def transaction(self) -> AbstractAsyncContextManager[StoreTransaction]:
        """Commit when the block ends normally; roll back on any exception."""
        ...
