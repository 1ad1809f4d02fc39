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
    "decision-metrics": "controlplane.benchmarks.decision_metrics:run",
    "collector": "controlplane.benchmarks.collector:run",
    "sidecar": "controlplane.benchmarks.sidecar:run",
    "sidecar-grpc": "controlplane.benchmarks.sidecar_grpc:run",
    "sidecar-tracing": "controlplane.benchmarks.sidecar_tracing:run",
    "sidecar-python": "controlplane.benchmarks.sidecar_python:run",
    "sidecar-resources": "controlplane.benchmarks.sidecar_resources:run",
    "sample-path": "controlplane.benchmarks.sample_path:run",
    "control": "controlplane.benchmarks.control:run",
    "full-pass": "controlplane.benchmarks.full_pass:run",
    "notify": "controlplane.benchmarks.notify:run",
    "history": "controlplane.benchmarks.history:run",
    "overload": "controlplane.benchmarks.overload:run",
    "overload-tuning": "controlplane.benchmarks.overload_tuning:run",
    "redis-cluster": "controlplane.benchmarks.redis_cluster:run",
    "scale": "controlplane.benchmarks.scale:run",
    "shard-takeover": "controlplane.benchmarks.shard_takeover:run",
    "round": "controlplane.benchmarks.round:run",
    "memory": "controlplane.benchmarks.memory_commit:run",
    "router": "controlplane.benchmarks.router:run",
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
            typer.Option(
                "--only",
                help="comma-separated sections to run (sidecar: websocket, sse, large_bodies; "
                "decision: its sections; scale: the N to run, watch, collectors=K; collector: "
                "steady); with "
                "--save, merged into the file's existing result, other keys kept",
            ),
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option("--workers", help="processes for the simulations (decision)"),
        ] = None,
        replicas: Annotated[
            str | None,
            typer.Option("--replicas", help="scale: sharded controller replica counts, e.g. 1,4"),
        ] = None,
    ) -> None:
        """Run a benchmark against references measured in the same run."""
        target = BENCHMARKS.get(name)
        if target is None:
            known = ", ".join(sorted(BENCHMARKS)) or "none"
            typer.echo(f"canary bench: unknown benchmark {name!r} (known: {known})", err=True)
            raise typer.Exit(2)
        module_name, func_name = target.split(":")
        module = importlib.import_module(module_name)
        run = getattr(module, func_name)
        options: dict[str, Any] = {"quick": quick, "progress": not as_json}
        if only is not None:
            if "only" not in inspect.signature(run).parameters:
                typer.echo(f"canary bench: {name} has no sections to pick (--only)", err=True)
                raise typer.Exit(2)
            options["only"] = only
        if workers is not None:
            if "workers" not in inspect.signature(run).parameters:
                typer.echo(f"canary bench: {name} has no --workers", err=True)
                raise typer.Exit(2)
            options["workers"] = workers
        if replicas is not None:
            if "replicas" not in inspect.signature(run).parameters:
                typer.echo(f"canary bench: {name} has no --replicas", err=True)
                raise typer.Exit(2)
            options["replicas"] = replicas
        if getattr(module, "HOSTS_LONG_RUNNING_PARTS", False):
            # a controller or a collector measured in this process runs as it would
            # in `canary serve` or `canary collector`
            from controlplane.kernel.gc_policy import for_long_running_process

            for_long_running_process()
        try:
            result: dict[str, Any] = run(**options)
        except ValueError as exc:  # a bad --only, --workers or --replicas
            typer.echo(f"canary bench: {exc}", err=True)
            raise typer.Exit(2) from exc
        text = json.dumps(result, indent=None if as_json else 2, sort_keys=True)
        if save is not None:
            saved = result
            if only is not None and save.exists():
                saved = merge_results(json.loads(save.read_text()), result)
            save.parent.mkdir(parents=True, exist_ok=True)
            save.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        typer.echo(text)


def merge_results(saved: dict[str, Any], partial: dict[str, Any]) -> dict[str, Any]:
    """`saved` with the keys of a partial run replaced, nested objects merged key by key
    (a section's keys replace only themselves; the rest of the saved run stays)."""
    merged = dict(saved)
    for key, value in partial.items():
        old = merged.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            merged[key] = merge_results(old, value)
        else:
            merged[key] = value
    return merged
