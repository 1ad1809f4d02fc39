"""`canary bench NAME --json`: each benchmark prints one JSON object."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

# name -> "module:function"; the function takes keyword options and returns a dict
BENCHMARKS: dict[str, str] = {
    "decision": "controlplane.benchmarks.decision:run",
    "collector": "controlplane.benchmarks.collector:run",
    "sidecar": "controlplane.benchmarks.sidecar:run",
    "control": "controlplane.benchmarks.control:run",
    "history": "controlplane.benchmarks.history:run",
}


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_command(
        name: Annotated[str, typer.Argument(help="which benchmark: " + ", ".join(BENCHMARKS))],
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        quick: Annotated[
            bool, typer.Option("--quick", help="a smaller run, for a smoke test")
        ] = False,
        save: Annotated[
            Path | None, typer.Option("--save", help="also write the JSON to this file")
        ] = None,
    ) -> None:
        """Run a benchmark against references measured in the same run."""
        target = BENCHMARKS.get(name)
        if target is None:
            known = ", ".join(sorted(BENCHMARKS)) or "none"
            typer.echo(f"canary bench: unknown benchmark {name!r} (known: {known})", err=True)
            raise typer.Exit(2)
        module_name, func_name = target.split(":")
        run = getattr(importlib.import_module(module_name), func_name)
        result: dict[str, Any] = run(quick=quick, progress=not as_json)
        text = json.dumps(result, indent=None if as_json else 2, sort_keys=True)
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        typer.echo(text)
