"""`canary bench NAME --json`: each benchmark prints one JSON object."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Annotated, Any

import typer

# name -> "module:function"; the function takes keyword options and returns a dict
BENCHMARKS: dict[str, str] = {
    "decision": "controlplane.benchmarks.decision:run",
    "collector": "controlplane.benchmarks.collector:run",
    "sidecar": "controlplane.benchmarks.sidecar:run",
    "sidecar-grpc": "controlplane.benchmarks.sidecar_grpc:run",
    "sidecar-tracing": "controlplane.benchmarks.sidecar_tracing:run",
    "control": "controlplane.benchmarks.control:run",
    "notify": "controlplane.benchmarks.notify:run",
    "history": "controlplane.benchmarks.history:run",
    "overload": "controlplane.benchmarks.overload:run",
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
        only: Annotated[
            str | None,
            typer.Option("--only", help="comma-separated sections, for benchmarks that have "
                         "them (sidecar: websocket, sse, large_bodies)"),
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
        options: dict[str, Any] = {"quick": quick, "progress": not as_json}
        if only is not None:
            if "only" not in inspect.signature(run).parameters:
                typer.echo(f"canary bench: {name} has no sections for --only", err=True)
                raise typer.Exit(2)
            options["only"] = only
        try:
            result: dict[str, Any] = run(**options)
        except ValueError as exc:  # a bad --only
            typer.echo(f"canary bench: {exc}", err=True)
            raise typer.Exit(2) from exc
        text = json.dumps(result, indent=None if as_json else 2, sort_keys=True)
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        typer.echo(text)
