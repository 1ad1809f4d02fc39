"""`canary exp watch ID`: an experiment live on a terminal until it ends.

State, step, weights, breaker, the windows as judged, where the rollout stands in words
and what the controller said last,
the probe's time to verdict and whether a data plane holds the route, refreshed every
`--interval` seconds. It ends by itself once the experiment is promoted, rolled back
or aborted (exit 0: watching is not a gate, `exp wait` is); Ctrl-C stops watching and
leaves the experiment as it is. Off a terminal (a CI log) each change is one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controlplane.cli.experiments import (
    TERMINAL_EXIT,
    Watched,
    confirmation_text,
    event_text,
    step_text,
    weight_text,
)
from controlplane.cli.remote import dash
from controlplane.decision.words import ratio_text

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

Rows = list[tuple[str, str]]


def _window(snapshot: Any) -> str:
    if not isinstance(snapshot, dict):
        return "no window yet"
    p95 = snapshot.get("p95_ms")
    latency = "P95 -" if p95 is None else f"P95 {float(p95):.0f} ms"
    failed = ratio_text(float(snapshot.get("failure_ratio") or 0.0))  # not :g, 1e+02%
    return f"{latency} · failed {failed} · n={snapshot.get('count', 0)}"


def watch_rows(experiment: dict[str, Any], latest: dict[str, Any] | None) -> Rows:
    """What one look shows, label and value, in words. Pure."""
    live = experiment.get("live") if isinstance(experiment.get("live"), dict) else {}
    assert isinstance(live, dict)
    trips = f"{live.get('trips', experiment.get('trips', 0))}"
    if live.get("max_trips"):
        trips += f" of {live['max_trips']}"
    rows: Rows = [
        ("experiment", f"{experiment.get('id')} {dash(experiment.get('name'))} "
                       f"({dash(experiment.get('service'))})"),
        ("state", dash(experiment.get("state"))),
        ("step", step_text(experiment)),
        ("canary weight", weight_text(experiment)),
        ("breaker", f"{dash(experiment.get('breaker_state'))}, trips {trips}"),
    ]
    snapshots = live.get("snapshots")
    if isinstance(snapshots, dict):
        for variant in sorted(snapshots):
            rows.append((variant, _window(snapshots[variant])))
    elif live.get("snapshots_note") or live.get("snapshots_error"):
        rows.append(("windows", str(live.get("snapshots_error") or live.get("snapshots_note"))))
    probe = live.get("probe")
    if isinstance(probe, dict) and probe.get("sentence"):
        rows.append(("probe", str(probe["sentence"])))
    if live.get("held_reason"):
        rows.append(("held", str(live["held_reason"])))
    standing = live.get("summary") or experiment.get("summary")
    if standing:  # the sentence first, the controller's reason (with its numbers) beside
        rows.append(("standing", str(standing)))
    if live.get("last_reason"):
        rows.append(("last decision", str(live["last_reason"])))
    route = confirmation_text(experiment)
    if route is not None:
        rows.append(("route", route))
    rows.append(("latest event", event_text(latest)))
    return rows


def _panel(rows: Rows) -> RenderableType:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for label, value in rows:
        table.add_row(label, value)
    return table


def watch(
    client: Watched,
    experiment_id: str,
    *,
    interval: float,
    console: Console,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Show the experiment until it ends; its final state."""
    from rich.live import Live

    shown: Rows | None = None
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    if live is not None:
        live.start()
    try:
        while True:
            experiment = client.get_experiment(experiment_id)
            rows = watch_rows(experiment, client.latest_event(experiment_id))
            if live is not None:
                live.update(_panel(rows), refresh=True)
            elif rows != shown:
                console.print("  ".join(f"{label}: {value}" for label, value in rows),
                              markup=False, highlight=False, soft_wrap=True)
            shown = rows
            state = str(experiment.get("state"))
            if state in TERMINAL_EXIT:
                return state
            sleep(interval)
    finally:
        if live is not None:
            live.stop()
