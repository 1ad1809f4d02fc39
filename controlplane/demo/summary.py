"""The summary table printed at the end, and the verdict the exit code follows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from controlplane.demo.load import LoadStats
from controlplane.demo.scenarios import ScenarioProgress


@dataclass
class ScenarioResult:
    progress: ScenarioProgress
    load: LoadStats  # the requests sent while the scenario ran
    samples_sent: int  # by the sidecar's reporter, for this experiment
    samples_counted: int  # by the collector, for this experiment

    @property
    def ok(self) -> bool:
        return (
            self.progress.as_expected
            and self.progress.error is None
            and self.load.sidecar_failed == 0
            and self.samples_sent == self.samples_counted
        )

    def since_degradation(self, at: float | None) -> float | None:
        start = self.progress.degraded_at
        if start is None or at is None:
            return None
        return at - start


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def summary_table(results: Sequence[ScenarioResult], front: str = "sidecar") -> Table:
    table = Table(
        title="canary demo: summary",
        title_justify="left",
        header_style="bold",
        caption=f"times count from the canary's degradation; requests failed by the {front} "
        f"must be 0; samples: sent by the {front} / counted by the collector",
        caption_justify="left",
    )
    table.add_column("", justify="left")
    for result in results:
        table.add_column(result.progress.spec.key, justify="right")

    def row(label: str, cells: list[str]) -> None:
        table.add_row(label, *cells)

    row("final state (expected)", [
        f"{r.progress.state or 'none'} ({r.progress.spec.expected})" for r in results
    ])  # fmt: skip
    row("duration", [_seconds(r.progress.elapsed) for r in results])
    row("breaker trips", [str(r.progress.trips) for r in results])
    row("detected (trip) after", [
        _seconds(r.since_degradation(r.progress.tripped_at)) for r in results
    ])  # fmt: skip
    row("traffic cut (route) after", [
        _seconds(r.since_degradation(r.progress.cut_at)) for r in results
    ])  # fmt: skip
    row("last canary request after", [
        _seconds(r.since_degradation(r.progress.last_canary_request_at)) for r in results
    ])  # fmt: skip
    row("requests sent", [f"{r.load.sent:,}" for r in results])
    row("  by baseline / canary", [
        f"{r.load.by_variant.get('baseline', 0):,} / {r.load.by_variant.get('canary', 0):,}"
        for r in results
    ])  # fmt: skip
    row("  upstream errors (5xx)", [f"{r.load.upstream_failed:,}" for r in results])
    row("  sent again (closed kept-alive)", [f"{r.load.stale_retries:,}" for r in results])
    if any(r.load.skipped for r in results):
        row("  not sent (too many in flight)", [f"{r.load.skipped:,}" for r in results])
    row(f"  failed by the {front}", [
        f"{r.load.sidecar_failed:,}" + (
            f" ({', '.join(f'{k} x{v}' for k, v in r.load.sidecar_reasons.items())})"
            if r.load.sidecar_failed else ""
        )
        for r in results
    ])  # fmt: skip
    row("samples sent / counted", [
        f"{r.samples_sent:,} / {r.samples_counted:,}" for r in results
    ])  # fmt: skip
    row("result", ["[green]as expected[/]" if r.ok else "[red]NOT as expected[/]"
                   for r in results])  # fmt: skip
    return table


def all_ok(results: Sequence[ScenarioResult]) -> bool:
    return bool(results) and all(r.ok for r in results)
