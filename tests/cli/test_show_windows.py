"""`canary exp show` prints both latencies of each variant's window."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from controlplane.api.live import snapshot_live
from controlplane.cli.experiments import _experiment_view
from controlplane.kernel.snapshots import FIRST_BYTE, WindowSnapshot

T = 1_800_000_000.0


def window(
    variant: str, count: int, total_p95: float, head: WindowSnapshot | None, shed: int = 0
) -> Any:
    snap = WindowSnapshot(
        experiment="4", variant=variant, count=count, failures=1, window_sec=60, ts=T,
        window_start=T - 60, window_end=T, p50_ms=total_p95 / 2, p95_ms=total_p95,
        p99_ms=total_p95 * 1.5, first_byte=head, shed=shed,
    )  # fmt: skip
    return snapshot_live(snap).model_dump(mode="json")


def head(count: int, p95: float) -> WindowSnapshot:
    return WindowSnapshot(
        experiment="4", variant="x", count=count, failures=0, window_sec=60, ts=T,
        window_start=T - 60, window_end=T, p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95 * 2,
        latency=FIRST_BYTE,
    )  # fmt: skip


def rendered(experiment: dict[str, Any]) -> str:
    console = Console(width=200, record=True, force_terminal=False)
    console.print(_experiment_view(experiment))
    return console.export_text()


LABELS = ["samples", "failures", "total p50", "total p95", "total p99", "first byte p50",
          "first byte p95", "first byte p99", "no first byte", "shed", "shed %"]


def cells(text: str, variant: str) -> list[str]:
    """The variant's figures, one per row of the table (a column per variant)."""
    lines = text.splitlines()
    header = next(line for line in lines if f" {variant} " in line and line.startswith("┃"))
    position = [cell.strip() for cell in header.strip("┃").split("┃")].index(variant)
    found = [variant]
    for label in LABELS:
        line = next(row for row in lines if row.startswith(f"│ {label} "))
        found.append([cell.strip() for cell in line.strip("│").split("│")][position])
    return found


def test_show_prints_the_total_and_the_first_byte_of_each_variant() -> None:
    experiment = {
        "id": 4, "service": "stream-api", "state": "running",
        "rule": {"service": "stream-api", "threshold_ms": 500, "latency": "first_byte"},
        "live": {"snapshots": {
            "canary": window("canary", 300, 3_020.0, head(300, 21.5)),
            "baseline": window("baseline", 2_000, 2_900.0, head(1_500, 18.25)),
        }},
    }  # fmt: skip
    text = rendered(experiment)
    assert "latency judged" in text and "first_byte" in text
    assert "first byte p95" in text and "total p95" in text
    assert cells(text, "canary") == [
        "canary", "300", "1", "1510.0", "3020.0", "4530.0", "10.8", "21.5", "43.0", "0", "0", "0.0%"
    ]  # fmt: skip
    assert cells(text, "baseline")[4] == "2900.0" and cells(text, "baseline")[7] == "18.2"
    assert cells(text, "baseline")[-3] == "500"  # from sidecars before batch version 2


def test_a_window_from_an_older_collector_shows_no_first_byte() -> None:
    experiment = {"id": 4, "live": {"snapshots": {"canary": window("canary", 40, 90.0, None)}}}
    assert cells(rendered(experiment), "canary")[-6:-2] == ["-", "-", "-", "40"]


def test_no_window_no_table() -> None:
    assert "windows" not in rendered({"id": 4, "live": {"snapshots": None}})


def test_show_prints_the_shed_requests_and_the_overload_hold() -> None:
    experiment = {
        "id": 4,
        "live": {
            "overload_held": True,
            "snapshots": {
                "baseline": window("baseline", 300, 90.0, head(300, 20.0), shed=100),
                "canary": window("canary", 40, 90.0, head(40, 20.0)),
            },
        },
    }
    text = rendered(experiment)
    assert cells(text, "baseline")[-2:] == ["100", "25.0%"]
    assert cells(text, "canary")[-2:] == ["0", "0.0%"]
    assert "held: the baseline's sidecars are shedding requests (overload: hold)" in text
    calm = {"id": 4, "rule": {"overload": "judge"}, "live": {"overload_held": False}}
    assert "judged while shedding (overload: judge)" in rendered(calm)


def test_the_windows_fit_an_80_column_terminal() -> None:
    experiment = {"id": 4, "live": {"snapshots": {
        "canary": window("canary", 300, 3_020.0, head(300, 21.5)),
        "baseline": window("baseline", 2_000, 2_900.0, head(1_500, 18.25)),
    }}}  # fmt: skip
    console = Console(width=80, record=True, force_terminal=False)
    console.print(_experiment_view(experiment))
    text = console.export_text()
    assert "…" not in text
    assert cells(text, "canary")[1:6] == ["300", "1", "1510.0", "3020.0", "4530.0"]
