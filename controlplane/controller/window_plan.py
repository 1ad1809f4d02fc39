"""What the leader does about the experiments' window rules: desired (SQL) vs stored
(etcd) → writes and deletes. Pure and level-triggered, like route_plan.

    desired, stored equal          → nothing
    desired, stored other/missing  → write (compare-and-swap on the stored revision)
    desired, stored unreadable     → write
    stored, not desired            → delete (the experiment ended, or lost its rule)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.kernel.window_rules import WindowRule


@dataclass(frozen=True)
class StoredWindow:
    """An experiment's key in etcd: its window rule (None: unreadable), mod revision."""

    rule: WindowRule | None
    mod_revision: int


@dataclass(frozen=True)
class WindowStep:
    experiment: str
    write: WindowRule | None  # None: delete the key
    expected_mod_revision: int  # 0: the key must not exist


def plan_windows(
    desired: Mapping[str, WindowRule], stored: Mapping[str, StoredWindow]
) -> list[WindowStep]:
    """The writes and deletes that make the stored window rules equal the desired ones."""
    steps: list[WindowStep] = []
    for experiment in sorted(set(desired) | set(stored)):
        want = desired.get(experiment)
        held = stored.get(experiment)
        if want is None:
            assert held is not None
            steps.append(WindowStep(experiment, None, held.mod_revision))
        elif held is None:
            steps.append(WindowStep(experiment, want, 0))
        elif held.rule != want:
            steps.append(WindowStep(experiment, want, held.mod_revision))
    return steps
