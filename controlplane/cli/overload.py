"""`canary overload …`: a service's overload protection (docs/sidecar.md) through the API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli.remote import (
    DEFAULT_API,
    ApiOption,
    JsonOption,
    open_client,
    print_json,
    reporting,
)
from controlplane.cli.service_files import (
    ServiceArgument,
    ServiceOption,
    apply_service_file,
    field_table,
)


def register(app: typer.Typer) -> None:
    overload = typer.Typer(
        name="overload",
        help="Apply, inspect and remove services' overload protection through the REST API.",
        no_args_is_help=True,
    )

    @overload.command("apply")
    def apply_command(
        file: Annotated[
            Path, typer.Option("--file", "-f", help="config as YAML or JSON", show_default=False)
        ],
        service: ServiceOption = None,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """Apply the config in a file to the service it names (deploy/examples/overload.yaml)."""
        from controlplane.client.files import load_overload

        apply_service_file(
            "canary overload apply",
            file,
            service,
            api,
            load=load_overload,
            put=lambda client, target, body: client.put_overload(target, body),
            what="overload protection",
            as_json=as_json,
        )

    @overload.command("show")
    def show_command(
        service: ServiceArgument, api: ApiOption = DEFAULT_API, as_json: JsonOption = False
    ) -> None:
        """Show a service's overload protection."""
        with reporting("canary overload show"), open_client(api) as client:
            config = client.get_overload(service)
        if as_json:
            print_json(config)
        else:
            field_table(config)

    @overload.command("delete")
    def delete_command(service: ServiceArgument, api: ApiOption = DEFAULT_API) -> None:
        """Remove a service's overload protection: its sidecars stop shedding."""
        with reporting("canary overload delete"), open_client(api) as client:
            client.delete_overload(service)
        typer.echo(f"removed the overload protection of {service}")

    app.add_typer(overload, name="overload")
