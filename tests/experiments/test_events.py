"""Event kinds are one enum: values fixed (they are stored and sent), every kind with a
say about its topic, and the notification topics derived from it."""

from __future__ import annotations

import pytest

from controlplane.experiments.events import ACTIONS, DECIDED, EventKind
from controlplane.experiments.lifecycle import LifecycleAction
from controlplane.notify import kinds

# The values as the events table holds them and webhooks send them: a changed value
# would leave stored rows that no longer read back as their kind.
STORED_VALUES = {
    "started", "tripped", "half_open", "probe_passed", "probe_failed", "rolled_back",
    "step_advanced", "promoted", "srm_detected", "srm_cleared", "no_data",
    "overload_hold", "overload_cleared", "guardrail_hold", "guardrail_released",
    "created", "updated", "deleted", "start",
    "pause", "resume", "promote", "rollback", "abort", "rule_changed",
    "overload_changed", "rule_rejected", "no_rule", "route_reconciled",
    "rule_reconciled", "overload_reconciled", "config_imported",
}  # fmt: skip


def test_the_stored_values_are_the_kinds_values() -> None:
    assert {kind.value for kind in EventKind} == STORED_VALUES


@pytest.mark.parametrize("kind", list(EventKind))
def test_a_stored_value_reads_back_as_its_member(kind: EventKind) -> None:
    assert EventKind(str(kind)) is kind
    assert EventKind(kind.value) is kind
    assert kind == kind.value  # compared with a plain string read from a row


def test_a_value_outside_the_enum_is_no_kind() -> None:
    with pytest.raises(ValueError):
        EventKind("rule-changed")


@pytest.mark.parametrize("action", list(LifecycleAction))
def test_every_user_action_records_the_kind_of_its_name(action: LifecycleAction) -> None:
    assert EventKind.of_action(action).value == action.value
    assert EventKind.of_action(action) in ACTIONS


def test_the_rollouts_kinds_and_the_users_are_apart() -> None:
    assert DECIDED.isdisjoint(ACTIONS)
    assert EventKind.STARTED in DECIDED and EventKind.START in ACTIONS


def test_the_topics_are_derived_from_the_kinds() -> None:
    announced = {kind for kind in EventKind if kind.topic is not None}
    assert {kind.value for kind in announced} == kinds.NOTIFIABLE_KINDS
    for topic, members in kinds.TOPICS.items():
        assert members, f"topic {topic} has no kind"
        assert all(EventKind(value).topic == topic for value in members)
    assert {value for members in kinds.TOPICS.values() for value in members} == {
        kind.value for kind in announced
    }
    assert all(kinds.topic_of(kind) == kind.topic for kind in announced)


@pytest.mark.parametrize(
    ("kind", "topic"),
    [
        (EventKind.TRIPPED, "trip"),
        (EventKind.PROBE_FAILED, "probe"),
        (EventKind.ABORT, "rollback"),
        (EventKind.PROMOTE, "promotion"),
        (EventKind.OVERLOAD_CHANGED, "rules"),
        (EventKind.ROUTE_RECONCILED, "routes"),
        (EventKind.STARTED, None),
        (EventKind.CREATED, None),
        (EventKind.UPDATED, None),
    ],
)
def test_a_kind_is_announced_under_its_topic_or_not_at_all(
    kind: EventKind, topic: str | None
) -> None:
    assert kind.topic == topic
    assert kinds.wants((), kind) is (topic is not None)


def test_a_topic_expands_to_its_kinds() -> None:
    assert kinds.expand(["rollback"]) == ("abort", "rollback", "rolled_back")
    assert kinds.expand(["lifecycle", "tripped"]) == ("pause", "resume", "start", "tripped")
