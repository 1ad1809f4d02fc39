"""What `canary rules` and `canary overload` share: a service argument, a field table,
and applying a per-service file through the API with its 422s mapped back to lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.remote import dash, open_client, print_json, reporting

if TYPE_CHECKING:
    from controlplane.client.api_client import CanaryClient
    from controlplane.client.files import SourceFile

ServiceArgument = Annotated[str, typer.Argument(help="service name", show_default=False)]
ServiceOption = Annotated[
    str | None, typer.Option(help="the service, when the file does not name it")
]

Loader = Callable[..., "tuple[SourceFile, dict[str, Any]]"]
Put = Callable[["CanaryClient", str, dict[str, Any]], dict[str, Any]]


def field_table(fields: dict[str, Any], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in fields.items():
        # nested numbers (a recommendation's evidence) stay readable as JSON
        shown = json.dumps(value) if isinstance(value, dict | list) else dash(value)
        table.add_row(key, shown)
    console = Console(markup=False)
    if title:
        console.print(title)
    console.print(table)


def apply_service_file(
    command: str,
    file: Path,
    service: str | None,
    api: str,
    *,
    load: Loader,
    put: Put,
    what: str,
    as_json: bool,
) -> None:
    """Load `file`, PUT it to the service it names, and say what was applied.

    A 422 from the API names fields of the body; they are reported at the file's
    lines, so the user fixes the file rather than guessing at a JSON path.
    """
    from controlplane.client.api_client import ClientError
    from controlplane.client.files import api_errors_to_file

    with reporting(command):
        source, body = load(file, service=service)
        target = str(body["service"])
        with open_client(api) as client:
            try:
                applied = put(client, target, body)
            except ClientError as exc:
                if exc.status == 422 and exc.errors:
                    raise api_errors_to_file(source, exc.errors) from exc
                raise
    if as_json:
        print_json(applied)
    elif applied.get("applied") is False:
        # committed; the controller's leader puts it in force within one pass
        note = applied.get("applied_note") or "not in force yet"
        typer.echo(f"applied the {what} of {target} (committed; {note})")
    else:
        typer.echo(f"applied the {what} of {target}")
