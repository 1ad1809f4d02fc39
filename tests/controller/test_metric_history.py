# ruff: noqa: F811
"""The controller's leader records each provider metric reading once in the history,
with the bound the canary was held to (decision 0022's plots, one per metric).

The rig of test_controller_integration; the board a plain stand-in implementing the
controller's side of the interface, as in test_metric_wiring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from controlplane.kernel.metric_specs import MetricSpec
from controlplane.providers.evidence import MetricEvidence, Reading
from tests.controller.test_controller_integration import Rig, rig  # noqa: F401
from tests.controller.test_metric_wiring import with_metrics

EVERY_SEC = 5


class ReadEveryFiveSeconds:
    """Answers `latest` with a reading taken every 5 s of the rig's clock."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def track(self, experiment_id: str, service: str, specs: Sequence[MetricSpec],
              window_sec: int, variants: tuple[str, str]) -> None:  # fmt: skip
        pass

    def forget(self, experiment_id: str) -> None:
        pass

    def latest(self, experiment_id: str) -> Mapping[str, MetricEvidence]:
        read_at = math.floor(self.rig.clock.now() / EVERY_SEC) * EVERY_SEC + 0.25
        return {"memory": MetricEvidence("memory", Reading(read_at % 97), Reading(40.0), read_at)}


async def test_each_reading_is_recorded_once_with_its_bound(rig: Rig) -> None:
    rig.controller.metric_board = ReadEveryFiveSeconds(rig)
    await with_metrics(rig)  # the rule's memory metric: absolute, bound 100
    start = int(rig.clock.now())
    for _ in range(20):
        await rig.second(canary_ms=40)

    found = await rig.backends.history.read_metrics(
        experiment_id=rig.experiment_id, start=start - 10, end=int(rig.clock.now()), width=1
    )

    assert [p.name for p in found] == ["memory"] * len(found)
    assert [p.at for p in found] == sorted({p.at for p in found}), "once per reading"
    assert all(p.at % EVERY_SEC == 0 for p in found) and 4 <= len(found) <= 5
    assert {(p.baseline, p.bound, p.kind, p.compare) for p in found} == {
        (40.0, 100.0, "gauge", "absolute")
    }
    windows = await rig.backends.history.read(
        experiment_id=rig.experiment_id, start=start - 10, end=int(rig.clock.now()), width=1
    )
    assert rig.controller.history.pending == 0
    # nothing queued twice (the table would refuse a second copy; the queue must not hold one)
    assert rig.controller.history.stats.written == len(windows) + len(found)
