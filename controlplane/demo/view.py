"""The live view: one panel per scenario, and the traffic as users see it."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from controlplane.demo.load import LoadGenerator
from controlplane.demo.scenarios import ScenarioProgress
from controlplane.kernel.routes import BASELINE, CANARY

EVENTS_SHOWN = 5
STATE_STYLE = {
    "promoted": "bold green",
    "rolled_back": "bold red",
    "aborted": "bold red",
    "running": "cyan",
    "paused": "yellow",
}
BREAKER_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def scenario_panel(progress: ScenarioProgress) -> Panel:
    spec = progress.spec
    head = Text()
    head.append(f"{spec.baseline.name} → {spec.canary.name}   ")
    if progress.experiment_id is None:
        head.append(progress.status, style="dim")
        return Panel(head, title=f"{spec.key}: {spec.title}", title_align="left")
    state = progress.state or "…"
    head.append(state, style=STATE_STYLE.get(state, ""))
    step = max(progress.current_step, 0) + 1
    head.append(f"   step {step}/{len(spec.steps)}   canary ")
    head.append(f"{progress.canary_weight_bp / 100:g}%", style="bold")
    head.append(f" / baseline {100 - progress.canary_weight_bp / 100:g}%   breaker ")
    head.append(progress.breaker_state, style=BREAKER_STYLE.get(progress.breaker_state, ""))
    head.append(f" (trips {progress.trips})")
    if progress.elapsed is not None:
        head.append(f"   {progress.elapsed:.0f}s", style="dim")
    if progress.degraded_at is not None:
        head.append(f"\n{spec.canary.name} degraded x{spec.degrade_factor:g}", style="red")
        if progress.status != "done":
            head.append(f" {time.time() - progress.degraded_at:.0f}s ago")

    stats = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("variant", "count", "P50", "P95", "P99", "failures"):
        stats.add_column(column, justify="left" if column == "variant" else "right")
    for variant in (BASELINE, CANARY):
        snap = progress.snapshots.get(variant)
        if snap is None:
            stats.add_row(variant, "-", "-", "-", "-", "-")
            continue
        stats.add_row(
            variant,
            f"{snap.count:,}",
            _ms(snap.p50_ms),
            _ms(snap.p95_ms),
            _ms(snap.p99_ms),
            f"{snap.failure_ratio:.1%}",
        )

    # time and kind keep their width; the reason takes what is left, cut short
    events = Table(box=None, show_header=False, pad_edge=False, expand=True)
    events.add_column("at", style="dim", no_wrap=True, width=7)
    events.add_column("kind", style="bold", no_wrap=True, width=16)
    events.add_column("reason", overflow="ellipsis", no_wrap=True, ratio=1)
    origin = progress.started_at or 0.0
    for line in progress.events[-EVENTS_SHOWN:]:
        events.add_row(f"+{line.at - origin:5.1f}s", line.kind, line.reason)

    body: list[RenderableType] = [head, Text(), stats]
    if progress.events:
        body += [Text(), events]
    if progress.error:
        body.append(Text(progress.error, style="red"))
    return Panel(Group(*body), title=f"{spec.key}: {spec.title}", title_align="left")


def traffic_line(load: LoadGenerator) -> Text:
    stats = load.stats
    seconds = max(time.time() - (load.started_at or time.time()), 1e-9)
    text = Text()
    text.append("traffic ", style="bold")
    text.append(
        f"{stats.sent:,} requests ({stats.sent / seconds:.0f}/s, {load.in_flight} in flight)  "
        f"upstream errors {stats.upstream_failed:,}  "
    )
    text.append(
        f"failed by the sidecar {stats.sidecar_failed:,}",
        style="bold red" if stats.sidecar_failed else "green",
    )
    return text


def render(scenarios: Sequence[ScenarioProgress], load: LoadGenerator | None) -> RenderableType:
    parts: list[RenderableType] = [scenario_panel(p) for p in scenarios]
    if load is not None:
        parts.append(traffic_line(load))
    return Group(*parts)
