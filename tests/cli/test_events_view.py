"""`canary exp events` and `show` at 80 columns: the sentence and the reason whole,
wrapped on lines of their own (a table column cut them to 4 characters)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from controlplane.cli.experiments import _events_view, _experiment_view, event_text

SENTENCE = (
    "tripped (trip 1 of 3): canary P95 407 ms > bound 200 ms over the last 10 s, n=68 (30.0% "
    "above it, 5.0% allowed); baseline P95 88 ms; canary cut to 0%, probed again at 1% from "
    "2027-01-15T08:01:20Z"
)
REASON = (
    "trip 1 of 3 (stop: canary 0 bp); 2 breached evaluations in a row; window: breach: latency "
    "0.3 vs bound 0.05 (exact_above_threshold_count), binomial_quantile p=7.86e-63"
)
EVENT: dict[str, Any] = {
    "at": "2027-01-15T08:00:20+00:00", "actor": "controller", "kind": "tripped",
    "from_state": "closed", "to_state": "open", "reason": REASON, "summary": SENTENCE,
}  # fmt: skip


def rendered(renderable: Any, width: int = 80) -> str:
    console = Console(width=width, record=True, markup=False, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_each_event_has_its_sentence_and_reason_whole_at_80_columns() -> None:
    text = rendered(_events_view([EVENT, {**EVENT, "kind": "pause", "summary": "paused by x",
                                          "reason": "paused by x"}]))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "2027-01-15T08:00:20Z  controller  tripped  closed → open"
    joined = " ".join(line.strip() for line in lines)
    assert SENTENCE in joined and f"reason: {REASON}" in joined
    # a reason that says no more than the sentence is not repeated
    assert joined.count("paused by x") == 1


def test_show_and_wait_say_where_the_rollout_stands_in_words() -> None:
    experiment = {
        "id": 7, "state": "running", "steps": [{"weight_pct": 1, "hold_sec": 60}],
        "current_step": 0, "canary_weight_bp": 100, "summary": "holding step 1 of 1 (1%) until "
        "2027-01-15T08:01:00Z",
        "live": {"summary": "holding step 1 of 1 (1%) until 08:01:00Z (in 40 s)"},
    }  # fmt: skip
    assert "holding step 1 of 1 (1%) until 08:01:00Z (in 40 s)" in rendered(
        _experiment_view(experiment), width=120
    )
    assert event_text(EVENT) == f"tripped closed → open: {SENTENCE}"


def test_status_says_the_standing_and_the_latest_event_whole() -> None:
    from controlplane.cli.experiments import _status_view

    experiment = {
        "id": 7, "service": "shop", "state": "running", "current_step": 0, "trips": 1,
        "steps": [{"weight_pct": 1, "hold_sec": 60}], "canary_weight_bp": 0,
        "breaker_state": "open", "route_applied": True,
        "live": {"summary": "tripped (trip 1 of 3): canary at 0%, cooling down until "
                            "08:01:20Z (in 55 s)"},
    }  # fmt: skip
    text = rendered(_status_view(experiment, EVENT))
    joined = " ".join(line.strip() for line in text.splitlines())
    assert joined.startswith(
        "experiment 7 (shop): running, step 1/1, canary 0%, breaker open, trips 1, route applied"
    )
    assert "cooling down until 08:01:20Z (in 55 s)" in joined
    assert f"latest: 2027-01-15T08:00:20Z  tripped {SENTENCE}" in joined


def test_status_says_whether_a_data_plane_holds_the_route() -> None:
    """etcd holding the route ("applied") is not a sidecar serving it (decision 0053)."""
    from controlplane.cli.experiments import _status_view

    experiment = {
        "id": 7, "service": "shop", "state": "running", "current_step": 0, "trips": 0,
        "steps": [{"weight_pct": 1, "hold_sec": 60}], "canary_weight_bp": 100,
        "breaker_state": "closed", "route_applied": True,
        "route_confirmation": {"confirmed": False, "data_planes": 0, "confirmed_by": 0,
                               "sentence": "published, not yet confirmed: no data plane "
                                           "reported within 30 s"},
    }  # fmt: skip
    joined = " ".join(line.strip() for line in rendered(_status_view(experiment, None))
                      .splitlines())
    assert "route: published, not yet confirmed: no data plane reported within 30 s" in joined

