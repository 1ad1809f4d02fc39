"""Sharded controllers (decision 0057): an experiment handed over to another replica
is not merged as ended by the one that judged it before."""

from __future__ import annotations

from collections.abc import Collection

from controlplane.history.recorder import HistoryRecorder
from controlplane.kernel.rules import parse_rule

RULE = parse_rule({"service": "shop", "threshold_ms": 300})


class Spans:
    """Only what merging ended experiments asks of the history store."""

    def __init__(self) -> None:
        self.asked: list[set[int] | None] = []

    async def spans(self, *, experiment_ids: Collection[int] | None) -> dict[int, object]:
        self.asked.append(None if experiment_ids is None else set(experiment_ids))
        return {}

    async def metric_spans(self, *, experiment_ids: Collection[int] | None) -> dict[int, object]:
        return {}

    async def compact(self, **_: object) -> int:
        return 0


async def test_a_handed_over_experiment_is_not_taken_for_an_ended_one() -> None:
    recorder = HistoryRecorder()
    store = Spans()
    for experiment in (1, 2, 3):
        recorder.observe(experiment, {}, RULE, 500, 100.0)
    await recorder.keep(store, [1, 2, 3], 100.0)  # type: ignore[arg-type]
    assert recorder.seen == {1, 2, 3}

    recorder.hand_over([2])
    # 3 ended: the only one this replica merges; 2 runs on elsewhere
    await recorder.keep(store, [1], 101.0)  # type: ignore[arg-type]

    assert store.asked[-1] == {3}
    assert recorder.seen == {1}
