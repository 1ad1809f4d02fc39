"""When a half-open probe can reach its verdict, estimated from its own traffic.

The probe is judged once its window is over *and* it has seen `min_samples` canary
samples (decision/rollout.py, `_while_half_open`). At a small probe weight the second
condition dominates: 30 samples at 1% of a quiet service take minutes, not the
window's seconds. The estimate divides the samples still missing by the canary
samples per second the probe has seen so far; with no sample yet it says so instead
of guessing. Pure: the live view calls it with what it read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeEstimate:
    weight_bp: int
    seen: int  # canary samples counted since the probe began
    needed: int  # the rule's min_samples
    rate_per_sec: float | None  # canary samples per second so far; None before any
    window_ends_at: float
    verdict_at: float | None  # the earliest time a verdict can come; None: unknown
    sentence: str


def duration_text(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 5 min': a human reading of a duration."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        minutes, secs = divmod(total, 60)
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, rest = divmod(total, 3600)
    return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"


def rate_text(per_sec: float) -> str:
    """'0.14', '15', '12000': two significant digits below 10, whole numbers above, and
    never an exponent ('1.2e+02' is what `:.2g` makes of 120)."""
    if per_sec >= 10:
        return f"{per_sec:.0f}"
    if per_sec >= 0.0001:
        return f"{per_sec:.2g}"
    return "under 0.0001"


def estimate_probe(
    *,
    weight_bp: int,
    started_at: float,
    window_sec: float,
    seen: int,
    needed: int,
    now: float,
) -> ProbeEstimate:
    window_ends_at = started_at + window_sec
    elapsed = max(0.0, now - started_at)
    rate = seen / elapsed if seen > 0 and elapsed > 0 else None
    missing = max(0, needed - seen)
    where = f"probing at {weight_bp / 100:g}% of traffic: {seen} of {needed} canary samples"
    if missing == 0:
        verdict_at: float | None = max(window_ends_at, now)
        when = ("verdict at the next look" if now >= window_ends_at
                else f"verdict when the window ends, in {duration_text(window_ends_at - now)}")
    elif rate is None:
        verdict_at = None
        when = (f"no canary sample in {duration_text(elapsed)}: no verdict until the canary "
                "receives traffic")
    else:
        samples_at = now + missing / rate
        verdict_at = max(window_ends_at, samples_at)
        slower = " (the samples, not the window, set the pace)" if samples_at > window_ends_at \
            else ""
        when = (f"at {rate_text(rate)} samples/s the verdict is due in about "
                f"{duration_text(verdict_at - now)}{slower}")
    return ProbeEstimate(weight_bp=weight_bp, seen=seen, needed=needed, rate_per_sec=rate,
                         window_ends_at=window_ends_at, verdict_at=verdict_at,
                         sentence=f"{where}; {when}")  # fmt: skip
