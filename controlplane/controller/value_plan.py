"""What the leader does about keyed values without a revision of their own (window
rules, breaker rules, overload protection): desired (SQL) vs stored (etcd) → writes
and deletes. Pure and level-triggered, like route_plan; the reconciler reads both
sides and applies the changes, each a compare-and-swap on the mod revision it read.

    desired, stored equal          → nothing
    desired, stored other          → write (foreign: somebody else wrote it)
    desired, stored unreadable     → write
    desired, stored missing        → write
    stored, not desired            → delete (unowned: ended, removed, or never known)

Nothing in a value says it is newer than another: the last write to etcd is the one
consumers hold, so the leader's write supersedes whatever a hand wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")


class ValueFound(StrEnum):
    """What the reconciler found in etcd, as the repair events name it."""

    MISSING = "missing"
    FOREIGN = "foreign"  # another value than the desired one
    UNREADABLE = "unreadable"
    UNOWNED = "unowned"  # a value the database has none for


@dataclass(frozen=True)
class StoredValue(Generic[T]):
    """One key in etcd: its value (None: unreadable) and mod revision."""

    value: T | None
    mod_revision: int


@dataclass(frozen=True)
class ValueChange(Generic[T]):
    name: str  # the key's last segment: an experiment id, a service
    write: T | None  # None: delete the key
    expected_mod_revision: int  # 0: the key must not exist
    found: ValueFound


def plan_values(
    desired: Mapping[str, T], stored: Mapping[str, StoredValue[T]]
) -> list[ValueChange[T]]:
    """The writes and deletes that make the stored values equal the desired ones."""
    changes: list[ValueChange[T]] = []
    for name in sorted(set(desired) | set(stored)):
        want = desired.get(name)
        held = stored.get(name)
        if want is None:
            assert held is not None
            changes.append(ValueChange(name, None, held.mod_revision, ValueFound.UNOWNED))
        elif held is None:
            changes.append(ValueChange(name, want, 0, ValueFound.MISSING))
        elif held.value is None:
            changes.append(ValueChange(name, want, held.mod_revision, ValueFound.UNREADABLE))
        elif held.value != want:
            changes.append(ValueChange(name, want, held.mod_revision, ValueFound.FOREIGN))
    return changes
