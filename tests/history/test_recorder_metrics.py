"""The recorder's queue of provider metric readings: bounded, kept on a failed write."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.history.metric_points import MetricPoint
from controlplane.history.points import HistoryPoint
from controlplane.history.recorder import HistoryRecorder
from controlplane.kernel.errors import CanaryError
from controlplane.kernel.metric_specs import MetricKind, MetricSpec
from controlplane.providers.evidence import MetricEvidence, Reading

MEMORY = MetricSpec(
    name="memory", kind=MetricKind.GAUGE, query='max(rss{variant="$variant"})', bound=1.0
)


def read(at: float) -> dict[str, MetricEvidence]:
    return {"memory": MetricEvidence("memory", Reading(2.0), Reading(1.0), at)}


class Appends:
    """Only `append` of the history store, failing while `down`."""

    def __init__(self) -> None:
        self.down = True
        self.calls: list[tuple[list[HistoryPoint], list[MetricPoint]]] = []

    async def append(
        self, points: Sequence[HistoryPoint], metrics: Sequence[MetricPoint] = ()
    ) -> None:
        if self.down:
            raise CanaryError("database away")
        self.calls.append((list(points), list(metrics)))


def test_the_queue_is_bounded_and_drops_the_oldest_first() -> None:
    recorder = HistoryRecorder(max_pending=2)
    for at in (10.0, 20.0, 30.0):
        recorder.observe_metrics(7, [MEMORY], read(at))
    recorder.observe_metrics(7, [MEMORY], read(30.0))  # the same reading again

    assert recorder.pending == 2 and recorder.stats.dropped == 1


async def test_a_failed_write_keeps_the_readings_for_the_next_round() -> None:
    recorder = HistoryRecorder()
    store = Appends()
    recorder.observe_metrics(7, [MEMORY], read(10.0))

    await recorder.flush(store)  # type: ignore[arg-type]
    assert recorder.pending == 1 and recorder.stats.write_failures == 1

    store.down = False
    recorder.observe_metrics(7, [MEMORY], read(25.0))
    await recorder.flush(store)  # type: ignore[arg-type]
    assert [[p.at for p in metrics] for _, metrics in store.calls] == [[10, 25]]
    assert recorder.pending == 0 and recorder.stats.written == 2
