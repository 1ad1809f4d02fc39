"""plan_values, the reconciler's decision for keys without a revision of their own
(window rules, breaker rules, overload protection): desired vs stored → changes. A table."""

from __future__ import annotations

import pytest

from controlplane.controller.value_plan import StoredValue, ValueChange, ValueFound, plan_values

CASES = [
    # desired, stored → changes
    ("in sync", {"a": 1}, {"a": StoredValue(1, 40)}, []),
    ("missing", {"a": 1}, {}, [ValueChange("a", 1, 0, ValueFound.MISSING)]),
    ("another value", {"a": 1}, {"a": StoredValue(2, 40)},
     [ValueChange("a", 1, 40, ValueFound.FOREIGN)]),
    ("unreadable", {"a": 1}, {"a": StoredValue(None, 40)},
     [ValueChange("a", 1, 40, ValueFound.UNREADABLE)]),
    ("not desired", {}, {"a": StoredValue(2, 40)},
     [ValueChange("a", None, 40, ValueFound.UNOWNED)]),
    ("not desired, unreadable", {}, {"a": StoredValue(None, 40)},
     [ValueChange("a", None, 40, ValueFound.UNOWNED)]),
    ("several, in name order", {"b": 1, "a": 1}, {"c": StoredValue(1, 7), "a": StoredValue(1, 3)},
     [ValueChange("b", 1, 0, ValueFound.MISSING), ValueChange("c", None, 7, ValueFound.UNOWNED)]),
    ("nothing either side", {}, {}, []),
]


@pytest.mark.parametrize(
    ("desired", "stored", "changes"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_plan(
    desired: dict[str, int], stored: dict[str, StoredValue[int]], changes: list[ValueChange[int]]
) -> None:
    assert plan_values(desired, stored) == changes
