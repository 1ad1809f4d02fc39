"""The kinds of the audit trail: every `events` row is one of these (architecture §7).

A member's value is what the events table stores and what webhooks send, so it never
changes; a new kind is a new member. Each kind names the topic a subscription would
find it under (`topic`), or None when it is not announced: the notification topics are
derived from this table (notify/kinds.py), so a kind cannot be written without
deciding whether it is announced.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from controlplane.experiments.lifecycle import LifecycleAction


class EventKind(StrEnum):
    # decided by the rollout (decision/rollout.py)
    STARTED = "started"
    TRIPPED = "tripped"
    HALF_OPEN = "half_open"
    PROBE_PASSED = "probe_passed"
    PROBE_FAILED = "probe_failed"
    ROLLED_BACK = "rolled_back"
    STEP_ADVANCED = "step_advanced"
    PROMOTED = "promoted"
    SRM_DETECTED = "srm_detected"
    SRM_CLEARED = "srm_cleared"
    NO_DATA = "no_data"
    OVERLOAD_HOLD = "overload_hold"
    OVERLOAD_CLEARED = "overload_cleared"
    # a guardrail whose action is `pause` holds the weight, and lets it go again
    GUARDRAIL_HOLD = "guardrail_hold"
    GUARDRAIL_RELEASED = "guardrail_released"
    # a user's edits and actions (experiments/actions.py; the actions are LifecycleAction)
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"
    START = "start"
    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    ABORT = "abort"
    # a service's settings (experiments/service_configs.py)
    RULE_CHANGED = "rule_changed"
    OVERLOAD_CHANGED = "overload_changed"
    # the controller (controller/runner.py, reconciler.py, configs.py)
    RULE_REJECTED = "rule_rejected"
    NO_RULE = "no_rule"
    ROUTE_RECONCILED = "route_reconciled"
    RULE_RECONCILED = "rule_reconciled"
    OVERLOAD_RECONCILED = "overload_reconciled"
    CONFIG_IMPORTED = "config_imported"

    @property
    def topic(self) -> str | None:
        """The notification topic it is announced under; None: not announced."""
        return _TOPIC[self]

    @classmethod
    def of_action(cls, action: LifecycleAction) -> EventKind:
        """The event a user's action on an experiment records."""
        return cls(action.value)


_K = EventKind
_TOPIC: Final[dict[EventKind, str | None]] = {
    _K.STARTED: None,
    _K.TRIPPED: "trip",
    _K.HALF_OPEN: "probe",
    _K.PROBE_PASSED: "probe",
    _K.PROBE_FAILED: "probe",
    _K.ROLLED_BACK: "rollback",
    _K.STEP_ADVANCED: "step",
    _K.PROMOTED: "promotion",
    _K.SRM_DETECTED: "srm",
    _K.SRM_CLEARED: "srm",
    _K.NO_DATA: "no_data",
    _K.OVERLOAD_HOLD: "overload",
    _K.OVERLOAD_CLEARED: "overload",
    _K.GUARDRAIL_HOLD: "guardrail",
    _K.GUARDRAIL_RELEASED: "guardrail",
    _K.CREATED: None,
    _K.UPDATED: None,
    _K.DELETED: None,
    _K.START: "lifecycle",
    _K.PAUSE: "lifecycle",
    _K.RESUME: "lifecycle",
    _K.PROMOTE: "promotion",
    _K.ROLLBACK: "rollback",
    _K.ABORT: "rollback",
    _K.RULE_CHANGED: "rules",
    _K.OVERLOAD_CHANGED: "rules",
    _K.RULE_REJECTED: "rules",
    _K.NO_RULE: "rules",
    _K.ROUTE_RECONCILED: "routes",
    _K.RULE_RECONCILED: "rules",
    _K.OVERLOAD_RECONCILED: "rules",
    _K.CONFIG_IMPORTED: "rules",
}
if _TOPIC.keys() != set(EventKind):  # a new kind without a say about its topic
    raise RuntimeError(f"no topic decided for {sorted(set(EventKind) - _TOPIC.keys())}")

# the moves of an experiment a history plot marks: the rollout's and the user's
DECIDED: Final = frozenset({
    _K.STARTED, _K.TRIPPED, _K.HALF_OPEN, _K.PROBE_PASSED, _K.PROBE_FAILED, _K.ROLLED_BACK,
    _K.STEP_ADVANCED, _K.PROMOTED, _K.SRM_DETECTED, _K.SRM_CLEARED, _K.NO_DATA,
    _K.OVERLOAD_HOLD, _K.OVERLOAD_CLEARED, _K.GUARDRAIL_HOLD, _K.GUARDRAIL_RELEASED,
})  # fmt: skip
ACTIONS: Final = frozenset(EventKind.of_action(action) for action in LifecycleAction)
