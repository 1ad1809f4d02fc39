"""What the decision core reads and returns: steps, the rollout state, decisions, effects.

Everything here is a frozen value. The controller keeps the latest `RolloutState`,
hands it to `decide()` with fresh snapshots, applies the returned effects and keeps
`decision.new_state` for the next call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from controlplane.decision.ramp_split import RampSplit
from controlplane.decision.tally import SrmTally, Tally
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import TERMINAL, BreakerState, ExperimentState
from controlplane.experiments.lifecycle import TRANSITIONS as LIFECYCLE_TRANSITIONS
from controlplane.kernel.errors import IllegalTransition
from controlplane.kernel.routes import TOTAL_WEIGHT, RouteState

TERMINAL_STATUSES = TERMINAL

# architecture §7, derived from the one experiment lifecycle table (action-based) so
# the two can never disagree: state -> the states some action leads to from it.
EXPERIMENT_TRANSITIONS: dict[ExperimentState, frozenset[ExperimentState]] = {
    state: frozenset(
        target for sources, target in LIFECYCLE_TRANSITIONS.values() if state in sources
    )
    for state in ExperimentState
}

# architecture §7: closed → open → half_open → closed, or half_open → open on a failed
# probe.
BREAKER_TRANSITIONS: dict[BreakerState, frozenset[BreakerState]] = {
    BreakerState.CLOSED: frozenset({BreakerState.OPEN}),
    BreakerState.OPEN: frozenset({BreakerState.HALF_OPEN}),
    BreakerState.HALF_OPEN: frozenset({BreakerState.CLOSED, BreakerState.OPEN}),
}

_TABLES: dict[type[StrEnum], tuple[str, dict[Any, frozenset[Any]]]] = {
    ExperimentState: ("experiment", EXPERIMENT_TRANSITIONS),
    BreakerState: ("breaker", BREAKER_TRANSITIONS),
}

S = TypeVar("S", ExperimentState, BreakerState)


def transition(current: S, target: S) -> S:
    """The one way a lifecycle moves; refuses anything outside its table."""
    kind, table = _TABLES[type(current)]
    if target not in table[current]:
        raise IllegalTransition(kind, current.value, target.value)
    return target


@dataclass(frozen=True)
class Step:
    """One step of the schedule: the canary's share of traffic and how long it holds."""

    weight_pct: float
    hold_sec: float

    def __post_init__(self) -> None:
        if not 0 < self.weight_pct <= 100:
            raise ValueError(f"step weight {self.weight_pct}% outside (0, 100]")
        if self.hold_sec < 0:
            raise ValueError(f"step hold {self.hold_sec}s is negative")

    @property
    def weight_bp(self) -> int:
        return round(self.weight_pct * TOTAL_WEIGHT / 100)


@dataclass(frozen=True)
class MetricStreak:
    """One provider metric's looks: the reading last counted, breaches and clean looks
    in a row (a reading is counted once, however many looks see it)."""

    read_at: float
    breaches: int = 0
    clean: int = 0

    def to_list(self) -> list[float | int]:
        return [self.read_at, self.breaches, self.clean]

    @classmethod
    def from_list(cls, data: Any) -> MetricStreak:
        read_at, breaches, clean = data
        return cls(float(read_at), int(breaches), int(clean))


@dataclass(frozen=True)
class MetricNoDataPeriod:
    """A provider metric without data: since when, why, and whether the end of its
    hold (no_data_timeout_sec) has been announced."""

    since: float
    reason: str
    expired_reported: bool = False

    def to_list(self) -> list[Any]:
        return [self.since, self.reason, self.expired_reported]

    @classmethod
    def from_list(cls, data: Any) -> MetricNoDataPeriod:
        since, reason, reported = data
        return cls(float(since), str(reason)[:500], bool(reported))


@dataclass(frozen=True)
class RolloutState:
    """One experiment's rollout as the controller last left it.

    `weight_since` is when `canary_bp` took effect; `tally` holds the evidence of
    disjoint windows gathered since then (the current step's, or the probe's).
    `step_index` keeps the step that tripped while the breaker is open or half-open.
    """

    status: ExperimentState
    breaker: BreakerState
    step_index: int
    step_started_at: float
    canary_bp: int
    weight_since: float
    trips: int = 0
    opened_at: float | None = None
    probe_started_at: float | None = None
    consecutive_breaches: int = 0
    last_snapshot_ts: float | None = None
    no_data_since: float | None = None
    # the current no-data period has been announced (a `no_data` event)
    no_data_reported: bool = False
    srm_flagged: bool = False
    # the last look was held because the baseline's sidecars shed (overload: hold)
    overload_held: bool = False
    tally: Tally = field(default_factory=Tally)
    # the sample-ratio check's counts at the current weight (None: none yet)
    srm_tally: SrmTally | None = None
    # every unit's bucket interval across the whole rollout (decision/ramp_split.py)
    ramp_split: RampSplit | None = None
    # provider metrics (decision 0049): per metric, the last reading judged (its
    # read_at), the breaches and clean looks in a row since; a reading counts once
    metric_streaks: Mapping[str, MetricStreak] = field(default_factory=dict)
    # per metric with no data now: since when, and whether its timeout was announced
    metric_no_data: Mapping[str, MetricNoDataPeriod] = field(default_factory=dict)
    # fresh looks in a row whose latency and failures did not breach (a pause's release)
    samples_clean: int = 0
    # guardrails whose `pause` holds the weight now, since when, and why
    held_by: tuple[str, ...] = ()
    held_since: float | None = None
    held_reason: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.canary_bp <= TOTAL_WEIGHT:
            raise ValueError(f"canary weight {self.canary_bp} outside 0..{TOTAL_WEIGHT}")

    def with_changes(self, **changes: Any) -> RolloutState:
        """`replace(self, **changes)`, checked the same, without __init__'s call per
        field: a look changes a few fields of two dozen, once or twice."""
        unknown = changes.keys() - _STATE_FIELDS.keys()
        if unknown:
            raise TypeError(f"RolloutState has no field {sorted(unknown)[0]!r}")
        values = {name: self.__dict__[name] for name in _STATE_FIELDS}
        values.update(changes)
        copy = object.__new__(RolloutState)
        copy.__dict__.update(values)
        copy.__post_init__()
        return copy

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for the controller to persist or show."""
        return {
            # `_value_`: without the enum descriptor's call, at every look
            "status": self.status._value_,
            "breaker": self.breaker._value_,
            "step_index": self.step_index,
            "step_started_at": self.step_started_at,
            "canary_bp": self.canary_bp,
            "weight_since": self.weight_since,
            "trips": self.trips,
            "opened_at": self.opened_at,
            "probe_started_at": self.probe_started_at,
            "consecutive_breaches": self.consecutive_breaches,
            "last_snapshot_ts": self.last_snapshot_ts,
            "no_data_since": self.no_data_since,
            "no_data_reported": self.no_data_reported,
            "srm_flagged": self.srm_flagged,
            "overload_held": self.overload_held,
            "tally": self.tally.to_dict(),
            "srm_tally": self.srm_tally.to_dict() if self.srm_tally is not None else None,
            "ramp_split": self.ramp_split.to_dict() if self.ramp_split is not None else None,
            "metric_streaks": {k: v.to_list() for k, v in self.metric_streaks.items()},
            "metric_no_data": {k: v.to_list() for k, v in self.metric_no_data.items()},
            "samples_clean": self.samples_clean,
            "held_by": list(self.held_by),
            "held_since": self.held_since,
            "held_reason": self.held_reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutState:
        return cls(
            status=ExperimentState(data["status"]),
            breaker=BreakerState(data["breaker"]),
            step_index=int(data["step_index"]),
            step_started_at=float(data["step_started_at"]),
            canary_bp=int(data["canary_bp"]),
            weight_since=float(data["weight_since"]),
            trips=int(data.get("trips", 0)),
            opened_at=data.get("opened_at"),
            probe_started_at=data.get("probe_started_at"),
            consecutive_breaches=int(data.get("consecutive_breaches", 0)),
            last_snapshot_ts=data.get("last_snapshot_ts"),
            no_data_since=data.get("no_data_since"),
            no_data_reported=bool(data.get("no_data_reported", False)),
            srm_flagged=bool(data.get("srm_flagged", False)),
            overload_held=bool(data.get("overload_held", False)),
            tally=Tally.from_dict(data["tally"]) if data.get("tally") else Tally(),
            srm_tally=SrmTally.from_dict(data["srm_tally"]) if data.get("srm_tally") else None,
            ramp_split=RampSplit.from_dict(data["ramp_split"]) if data.get("ramp_split") else None,
            metric_streaks={
                str(k): MetricStreak.from_list(v)
                for k, v in (data.get("metric_streaks") or {}).items()
            },
            metric_no_data={
                str(k): MetricNoDataPeriod.from_list(v)
                for k, v in (data.get("metric_no_data") or {}).items()
            },
            samples_clean=int(data.get("samples_clean", 0)),
            held_by=tuple(str(n) for n in data.get("held_by") or ()),
            held_since=data.get("held_since"),
            held_reason=data.get("held_reason"),
        )


# the state's fields, in order (with_changes)
_STATE_FIELDS = {f.name: f for f in fields(RolloutState)}


@dataclass(frozen=True)
class SetCanaryWeight:
    """Write the route: `canary_bp` to the canary, the rest to the baseline."""

    canary_bp: int
    route_state: RouteState

    def __post_init__(self) -> None:
        if not 0 <= self.canary_bp <= TOTAL_WEIGHT:
            raise ValueError(f"canary weight {self.canary_bp} outside 0..{TOTAL_WEIGHT}")


@dataclass(frozen=True)
class Promote:
    """Mark the experiment promoted (the route write comes as its own effect)."""


@dataclass(frozen=True)
class Rollback:
    """Mark the experiment rolled back for good (the route write comes as its own effect)."""


@dataclass(frozen=True)
class RecordEvent:
    """An event row: `payload` carries the transition and the numbers behind it."""

    kind: EventKind
    reason: str
    payload: dict[str, Any]


RolloutEffect = SetCanaryWeight | Promote | Rollback | RecordEvent


@dataclass(frozen=True)
class Decision:
    """What `decide` concluded. `next_check_at` is the latest time to call it again."""

    new_state: RolloutState
    effects: tuple[RolloutEffect, ...]
    reason: str
    evidence: dict[str, Any]
    next_check_at: float | None

    @property
    def route_write(self) -> SetCanaryWeight | None:
        return next((a for a in self.effects if isinstance(a, SetCanaryWeight)), None)

    @property
    def events(self) -> tuple[RecordEvent, ...]:
        return tuple(a for a in self.effects if isinstance(a, RecordEvent))
