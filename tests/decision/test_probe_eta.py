"""The half-open probe's time to verdict, from its own traffic (pure)."""

from __future__ import annotations

import pytest

from controlplane.decision.probe_eta import duration_text, estimate_probe

T0 = 1_800_000_000.0


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (44.6, "45 s"), (60, "1 min"), (200, "3 min 20 s"), (3600, "1 h"),
    (7500, "2 h 5 min"), (-3, "0 s"),
])
def test_durations_read_as_words(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_at_a_small_weight_the_samples_not_the_window_set_the_pace() -> None:
    # the case: 1% probe, 30 samples needed, 12 seen in 84 s (1/7 per second)
    found = estimate_probe(weight_bp=100, started_at=T0, window_sec=10, seen=12, needed=30,
                           now=T0 + 84)
    assert found.rate_per_sec == pytest.approx(12 / 84)
    assert found.verdict_at == pytest.approx(T0 + 84 + 18 * 7)
    assert found.sentence == (
        "probing at 1% of traffic: 12 of 30 canary samples; at 0.14 samples/s the verdict "
        "is due in about 2 min 6 s (the samples, not the window, set the pace)"
    )


def test_with_enough_traffic_the_window_sets_the_pace() -> None:
    found = estimate_probe(weight_bp=1000, started_at=T0, window_sec=60, seen=50, needed=100,
                           now=T0 + 5)
    assert found.verdict_at == T0 + 60
    assert found.sentence.endswith("verdict is due in about 55 s")


def test_without_a_canary_sample_there_is_no_estimate() -> None:
    found = estimate_probe(weight_bp=100, started_at=T0, window_sec=10, seen=0, needed=30,
                           now=T0 + 9)
    assert found.verdict_at is None and found.rate_per_sec is None
    assert found.sentence.endswith(
        "no canary sample in 9 s: no verdict until the canary receives traffic")


@pytest.mark.parametrize(("now", "ending"), [
    (T0 + 4, "verdict when the window ends, in 6 s"),
    (T0 + 12, "verdict at the next look"),
])
def test_with_the_samples_in_only_the_window_is_left(now: float, ending: str) -> None:
    found = estimate_probe(weight_bp=100, started_at=T0, window_sec=10, seen=30, needed=30,
                           now=now)
    assert found.sentence.endswith(ending)
    assert found.verdict_at == max(T0 + 10, now)


@pytest.mark.parametrize(("seen", "elapsed", "rate"), [
    (12, 84, "0.14"), (1, 4000, "0.00025"), (30, 10, "3"), (150, 10, "15"), (1200, 10, "120"),
    (120_000, 10, "12000"),
])
def test_the_probes_rate_reads_as_a_plain_number(seen: int, elapsed: float, rate: str) -> None:
    found = estimate_probe(weight_bp=100, started_at=T0, window_sec=5, seen=seen,
                           needed=seen + 10, now=T0 + elapsed)
    assert f"at {rate} samples/s the verdict" in found.sentence
    assert "e+" not in found.sentence and "e-" not in found.sentence
