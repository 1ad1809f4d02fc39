"""`canary service …`: a service's release lifecycle through the REST API: its stable
version and its release history (decision 0051)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.remote import (
    DEFAULT_API,
    ApiOption,
    JsonOption,
    dash,
    open_client,
    print_json,
    reporting,
)
from controlplane.cli.service_files import ServiceArgument

if TYPE_CHECKING:
    from rich.console import RenderableType


def version_text(version: Any) -> str:
    """A version as `label (upstream)`, or its upstream when it has no label."""
    if not isinstance(version, dict):
        return "-"
    label, upstream = version.get("version"), dash(version.get("upstream"))
    return f"{label} ({upstream})" if label else upstream


def stable_text(history: dict[str, Any]) -> str:
    stable = history.get("stable")
    if not isinstance(stable, dict):
        return (f"{history.get('service')} has no stable version yet: its first experiment "
                "names the baseline, which becomes stable when it starts")
    since = stable.get("since")
    experiment = stable.get("experiment_id")
    by = f", made stable by experiment {experiment}" if experiment is not None else ""
    return f"stable: {version_text(stable)} since {dash(since)}{by}"


def releases_table(history: dict[str, Any]) -> RenderableType:
    from rich.table import Table

    from controlplane.cli.experiments import time_text

    items = history.get("items") or []
    total = history.get("total")
    caption = None if total is None or total == len(items) else f"{len(items)} of {total}"
    table = Table(caption=caption)
    for column in ("at", "release", "experiment", "stable before", "stable after", "by"):
        table.add_column(column)
    for item in items:
        table.add_row(
            time_text(item.get("at")),
            dash(item.get("kind")),
            dash(item.get("experiment_id")),
            version_text(item.get("stable_before")),
            version_text(item.get("stable_after")),
            dash(item.get("actor")),
        )
    return table


def register(app: typer.Typer) -> None:
    service = typer.Typer(
        name="service",
        help="A service's stable version and release history through the REST API.",
        no_args_is_help=True,
    )

    @service.command("releases")
    def releases_command(
        name: ServiceArgument,
        limit: Annotated[int, typer.Option(min=1, max=500, help="at most this many")] = 20,
        offset: Annotated[int, typer.Option(min=0, help="skip this many")] = 0,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """The service's stable version and its releases, newest first."""
        from rich.console import Console

        with reporting("canary service releases"), open_client(api) as client:
            history = client.releases(name, limit=limit, offset=offset)
        if as_json:
            print_json(history)
            return
        typer.echo(stable_text(history))
        if history.get("items"):
            Console(markup=False).print(releases_table(history))

    app.add_typer(service)
