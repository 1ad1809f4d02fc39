"""The live view and the summary table render what a scenario went through."""

from __future__ import annotations

import io
import time

from rich.console import Console

from controlplane.demo.load import LoadGenerator, LoadStats
from controlplane.demo.scenarios import EventLine, ScenarioProgress, ScenarioSpec
from controlplane.demo.summary import ScenarioResult, all_ok, summary_table
from controlplane.demo.upstreams import UpstreamServer
from controlplane.demo.view import render
from controlplane.kernel.snapshots import WindowSnapshot


def _progress() -> ScenarioProgress:
    spec = ScenarioSpec(
        "degraded", "slow canary", "rolled_back",
        baseline=UpstreamServer("shop v2"), canary=UpstreamServer("shop v3"), degrade_at_step=2,
    )  # fmt: skip
    now = time.time()
    progress = ScenarioProgress(
        spec, status="done", experiment_id=2, state="rolled_back", current_step=2,
        breaker_state="open", trips=2, started_at=now - 30, finished_at=now,
        degraded_at=now - 12, tripped_at=now - 10, cut_at=now - 9.9,
        last_canary_request_at=now - 10.1,
    )  # fmt: skip
    progress.snapshots["canary"] = WindowSnapshot(
        experiment="2", variant="canary", count=61, failures=0, window_sec=5, ts=now,
        window_start=now - 5, window_end=now, p50_ms=391.0, p95_ms=595.0, p99_ms=1151.0,
    )  # fmt: skip
    progress.events.append(EventLine(now - 10, "tripped", "trip 1 of 2: " + "x" * 300))
    return progress


def test_live_view_shows_state_weights_stats_and_events() -> None:
    console = Console(file=io.StringIO(), width=100)
    console.print(render([_progress()], LoadGenerator("127.0.0.1", 1)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    for expected in ("rolled_back", "step 3/4", "canary 0%", "open", "595 ms", "tripped"):
        assert expected in text
    assert "failed by the sidecar 0" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_summary_reports_timings_and_verdict() -> None:
    good = ScenarioResult(_progress(), LoadStats(sent=6000, ok=5990, upstream_failed=10), 10, 10)
    console = Console(file=io.StringIO(), width=100)
    console.print(summary_table([good]))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "rolled_back (rolled_back)" in text
    assert "2.0 s" in text  # degradation → trip
    assert "as expected" in text and all_ok([good])
    bad = ScenarioResult(_progress(), LoadStats(sent=10, sidecar_failed=1), 10, 10)
    assert not bad.ok and not all_ok([good, bad])
    assert not ScenarioResult(_progress(), LoadStats(), samples_sent=10, samples_counted=9).ok
