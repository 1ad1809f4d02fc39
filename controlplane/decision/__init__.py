"""The decision core: breaker, rollout schedule and statistics as pure functions.

It gets window snapshots and returns decisions; it imports no adapter, reads no
clock and does no I/O (architecture §11).
"""

from controlplane.decision.breaker import Evaluation, Guardrail, Verdict, evaluate
from controlplane.decision.model import (
    BREAKER_TRANSITIONS,
    EXPERIMENT_TRANSITIONS,
    Decision,
    Promote,
    RecordEvent,
    Rollback,
    RolloutEffect,
    RolloutState,
    SetCanaryWeight,
    Step,
    transition,
)
from controlplane.decision.rollout import decide, start
from controlplane.experiments.events import EventKind
from controlplane.experiments.lifecycle import BreakerState, ExperimentState

__all__ = [
    "BREAKER_TRANSITIONS",
    "EXPERIMENT_TRANSITIONS",
    "BreakerState",
    "Decision",
    "Evaluation",
    "EventKind",
    "ExperimentState",
    "Guardrail",
    "Promote",
    "RecordEvent",
    "Rollback",
    "RolloutEffect",
    "RolloutState",
    "SetCanaryWeight",
    "Step",
    "Verdict",
    "decide",
    "evaluate",
    "start",
    "transition",
]
