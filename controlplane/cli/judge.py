"""`canary judge BASELINE CANARY`: the one-shot judge on two sample files, locally.

Exit codes, so a script can use it as a check:

    0  pass
    1  high or low: the canary differs in a direction the options call bad
    2  usage or input error (a bad file names file:line)
    3  nodata: a side is empty or below --min-samples
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.remote import JsonOption, dash, fail, print_json
from controlplane.kernel.errors import plain_message
from controlplane.kernel.judgment import Direction, EffectKind

if TYPE_CHECKING:
    from controlplane.decision.judge import Judgment

EXIT_CODES = {"pass": 0, "high": 1, "low": 1, "nodata": 3}

FileArgument = Annotated[
    Path,
    typer.Argument(help="one latency (ms) per line, or a CSV with --column", show_default=False),
]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return dash(value)


def _print_table(judgment: Judgment) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(markup=False)
    console.print(f"{judgment.classification.value.upper()}  (confidence {judgment.confidence:g})")
    for metric in (judgment.latency, judgment.failures):
        if metric is None:
            continue
        table = Table(title=f"{metric.name}: {metric.classification.value}", title_justify="left")
        table.add_column("evidence", style="bold")
        table.add_column("value", justify="right")
        table.add_row("direction", metric.direction.value)
        for key, value in metric.to_dict()["evidence"].items():
            table.add_row(key, _fmt(value))
        console.print(table)
        console.print(metric.reason)


def register(app: typer.Typer) -> None:
    @app.command("judge")
    def judge_command(
        baseline: FileArgument,
        canary: FileArgument,
        direction: Annotated[
            Direction, typer.Option(help="which latency change is bad")
        ] = Direction.INCREASE,
        effect_kind: Annotated[
            EffectKind | None, typer.Option(help="effect-size gate (default: mean_ratio, max 1)")
        ] = None,
        effect_max: Annotated[
            float | None, typer.Option(help="largest allowed effect upwards")
        ] = None,
        effect_min: Annotated[
            float | None, typer.Option(help="smallest allowed effect downwards (default: mirror)")
        ] = None,
        effect_percentile: Annotated[
            float | None, typer.Option(help="percentile of percentile_ratio (default 95)")
        ] = None,
        confidence: Annotated[
            float, typer.Option(help="chance an unchanged canary passes, in (0.5, 1)")
        ] = 0.99,
        min_samples: Annotated[
            int, typer.Option(min=1, help="fewer samples on a side is nodata")
        ] = 1,
        column: Annotated[
            str | None, typer.Option(help="read this column of a CSV with a header row")
        ] = None,
        as_json: JsonOption = False,
    ) -> None:
        """Judge CANARY against BASELINE like Kayenta's Mann-Whitney classifier: exit 0
        pass, 1 high or low, 3 nodata, 2 on bad input."""
        from pydantic import ValidationError

        from controlplane.client.samples import read_samples
        from controlplane.decision.judge import judge
        from controlplane.kernel.errors import ValidationFailed
        from controlplane.kernel.judgment import EffectGate

        command = "canary judge"
        if not 0.5 < confidence < 1:
            raise fail(command, f"--confidence {confidence:g}: must be within (0.5, 1)")
        if (effect_kind is None) != (effect_max is None):
            raise fail(command, "--effect-kind and --effect-max go together")
        effect = None
        if effect_kind is not None and effect_max is not None:
            try:
                effect = EffectGate(
                    kind=effect_kind, max=effect_max, min=effect_min, percentile=effect_percentile
                )
            except ValidationError as exc:
                message = plain_message(exc.errors()[0]["msg"])
                raise fail(command, message) from None
        elif effect_min is not None or effect_percentile is not None:
            raise fail(command, "--effect-min and --effect-percentile need --effect-kind")
        try:
            samples = [read_samples(path, column=column) for path in (baseline, canary)]
        except ValidationFailed as exc:
            raise fail(command, str(exc)) from None
        verdict = judge(
            samples[0],
            samples[1],
            direction=direction,
            effect=effect,
            confidence=confidence,
            min_samples=min_samples,
        )
        if as_json:
            print_json(verdict.to_dict())
        else:
            _print_table(verdict)
        raise typer.Exit(EXIT_CODES[verdict.classification.value])
