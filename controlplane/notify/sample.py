"""The sample event `canary notify test` and the API's test send announce: a trip,
shaped like a real one, marked `"sample": true`, with event id 0 (never a real one)."""

from __future__ import annotations

from datetime import datetime

from controlplane.experiments.events import EventKind
from controlplane.notify.records import AnnouncedEvent

SAMPLE_EXPERIMENT_ID = 0


def sample_event(at: datetime, *, service: str = "example-service") -> AnnouncedEvent:
    now = at.timestamp()
    window = {"window_start": now - 60, "window_end": now}
    return AnnouncedEvent(
        event_id=0,
        kind=EventKind.TRIPPED,
        service=service,
        experiment_id=SAMPLE_EXPERIMENT_ID,
        experiment_name="sample notification",
        at=at,
        actor="controller",
        from_state="closed",
        to_state="open",
        reason="sample notification: trip 1 of 3 (stop: canary 0 bp); "
        "p95 412.0 ms above threshold_ms 250.0",
        payload={
            "sample": True,
            "from": "closed",
            "to": "open",
            "evidence": {
                "breaker": {"before": "closed", "after": "open"},
                "weights": {"canary_bp_before": 500, "canary_bp_after": 0},
                "trips": 1,
                "at": now,
                "rule": {"percentile": 95, "threshold_ms": 250.0, "max_trips": 3,
                         "cooldown_sec": 300, "half_open_weight": 100},
                "window": {
                    "verdict": "breach",
                    "variants": {
                        "canary": {"percentile_ms": 412.0, "p95_ms": 412.0, "count": 240,
                                   "above_threshold_fraction": 0.21, **window},
                        "baseline": {"percentile_ms": 96.0, "p95_ms": 96.0, "count": 4560},
                    },
                    "guardrails": {
                        "latency": {"basis": "exact_above_threshold_count", "observed": 0.21,
                                    "bound": 0.05, "exceeded": True, "breached": True},
                    },
                    "action": "stop",
                    "action_by": "latency",
                },
            },
        },
    )
