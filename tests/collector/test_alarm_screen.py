"""The collector's screen for a canary that just turned worse (decision 0070), on real
windows fed the sidecar's codec batches four times a second, each batch screened as
the collector screens a publish."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from controlplane.collector.alarm_screen import (
    ABOVE,
    FAILURES,
    LATENCY,
    PastWindows,
    canary_window,
    slow_bin,
    turned_worse,
)
from controlplane.collector.service import ALARM_EVERY_SEC
from controlplane.collector.windows import ExperimentWindow, WindowConfig
from controlplane.kernel.codec import BatchBuilder, RawBatch, decode_raw

T0 = 1_800_000_000.0
MEDIAN_US = 40_000
STEP = 0.25  # a batch and a screen


@dataclass
class Arm:
    """How a variant answers: a latency factor over a lognormal, a failure share."""

    slower: float = 1.0
    failing: float = 0.0


@dataclass
class Feed:
    rate: float = 50.0  # samples a second, a tenth of them to the canary
    sigma: float = 0.5
    threshold_ms: float | None = 250.0
    canary: Arm = field(default_factory=Arm)
    baseline: Arm = field(default_factory=Arm)
    seed: int = 1

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.window = ExperimentWindow(
            "e", WindowConfig(10, self.threshold_ms), clock_now=T0, seed=1
        )
        self.now = T0
        self.pasts = PastWindows()

    def _batch(self, n: int) -> RawBatch:
        canary = self.rng.random(n) < 0.1
        latency = self.rng.lognormal(math.log(MEDIAN_US), self.sigma, n)
        slower = np.where(canary, self.canary.slower, self.baseline.slower)
        failing = np.where(canary, self.canary.failing, self.baseline.failing)
        rt = (latency * slower).astype(np.int64)
        builder = BatchBuilder()
        builder.add_columns(
            (self.now - STEP + STEP * np.arange(n) / n).tolist(),
            ["canary" if c else "baseline" for c in canary.tolist()],
            rt.tolist(), np.where(self.rng.random(n) < failing, 503, 200).tolist(),
            self.rng.integers(1, 2**32, n).tolist(), (rt // 4).tolist(),
        )  # fmt: skip
        return decode_raw(builder.encode())

    def run(self, seconds: float) -> list[tuple[float, str]]:
        """Feed and screen every STEP for `seconds`: the alarms, (time since T0, kind),
        at most one each ALARM_EVERY_SEC, the canary's past kept, as the collector
        raises them."""
        alarms: list[tuple[float, str]] = []
        last = -math.inf
        for _ in range(round(seconds / STEP)):
            self.now += STEP
            n = int(self.rng.poisson(self.rate * STEP))
            if n:
                self.window.record(self._batch(n), self.now)
            self.window.advance(self.now)
            if self.now - last < ALARM_EVERY_SEC:
                continue
            slow = slow_bin(self.window)
            kind = turned_worse(self.window, self.now, slow, self.pasts.past("e", self.now))
            self.pasts.keep("e", self.now, canary_window(self.window, slow))
            if kind is not None:
                last = self.now
                alarms.append((round(self.now - T0, 1), kind))
        return alarms


@pytest.mark.parametrize(
    "feed",
    [Feed(rate=50), Feed(rate=500), Feed(rate=10), Feed(rate=50, sigma=1.2),
     Feed(rate=50, threshold_ms=45.0), Feed(rate=200, canary=Arm(failing=0.02),
                                            baseline=Arm(failing=0.02))],
    ids=["50/s", "500/s", "10/s", "heavy-tailed", "threshold-at-the-median", "2%-failing"],
)  # fmt: skip
def test_healthy_traffic_raises_almost_nothing(feed: Feed) -> None:
    # five minutes of a canary like its baseline, screened four times a second: an
    # alarm in vain costs the controller a look, so they must be rare (0-3 measured)
    assert len(feed.run(300)) <= 3


@pytest.mark.parametrize(
    ("arm", "threshold_ms", "kind", "within"),
    [(Arm(failing=1.0), 250.0, {FAILURES}, 1.6),
     (Arm(failing=0.5), 250.0, {FAILURES}, 4.0),
     (Arm(slower=8.0), 250.0, {ABOVE, LATENCY}, 1.6),
     (Arm(slower=4.0), None, {LATENCY}, 3.0)],
    ids=["all-failing", "half-failing", "slow-past-the-threshold", "slower-no-threshold"],
)  # fmt: skip
def test_a_canary_that_turns_bad_is_raised_within_seconds(
    arm: Arm, threshold_ms: float | None, kind: set[str], within: float
) -> None:
    firsts = []
    for seed in range(6):
        feed = Feed(threshold_ms=threshold_ms, seed=seed)
        assert feed.run(20) == [], "raised while healthy"
        feed.canary = arm
        alarms = feed.run(10)
        assert alarms, f"seed {seed}: never raised"
        first_at, first_kind = alarms[0]
        assert first_kind in kind
        firsts.append(first_at - 20)
    assert sorted(firsts)[4] <= within, firsts  # 5 of 6 within `within` seconds


def test_a_canary_turned_bad_with_its_baseline_is_not_raised() -> None:
    # a shared dependency failing is not what the canary's breaker is for
    feed = Feed()
    feed.run(20)
    feed.canary = feed.baseline = Arm(slower=8.0, failing=0.5)
    assert feed.run(10) == []


def test_a_canary_bad_from_its_first_second_is_raised_against_the_baseline() -> None:
    feed = Feed(canary=Arm(failing=1.0))
    alarms = feed.run(5)
    assert alarms and alarms[0][1] == FAILURES


def test_a_canary_bad_for_its_whole_window_is_left_to_the_round() -> None:
    # bad for longer than the window: nothing turned worse, nothing is raised again
    # (a canary with enough samples in its past to be its own reference)
    feed = Feed(rate=100)
    feed.run(20)
    feed.canary = Arm(failing=0.5)
    # raised while it turned, until its past (the window PAST_SEC ago) is bad too
    assert feed.run(15)
    assert feed.run(10) == []


def test_a_collector_that_publishes_seldom_still_raises_a_change() -> None:
    # a collector behind its streams publishes an experiment every few seconds: its
    # past is the window of the last screen, from before the change
    feed = Feed(rate=100)
    feed.run(20)
    feed.canary = Arm(failing=1.0)
    feed.run(4)  # applied, not screened: the collector was busy with the others
    feed.window.advance(feed.now)
    slow = slow_bin(feed.window)
    past = feed.pasts.past("e", feed.now)
    assert past is not None and past.failures == 0
    assert turned_worse(feed.window, feed.now, slow, past) == FAILURES


def test_nothing_is_raised_without_a_canary_or_a_reference() -> None:
    window = ExperimentWindow("e", WindowConfig(10, 250.0), clock_now=T0, seed=1)
    assert slow_bin(window) is None
    assert turned_worse(window, T0, None, None) is None
    quiet = Feed(rate=2, canary=Arm(failing=1.0))  # too few samples to tell anything
    assert quiet.run(10) == []
